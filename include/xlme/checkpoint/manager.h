// Checkpoint folders that are either complete and verified or ignored.
//
// A checkpoint is `<dir>/step_<N>/` holding whatever the trainer writes (layout.h: model,
// optimizer, every rank's reader and RNG state, the resolved config, the tokenizer) plus
// `manifest.yaml`, which
// lists every file with its size and CRC32. It is written into `step_<N>.tmp/`, each file
// fsynced, the manifest written last, then renamed into place and the folder fsynced: a crash
// at any point leaves either the finished checkpoint or a temporary folder that is ignored.
//
// Lineage: a run draws a run id when it starts at step 0 and carries it through every resume
// (it is read back from the manifest of the checkpoint it resumes from); each manifest records
// it. Pruning (keep_last / keep_every) only ever removes complete, verified checkpoints with the
// manager's run id and a lower step than the one just written: damaged, empty, stray and other
// runs' folders are never counted nor removed.
//
// A checkpoint may come from someone else: every manifest entry must be a plain file name inside
// the folder, and a loader reads only the files the manifest lists and verify() checked (it takes
// their paths from the VerifiedFiles that verify() returns).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace xlme::checkpoint {

struct CheckpointRef {
  int64_t step = 0;
  std::string path;
};

// The files of a checkpoint that verified: the only source of the paths a loader opens.
class VerifiedFiles {
 public:
  VerifiedFiles(std::string folder, std::string manifest, std::set<std::string> names)
      : folder_(std::move(folder)), manifest_(std::move(manifest)), names_(std::move(names)) {}

  // The path of `name` in the checkpoint; throws xlme::Error naming the manifest and `name` when
  // the manifest does not list it (an unlisted file is unchecked and is never read).
  std::string path(const std::string& name) const;

  // Whether the manifest lists `name` (for files a checkpoint may lack, e.g. tokenizer.model).
  bool lists(const std::string& name) const { return names_.count(name) > 0; }

  // The checkpoint folder.
  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
  std::string manifest_;
  std::set<std::string> names_;
};

// A checkpoint that verified, with its files for the loader (which need not verify it again).
struct VerifiedCheckpoint {
  int64_t step = 0;
  std::string path;
  VerifiedFiles files;
};

class CheckpointManager {
 public:
  // `keep_last` newest checkpoints are kept, plus every one whose step is a multiple of
  // `keep_every` (0: none).
  CheckpointManager(std::string dir, int64_t keep_last, int64_t keep_every);

  // The run id recorded in the manifests this manager commits; pruning considers only
  // checkpoints with this id. A fresh one (new_run_id) unless set.
  void set_run_id(std::string run_id) { run_id_ = std::move(run_id); }
  const std::string& run_id() const { return run_id_; }
  // A fresh random run id (16 hex digits).
  static std::string new_run_id();

  // Creates (empty) the temporary folder for `step` and returns its path. With several ranks,
  // rank 0 calls begin(), every rank writes its files there, rank 0 calls commit().
  std::string begin(int64_t step) const;
  // Checksums every file of the temporary folder into the manifest, renames the folder into
  // place, prunes (see the lineage note above), and returns the final path. A finished folder of
  // the same step is replaced when it is this run's, else moved aside to
  // `step_<N>.superseded-<time>` with a warning.
  std::string commit(int64_t step) const;
  // Removes the temporary folder of `step` (a save that failed); earlier checkpoints are untouched.
  void abort(int64_t step) const;
  // begin + `write(folder)` + commit; if `write` or the commit throws, the temporary folder is
  // removed and the error rethrown, and earlier checkpoints are untouched.
  std::string save(int64_t step, const std::function<void(const std::string& folder)>& write) const;

  // Finished checkpoints, oldest first (not verified).
  std::vector<CheckpointRef> list() const;
  // The newest checkpoint that verifies; each newer damaged one is skipped with a warning that
  // says what is wrong. nullopt when none verifies. A newer checkpoint written by a newer xlme
  // (a higher format version) is not damaged and is not skipped: the search stops with an error
  // that says so and what to do, as an older step taken in its place would lose its work.
  std::optional<VerifiedCheckpoint> latest_valid() const;
  // Removes temporary folders left by interrupted saves.
  void remove_temporaries() const;

  // Throws xlme::Error naming the checkpoint and the file that is missing, truncated or corrupt,
  // or the manifest field that is missing or malformed. A path that does not exist is named so.
  // Every entry must be a plain file name (no '/', not '.' or '..') of a regular file, not a
  // symbolic link: checked for all entries before any file is opened. Returns the listed files.
  static VerifiedFiles verify(const std::string& path);
  // The run id in the checkpoint's manifest ("" for checkpoints written before run ids); throws
  // like verify() when the manifest cannot be read.
  static std::string run_id_of(const std::string& path);

  const std::string& dir() const { return dir_; }
  // Where the checkpoint of `step` lives once committed, and while it is written.
  std::string path_for(int64_t step) const;
  std::string temporary_path_for(int64_t step) const { return path_for(step) + ".tmp"; }

 private:
  void prune(int64_t written) const;
  // Whether `ref` verifies and carries run_id_ (remembered once known).
  bool of_this_run(const CheckpointRef& ref) const;

  std::string dir_;
  int64_t keep_last_;
  int64_t keep_every_;
  std::string run_id_;
  mutable std::set<std::string> own_;  // folders known to verify with run_id_
};

}  // namespace xlme::checkpoint
