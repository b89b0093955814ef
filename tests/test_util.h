// Helpers shared by the tests: temporary folders, files, and checks on error messages.
#pragma once

#include "xlme/common/error.h"

#include "test_paths.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

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

// gtest reports a failure in SetUpTestSuite as *skipped* tests, and CTest counts them as skipped,
// not failed. So a fixture runs its suite-wide set-up through SuiteSetUp::run, which keeps the
// failure, and its SetUp() calls SuiteSetUp::check, which fails every test with it.
class SuiteSetUp {
 public:
  void run(const std::function<void()>& setup) {
    try {
      setup();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  // A fatal failure (the test body does not run) that names what the set-up hit.
  void check() const { ASSERT_TRUE(error_.empty()) << "the suite's set-up failed: " << error_; }

 private:
  std::string error_;
};

// Runs `command` through the shell with its output going to `log`; throws with the command and
// that output when it fails.
inline void run_or_throw(const std::string& command, const std::string& log) {
  if (std::system((command + " >" + log + " 2>&1").c_str()) != 0) {
    throw std::runtime_error("'" + command + "' failed:\n" + read_file(log));
  }
}

// The shell's single-quoted form of `s`.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct ToolRun {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs the built binary `tool` with `args` in the source tree, through the shell with `env`
// prepended (e.g. "RANK=2" or "env -u X"), and returns its exit code and output.
inline ToolRun run_tool(const std::string& tool, const std::vector<std::string>& args,
                        const std::string& env = "") {
  const TempDir scratch;
  std::string command = "cd " + quote(XLME_SOURCE_DIR) + " && " + env + " " +
                        quote(std::string(XLME_BINARY_DIR) + "/" + tool);
  for (const auto& a : args) command += " " + quote(a);
  command += " >" + quote(scratch / "out") + " 2>" + quote(scratch / "err");
  const int status = std::system(command.c_str());
  ToolRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(scratch / "out");
  r.err = read_file(scratch / "err");
  return r;
}

// A ToolRun with the process's peak resident memory.
struct MeasuredRun : ToolRun {
  int64_t peak_rss_kib = 0;  // ru_maxrss of the tool's own process, from wait4()
};

// Runs the built binary `tool` with `args` in the source tree like run_tool (the shell execs the
// tool, so that the pid waited for is the tool's) and measures its peak resident memory: what a
// memory bound is checked on, never a timing.
inline MeasuredRun run_tool_measured(const std::string& tool,
                                     const std::vector<std::string>& args) {
  const TempDir scratch;
  std::string command = "cd " + quote(XLME_SOURCE_DIR) + " && exec " +
                        quote(std::string(XLME_BINARY_DIR) + "/" + tool);
  for (const auto& a : args) command += " " + quote(a);
  command += " >" + quote(scratch / "out") + " 2>" + quote(scratch / "err");
  std::string shell = "/bin/sh", dash_c = "-c";
  char* argv[] = {shell.data(), dash_c.data(), command.data(), nullptr};
  pid_t pid = -1;
  MeasuredRun r;
  if (posix_spawn(&pid, shell.c_str(), nullptr, nullptr, argv, environ) != 0) return r;
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.peak_rss_kib = usage.ru_maxrss;
  r.out = read_file(scratch / "out");
  r.err = read_file(scratch / "err");
  return r;
}

// A TCP port that was free a moment ago on the loopback interface.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Starts this test binary again running only the disabled test `test` (e.g. a distributed
// worker), with `vars` added to the environment. Returns the child's pid.
inline pid_t spawn_self(const std::string& test, const std::map<std::string, std::string>& vars) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& [name, value] : vars) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + test,
              disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {exe.data(), filter.data(), disabled.data(), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  return pid;
}

inline int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Starts `command` through the shell in the source tree, its output to `log`; returns its pid.
inline pid_t start_shell(const std::string& command, const std::string& log) {
  const std::string full =
      "cd " + quote(XLME_SOURCE_DIR) + " && exec " + command + " >" + quote(log) + " 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// The exit code of `pid` (128 + the signal when a signal ended it); -1 when it is still running
// after `seconds` (then it is killed).
inline int wait_code(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace xlme::testing
