// Helpers shared by the tests: temporary folders, files, and checks on error messages.
#pragma once

#include "xlme/common/error.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>

namespace xlme::testing {

// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "xlme-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
    if (path_.empty()) throw std::runtime_error("mkdtemp failed");
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << content;
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `fn`, requires it to throw xlme::Error, and returns the message.
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const xlme::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an xlme::Error, nothing was thrown";
  return "";
}

// Every fragment must appear in `text`.
inline ::testing::AssertionResult contains_all(const std::string& text,
                                               std::initializer_list<std::string> fragments) {
  for (const auto& fragment : fragments) {
    if (text.find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << fragment << "' not found in:\n" << text;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace xlme::testing
