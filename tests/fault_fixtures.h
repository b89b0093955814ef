// Faults made for real for the fault tests (tests/integration/faults_test.cpp): runs of the tiny
// model in-process or through xlme-pretrain on synthetic shards, damaged files, a full disk, a
// snapshot of what the user had before a command. A new case is one test function.
#pragma once

#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/manager.h"
#include "xlme/common/checksum.h"
#include "xlme/data/batch_bench.h"
#include "xlme/data/synthetic.h"
#include "xlme/train/pretrain.h"
#include "xlme/train/trainer.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <sys/mount.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <regex>

namespace xlme::testing {

// The tiny model trained `steps` steps with a checkpoint every `save_every` steps into `out_dir`.
inline config::Config fault_run_config(const std::string& out_dir, int64_t steps,
                                       int64_t save_every, int64_t keep_last) {
  auto c = tiny_train_config(4, 1, /*dropout=*/0.1);
  c.train.steps = steps;
  c.train.warmup_steps = 1;
  c.train.log_every = 1;
  c.train.save_every = save_every;
  c.train.keep_last = keep_last;
  c.run.out_dir = out_dir;
  return c;
}

// pretrain() on synthetic batches in this process.
inline int run_in_process(const config::Config& c, const train::PretrainOptions& options = {}) {
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 3);
  return train::pretrain(c, options, source, single_process());
}

// The step_<N> folder of `out_dir`.
inline std::string step_folder(const std::string& out_dir, int64_t step) {
  return out_dir + "/checkpoints/" + fmt::format("step_{:08d}", step);
}

// Whether `path` is a complete checkpoint.
inline bool verifies(const std::string& path) {
  try {
    checkpoint::CheckpointManager::verify(path);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The step of `out_dir`'s newest complete checkpoint, or -1 when none verifies yet.
inline int64_t newest_checkpoint_step(const std::string& out_dir) {
  std::error_code error;
  int64_t newest = -1;
  for (std::filesystem::directory_iterator it(out_dir + "/checkpoints", error), end;
       !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= 5 || name.rfind("step_", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    const int64_t step = std::stoll(name.substr(5));
    if (step > newest && verifies(it->path().string())) newest = step;
  }
  return newest;
}

// Synthetic shards for the tiny model's 64 ids, written once per process.
inline const std::string& tiny_shards() {
  static const TempDir dir;
  static const std::string shards = [] {
    const std::string out = dir / "shards";
    data::write_synthetic_shards(out, 64, 20000, 10000, 5);
    return out;
  }();
  return shards;
}

// xlme-pretrain's arguments for the tiny model on tiny_shards(), then `extra`.
inline std::vector<std::string> tiny_pretrain_args(const std::string& out_dir, int64_t steps,
                                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args;
  for (const std::string& set : {std::string("model.vocab_size=64"),
                                 std::string("model.hidden_size=32"),
                                 std::string("model.layers=1"),
                                 std::string("model.heads=2"),
                                 std::string("model.ffn_size=64"),
                                 std::string("model.max_positions=64"),
                                 std::string("model.generator.layers=1"),
                                 std::string("data.mono.max_len=16"),
                                 std::string("data.para.max_len=16"),
                                 std::string("data.too_long=truncate"),
                                 std::string("finetune.max_len=64"),
                                 std::string("data.tokenizer="),
                                 "data.shards=" + tiny_shards(),
                                 std::string("train.micro_batch_tokens=64"),
                                 std::string("train.tokens_per_task=64"),
                                 "train.steps=" + std::to_string(steps),
                                 std::string("train.warmup_steps=1"),
                                 std::string("train.save_every=1"),
                                 std::string("train.validate_every=0"),
                                 std::string("run.device=cpu"),
                                 std::string("run.threads=1"),
                                 "run.out_dir=" + out_dir}) {
    args.push_back("--set");
    args.push_back(set);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The built xlme-pretrain.
inline std::string pretrain_binary() {
  return std::string(XLME_BINARY_DIR) + "/xlme-pretrain";
}

// The shell command that runs the built binary `tool` with `args` and `env` (e.g. "RANK=1
// WORLD_SIZE=2") in the source tree.
inline std::string tool_command(const std::string& tool, const std::vector<std::string>& args,
                                const std::string& env = "") {
  std::string command = "cd " + quote(XLME_SOURCE_DIR) + " && exec env " + env + " " +
                        quote(std::string(XLME_BINARY_DIR) + "/" + tool);
  for (const auto& a : args) command += " " + quote(a);
  return command;
}

// Starts tool_command(tool, args, env), its stderr to `err_file`; returns its pid
// (testing::wait_exit_code collects it).
inline pid_t start_tool(const std::string& tool, const std::vector<std::string>& args,
                        const std::string& env, const std::string& err_file) {
  const std::string command = tool_command(tool, args, env) + " 2>" + quote(err_file);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Waits up to `seconds` for `text` to appear in `file`; whether it did.
inline bool wait_for_text(const std::string& file, const std::string& text, double seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (read_file(file).find(text) != std::string::npos) return true;
    ::usleep(10000);
  }
  return false;
}

// Every regular file under `dir` -> its CRC32: what the user had before a command.
inline std::map<std::string, uint32_t> snapshot(const std::string& dir) {
  std::map<std::string, uint32_t> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      const std::string path = entry.path().string();
      files[path] = file_crc32(path);
    }
  }
  return files;
}

// Every file of `before` still there with the same content (a failed command lost nothing);
// `except` names files that may have changed (e.g. a log the command appends to).
inline ::testing::AssertionResult nothing_lost(const std::map<std::string, uint32_t>& before,
                                               const std::string& except = "/logs/") {
  for (const auto& [path, crc] : before) {
    if (!except.empty() && path.find(except) != std::string::npos) continue;
    if (!std::filesystem::is_regular_file(path)) {
      return ::testing::AssertionFailure() << path << " is gone";
    }
    if (file_crc32(path) != crc) {
      return ::testing::AssertionFailure() << path << " was changed";
    }
  }
  return ::testing::AssertionSuccess();
}

// One flipped byte in a checkpoint's manifest: the first digit of a "bytes:" value becomes 'x'.
inline void flip_manifest_byte(const std::string& checkpoint) {
  const std::string path = checkpoint + "/manifest.yaml";
  std::string text = read_file(path);
  const auto at = text.find("bytes: ");
  if (at == std::string::npos) throw std::runtime_error("no 'bytes: ' in " + path);
  text[at + 7] = 'x';
  write_file(path, text);
}

// A tmpfs of `bytes` mounted on `dir` (created) while in scope; `skipped()` says why not, e.g.
// when mounting is not permitted.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& dir, int64_t bytes) : dir_(dir) {
    std::filesystem::create_directories(dir);
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      why_ = "cannot mount a tmpfs on " + dir + ": " + std::strerror(errno) +
             " (needs root or CAP_SYS_ADMIN)";
    }
  }
  ~TmpfsMount() {
    if (why_.empty()) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  const std::string& skipped() const { return why_; }

 private:
  std::string dir_;
  std::string why_;
};

}  // namespace xlme::testing
