// Inputs made to break xlme, for the hostile-input tests (tests/integration/hostile_*_test.cpp):
// run a binary on a crafted file, then check that it failed with an exit code (never a signal),
// that the message names the file and the field, that a sentinel outside the run's folders was
// neither opened nor changed, and that nothing the user had was lost (fault_fixtures.h's
// snapshot()/nothing_lost()). A new case is one test function.
#pragma once

#include "test_util.h"

#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>

namespace xlme::testing {

// How a binary ended: an exit code, or the signal that killed it.
struct HostileRun {
  int code = -1;    // exit code; -1 when a signal ended the process
  int signal = 0;   // the signal, 0 when it exited
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs the built binary `tool` like testing::run_tool, recording a signal instead of hiding it.
// `env` is prepended through `env` (e.g. "MASTER_ADDR=127.0.0.1"); `limit` is a `ulimit -v` in KiB
// (0: none), so that an unbounded allocation fails inside the test instead of taking the machine.
inline HostileRun run_hostile(const std::string& tool, const std::vector<std::string>& args,
                              const std::string& env = "", int64_t limit_kib = 0) {
  const TempDir scratch;
  std::string command = "cd " + quote(XLME_SOURCE_DIR) + " && ";
  if (limit_kib > 0) command += "ulimit -v " + std::to_string(limit_kib) + " && ";
  command += "exec env " + env + " " + quote(std::string(XLME_BINARY_DIR) + "/" + tool);
  for (const auto& a : args) command += " " + quote(a);
  command += " >" + quote(scratch / "out") + " 2>" + quote(scratch / "err");
  const int status = std::system(command.c_str());
  HostileRun r;
  if (WIFEXITED(status)) {
    r.code = WEXITSTATUS(status);
    // The shell reports a child killed by signal N as exit code 128 + N.
    if (r.code > 128 && r.code < 128 + 32) {
      r.signal = r.code - 128;
      r.code = -1;
    }
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  r.out = read_file(scratch / "out");
  r.err = read_file(scratch / "err");
  return r;
}

// Whether `run` exited with `code` (no signal) and its stderr names every one of `names` (the file,
// the key or tensor, the value...).
inline ::testing::AssertionResult fails_cleanly(const HostileRun& run, int code,
                                                std::initializer_list<std::string> names) {
  if (run.signal != 0) {
    return ::testing::AssertionFailure()
           << "killed by signal " << run.signal << " (" << strsignal(run.signal) << "); stderr:\n"
           << run.err;
  }
  if (run.code != code) {
    return ::testing::AssertionFailure()
           << "exit code " << run.code << ", expected " << code << "; stderr:\n"
           << run.err;
  }
  for (const auto& name : names) {
    if (run.err.find(name) == std::string::npos) {
      return ::testing::AssertionFailure() << "stderr does not name '" << name << "':\n" << run.err;
    }
  }
  return ::testing::AssertionSuccess();
}

// A file outside every folder a command may touch, watched with inotify from creation on:
// `untouched()` (callable more than once) fails when anything opened, read, wrote, moved or deleted
// it. Root ignores permissions, so only a watch can tell that a file was not read.
class Sentinel {
 public:
  explicit Sentinel(const std::string& path, const std::string& content = "sentinel: keep out\n")
      : path_(path), content_(content) {
    write_file(path_, content_);
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ >= 0) {
      ::inotify_add_watch(fd_, path_.c_str(),
                          IN_OPEN | IN_ACCESS | IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF |
                              IN_DELETE_SELF | IN_CLOSE_WRITE);
    }
  }
  ~Sentinel() {
    if (fd_ >= 0) ::close(fd_);
  }
  Sentinel(const Sentinel&) = delete;
  Sentinel& operator=(const Sentinel&) = delete;

  const std::string& path() const { return path_; }

  // Success when no event reached the watch and the content is what it was.
  ::testing::AssertionResult untouched() const {
    if (fd_ < 0) {
      return ::testing::AssertionFailure() << "inotify_init1: " << std::strerror(errno);
    }
    alignas(inotify_event) char buffer[4096];
    const ssize_t n = ::read(fd_, buffer, sizeof(buffer));
    if (n > 0) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer);
      return ::testing::AssertionFailure()
             << path_ << " was touched (inotify mask 0x" << std::hex << event->mask << ")";
    }
    std::ifstream in(path_, std::ios::binary);
    if (!in) return ::testing::AssertionFailure() << path_ << " is gone";
    const std::string now((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    // Forget the events of this check's own read, so that a later call sees only what comes next.
    while (::read(fd_, buffer, sizeof(buffer)) > 0) {
    }
    if (now != content_) return ::testing::AssertionFailure() << path_ << " was changed";
    return ::testing::AssertionSuccess();
  }

 private:
  std::string path_;
  std::string content_;
  int fd_ = -1;
};

// JSON nested `depth` levels deep: [[[...]]] (a value that recurses in every naive walker).
inline std::string nested_json_array(int64_t depth) {
  return std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']');
}

// A safetensors file's bytes from its raw parts: the 8-byte little-endian header length, `header`
// as given (not checked, no padding added: it may be made to break the reader), then `data`.
inline std::string raw_safetensors(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes + header + data;
}

// raw_safetensors written to `path`.
inline void write_raw_safetensors(const std::string& path, const std::string& header,
                                  const std::string& data) {
  write_file(path, raw_safetensors(header, data));
}

// Adds to the safetensors file at `path` a tensor `name` declared as `values` F32 values past the
// end of its data, and extends the file to hold them without writing them (sparse): a file that
// declares gigabytes and holds a few bytes on disk.
inline void declare_unwritten_tensor(const std::string& path, const std::string& name,
                                     int64_t values) {
  const std::string bytes = read_file(path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(bytes[i]);
  auto header = nlohmann::json::parse(bytes.substr(8, header_size));
  const std::string data = bytes.substr(8 + header_size);
  header[name] = {{"dtype", "F32"},
                  {"shape", {values}},
                  {"data_offsets", {data.size(), data.size() + 4 * static_cast<uint64_t>(values)}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  write_file(path, raw_safetensors(text, data));
  std::filesystem::resize_file(
      path, std::filesystem::file_size(path) + 4 * static_cast<uint64_t>(values));
}

}  // namespace xlme::testing

// --- Checkpoints altered by someone else (tests/integration/hostile_checkpoint_test.cpp) --------

#include <caffe2/serialize/inline_container.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <map>

namespace xlme::testing {

// A manifest entry as an attacker writes it: the name listed, and the file whose size and CRC32
// are recorded under that name (so that the entry verifies byte for byte).
struct ManifestEntry {
  std::string name;
  std::string file;
};

// Every file of checkpoint `folder` but manifest.yaml and those in `omit`, as manifest entries.
inline std::vector<ManifestEntry> checkpoint_entries(const std::string& folder,
                                                     const std::vector<std::string>& omit = {}) {
  std::vector<ManifestEntry> entries;
  for (const auto& item : std::filesystem::directory_iterator(folder)) {
    const std::string name = item.path().filename().string();
    if (name == "manifest.yaml" || std::find(omit.begin(), omit.end(), name) != omit.end()) {
      continue;
    }
    entries.push_back({name, item.path().string()});
  }
  return entries;
}

// Rewrites checkpoint `folder`'s manifest.yaml to list exactly `entries` with their files' current
// sizes and CRC32s, its other fields kept: a checkpoint altered and then "re-signed".
inline void resign_manifest(const std::string& folder, const std::vector<ManifestEntry>& entries) {
  const std::string path = folder + "/manifest.yaml";
  const YAML::Node old = YAML::LoadFile(path);
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& item : old) {
    if (item.first.as<std::string>() != "files") {
      out << YAML::Key << item.first << YAML::Value << item.second;
    }
  }
  out << YAML::Key << "files" << YAML::Value << YAML::BeginMap;
  for (const auto& entry : entries) {
    const std::string bytes = read_file(entry.file);
    const auto crc = crc32_z(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08lx", static_cast<unsigned long>(crc));
    out << YAML::Key << entry.name << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key
        << "bytes" << YAML::Value << bytes.size() << YAML::Key << "crc32" << YAML::Value
        << std::string(hex) << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  write_file(path, std::string(out.c_str()) + "\n");
}

// The records of a LibTorch archive (torch::save's zip), name -> bytes, without the zip's top
// folder ("data.pkl", "data/0", ...).
inline std::map<std::string, std::string> archive_records(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  std::map<std::string, std::string> records;
  for (const auto& name : reader.getAllRecords()) {
    const auto [data, size] = reader.getRecord(name);
    records[name] = std::string(static_cast<const char*>(data.get()), size);
  }
  return records;
}

// Writes `records` (as archive_records returns them, changed) back as the archive `path`: a
// well-formed zip whose content was altered, as a re-zipped file is. The format version record is
// written by the writer itself.
inline void write_archive_records(const std::string& path,
                                  const std::map<std::string, std::string>& records) {
  caffe2::serialize::PyTorchStreamWriter writer(path);
  for (const auto& [name, bytes] : records) {
    if (name == "version" || name == ".data/version") continue;
    writer.writeRecord(name, bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
}

}  // namespace xlme::testing
