// Checkpoint folders that are either complete and verified or ignored.
//
// A checkpoint is `<dir>/step_<N>/` holding whatever the trainer writes (model, optimizer, every
// rank's reader and RNG state, the resolved config, the tokenizer) plus `manifest.yaml`, which
// lists every file with its size and CRC32. It is written into `step_<N>.tmp/`, each file
// fsynced, the manifest written last, then renamed into place and the folder fsynced: a crash
// at any point leaves either the finished checkpoint or a temporary folder that is ignored.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace xlme::train {

struct CheckpointRef {
  int64_t step = 0;
  std::string path;
};

class CheckpointManager {
 public:
  // `keep_last` newest checkpoints are kept, plus every one whose step is a multiple of
  // `keep_every` (0: none).
  CheckpointManager(std::string dir, int64_t keep_last, int64_t keep_every);

  // Creates (empty) the temporary folder for `step` and returns its path. With several ranks,
  // rank 0 calls begin(), every rank writes its files there, rank 0 calls commit().
  std::string begin(int64_t step) const;
  // Checksums every file of the temporary folder into the manifest, renames the folder into
  // place, removes checkpoints beyond keep_last / keep_every, and returns the final path.
  std::string commit(int64_t step) const;
  // begin + `write(folder)` + commit; if `write` throws, the temporary folder is removed and the
  // error rethrown, and earlier checkpoints are untouched.
  std::string save(int64_t step, const std::function<void(const std::string& folder)>& write) const;

  // Finished checkpoints, oldest first (not verified).
  std::vector<CheckpointRef> list() const;
  // The newest checkpoint that verifies; each newer damaged one is skipped with a warning that
  // says what is wrong. nullopt when none verifies.
  std::optional<CheckpointRef> latest_valid() const;
  // Removes temporary folders left by interrupted saves.
  void remove_temporaries() const;

  // Throws xlme::Error naming the checkpoint and the file that is missing, truncated or corrupt.
  static void verify(const std::string& path);

  const std::string& dir() const { return dir_; }
  // Where the checkpoint of `step` lives once committed, and while it is written.
  std::string path_for(int64_t step) const;
  std::string temporary_path_for(int64_t step) const { return path_for(step) + ".tmp"; }

 private:
  void prune() const;

  std::string dir_;
  int64_t keep_last_;
  int64_t keep_every_;
};

// The flat "a.b.c" -> tensor map of a module saved with torch::save(module) (a checkpoint's
// model.pt), on the CPU, read without building the module.
std::map<std::string, torch::Tensor> read_module_archive(const std::string& path);

// CRC32 (zlib's polynomial) of a whole file, read in chunks.
uint32_t file_crc32(const std::string& path);

}  // namespace xlme::train
