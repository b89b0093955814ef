// The fault suite of run folders and checkpoints: each case makes the fault for real (a damaged
// checkpoint, a used folder, a held lock, a full disk, a taken port, a signal), runs the command,
// and checks the exit code or error, that the message names the file or field, and that nothing
// the user had before is gone.
#include "xlme/common/exit_codes.h"
#include "xlme/common/io.h"
#include "xlme/dist/communicator.h"
#include "xlme/train/metrics.h"
#include "xlme/train/signals.h"

#include "fault_fixtures.h"
#include "test_util.h"

#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <sstream>
#include <thread>

namespace xlme {
namespace {

namespace fs = std::filesystem;
using testing::contains_all;
using testing::error_message;
using testing::fault_run_config;
using testing::nothing_lost;
using testing::read_file;
using testing::run_in_process;
using testing::run_tool;
using testing::snapshot;
using testing::step_folder;
using testing::TempDir;
using testing::tiny_pretrain_args;
using testing::verifies;

// Item 1: a damaged newest checkpoint (step 4) and keep_last 1. Resuming from step 2, the save
// of step 3 used to count the damaged step 4 and delete both 2 and the new 3.
TEST(Faults, DamagedNewestCheckpointNeverCostsTheNewOne) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_in_process(fault_run_config(run, 4, 2, 5)), kExitOk);
  fs::resize_file(step_folder(run, 4) + "/model.pt", 100);
  ASSERT_EQ(run_in_process(fault_run_config(run, 3, 1, 1)), kExitOk);
  EXPECT_TRUE(verifies(step_folder(run, 3)));
  EXPECT_FALSE(fs::exists(step_folder(run, 2)));  // pruned: this run's, older, verified
  EXPECT_TRUE(fs::exists(step_folder(run, 4)));   // damaged: neither counted nor removed
}

// Item 1: --resume none in a used folder is refused (it used to start a run whose checkpoints
// were pruned right after each save, the old run's higher steps winning); --overwrite keeps the
// old run aside.
TEST(Faults, FreshStartInAUsedFolderIsRefusedAndOverwriteKeepsTheOldRunAside) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_in_process(fault_run_config(run, 4, 1, 2)), kExitOk);
  const auto before = snapshot(run);
  train::PretrainOptions fresh;
  fresh.resume = "none";
  const std::string message =
      error_message([&] { run_in_process(fault_run_config(run, 3, 1, 2), fresh); });
  EXPECT_TRUE(contains_all(message, {"--resume none", run, step_folder(run, 4), "--overwrite"}));
  EXPECT_TRUE(nothing_lost(before));

  fresh.overwrite = true;
  ASSERT_EQ(run_in_process(fault_run_config(run, 3, 1, 2), fresh), kExitOk);
  EXPECT_TRUE(verifies(step_folder(run, 2)));
  EXPECT_TRUE(verifies(step_folder(run, 3)));
  EXPECT_FALSE(fs::exists(step_folder(run, 4)));
  std::vector<fs::path> aside;
  for (const auto& entry : fs::directory_iterator(run)) {
    if (entry.path().filename().string().rfind("replaced-", 0) == 0) aside.push_back(entry.path());
  }
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_TRUE(verifies((aside[0] / "checkpoints/step_00000004").string()));
  EXPECT_TRUE(verifies((aside[0] / "checkpoints/step_00000003").string()));
  EXPECT_TRUE(fs::is_regular_file(aside[0] / "metrics.jsonl"));
}

// Item 1: an empty step_00000050 and another run's valid checkpoint are never counted nor removed;
// the run keeps keep_last of its own.
TEST(Faults, PruningCountsAndRemovesOnlyTheRunsOwnCheckpoints) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_in_process(fault_run_config(dir / "other", 1, 1, 5)), kExitOk);
  ASSERT_EQ(run_in_process(fault_run_config(run, 2, 1, 5)), kExitOk);
  fs::create_directories(step_folder(run, 50));
  fs::copy(step_folder(dir / "other", 1), step_folder(run, 0));  // another run's, at step 0
  ASSERT_EQ(run_in_process(fault_run_config(run, 6, 1, 2)), kExitOk);
  EXPECT_TRUE(verifies(step_folder(run, 5)));
  EXPECT_TRUE(verifies(step_folder(run, 6)));
  for (int step : {1, 2, 3, 4}) EXPECT_FALSE(fs::exists(step_folder(run, step))) << step;
  EXPECT_TRUE(fs::is_directory(step_folder(run, 50)));
  EXPECT_TRUE(verifies(step_folder(run, 0)));
  // The lineage: one run id through the resume, recorded in each of its manifests.
  EXPECT_EQ(checkpoint::CheckpointManager::run_id_of(step_folder(run, 5)),
            checkpoint::CheckpointManager::run_id_of(step_folder(run, 6)));
  EXPECT_NE(checkpoint::CheckpointManager::run_id_of(step_folder(run, 0)),
            checkpoint::CheckpointManager::run_id_of(step_folder(run, 6)));
}

// Item 1: a failed save leaves the earlier checkpoints and no temporary folder.
TEST(Faults, FailedSaveRemovesItsTemporaryFolder) {
  TempDir dir;
  const checkpoint::CheckpointManager manager(dir / "checkpoints", 1, 0);
  manager.save(1, [](const std::string& folder) { testing::write_file(folder + "/a", "1"); });
  const auto before = snapshot(dir / "checkpoints");
  const std::string message = error_message([&] {
    manager.save(2, [](const std::string& folder) {
      testing::write_file(folder + "/a", "2");
      XLME_FAIL("write failed");
    });
  });
  EXPECT_EQ(message, "write failed");
  EXPECT_TRUE(nothing_lost(before));
  EXPECT_FALSE(fs::exists(manager.temporary_path_for(2)));
}

// A file-size limit (`ulimit -f`) on this process while in scope, with SIGXFSZ ignored, so that a
// write past it fails with EFBIG instead of killing the process.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    struct rlimit limit = old_;
    limit.rlim_cur = bytes;
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  struct rlimit old_ {};
  void (*old_handler_)(int) = nullptr;
};

// train.async_save: a checkpoint whose background write fails (model.pt over the file-size
// limit) fails the run at a following step boundary with the write's error, naming the
// checkpoint; its temporary folder is gone and the earlier checkpoint is kept.
TEST(Faults, FailedBackgroundSaveFailsTheRunNamingTheCheckpoint) {
  TempDir dir;
  const std::string run = dir / "run";
  auto c = fault_run_config(run, 2, 2, 5);
  ASSERT_EQ(run_in_process(c), kExitOk);
  const auto before = snapshot(run + "/checkpoints");
  const uint64_t model_bytes = fs::file_size(step_folder(run, 2) + "/model.pt");
  c.train.steps = 8;
  c.train.async_save = true;
  std::string message;
  {
    const FileSizeLimit limit(model_bytes / 2);
    message = error_message([&] { run_in_process(c); });
  }
  EXPECT_TRUE(contains_all(message, {"the checkpoint of step 4 ('" + step_folder(run, 4) +
                                         "'), written in the background, was not saved",
                                     "cannot write '" + step_folder(run, 4) + ".tmp/model.pt'",
                                     "file-size limit", "earlier checkpoints are kept"}))
      << message;
  EXPECT_TRUE(nothing_lost(before));
  EXPECT_TRUE(verifies(step_folder(run, 2)));
  EXPECT_FALSE(fs::exists(step_folder(run, 4) + ".tmp"));
  EXPECT_FALSE(fs::exists(step_folder(run, 4)));
  EXPECT_FALSE(fs::exists(step_folder(run, 6)));  // the run stopped at the next boundary
  EXPECT_FALSE(fs::exists(step_folder(run, 8)));
}

// train.async_save: SIGTERM while a checkpoint is written in the background waits for it, saves
// the last finished step and exits 75: every checkpoint left is complete.
TEST(Faults, StopSignalWaitsForTheSaveInFlight) {
  TempDir dir;
  const std::string run = dir / "run";
  const pid_t pid = testing::start_tool(
      "xlme-pretrain",
      tiny_pretrain_args(run, 100000,
                         {"--set", "train.log_every=1", "--set", "train.keep_last=100000"}),
      "", dir / "err");
  ASSERT_TRUE(testing::wait_for_text(dir / "err", "step 4/100000", 120)) << read_file(dir / "err");
  ::kill(pid, SIGTERM);
  const int code = testing::wait_exit_code(pid);
  const std::string err = read_file(dir / "err");
  EXPECT_EQ(code, kExitPreempted) << err;
  EXPECT_TRUE(contains_all(
      err, {"is written in the background", "(written in the background in ", "on a stop signal"}))
      << err;
  const int64_t newest = testing::newest_checkpoint_step(run);
  EXPECT_GE(newest, 4) << err;
  // Every step saved (train.save_every=1), each complete; no temporary folder.
  for (int64_t step = 1; step <= newest; ++step) {
    EXPECT_TRUE(verifies(step_folder(run, step))) << step << "\n" << err;
  }
  for (const auto& entry : fs::directory_iterator(run + "/checkpoints")) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

// Item 2: --force replaces only a folder xlme-export wrote.
TEST(Faults, ExportForceReplacesOnlyAnExportFolder) {
  TempDir dir;
  const std::string run = dir / "run";
  auto c = fault_run_config(run, 2, 1, 5);
  // export needs a tokenizer in the checkpoint
  testing::write_heldout_and_tokenizer(dir / "tok", 40);
  c.data.tokenizer = dir / "tok/spm.model";
  c.model.vocab_size = 60;
  ASSERT_EQ(run_in_process(c), kExitOk);
  const std::string checkpoint = step_folder(run, 2);
  const auto before = snapshot(run);

  // The run folder, an ancestor of the checkpoint, and a folder of the user's.
  auto r = run_tool("xlme-export", {"--checkpoint", checkpoint, "--out", run, "--force"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {run, "holds it"})) << r.err;
  r = run_tool("xlme-export", {"--checkpoint", checkpoint, "--out",
                               run + "/checkpoints/step_00000001", "--force"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {"--force refuses to replace", "holds checkpoints"})) << r.err;
  testing::write_file(dir / "mine/notes.txt", "mine");
  r = run_tool("xlme-export", {"--checkpoint", checkpoint, "--out", dir / "mine", "--force"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {dir / "mine", "no .xlme-export marker"})) << r.err;
  EXPECT_EQ(read_file(dir / "mine/notes.txt"), "mine");
  // A symbolic link to the run is never written or replaced through.
  fs::create_directory_symlink(run, dir / "link");
  r = run_tool("xlme-export", {"--checkpoint", checkpoint, "--out", dir / "link", "--force"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {dir / "link", "symbolic link"})) << r.err;
  EXPECT_TRUE(nothing_lost(before));

  // An export folder is replaced; with a file of the user's added, it is not.
  r = run_tool("xlme-export", {"--checkpoint", checkpoint, "--out", dir / "export"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  r = run_tool("xlme-export", {"--checkpoint", checkpoint, "--out", dir / "export", "--force"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  testing::write_file(dir / "export/eval.txt", "results");
  r = run_tool("xlme-export", {"--checkpoint", checkpoint, "--out", dir / "export", "--force"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {"'eval.txt'", "does not write"})) << r.err;
  EXPECT_EQ(read_file(dir / "export/eval.txt"), "results");
}

// Item 3: a second run in a locked run folder fails at once, naming the holder.
TEST(Faults, SecondRunInTheSameFolderFailsNamingTheHolder) {
  TempDir dir;
  const std::string run = dir / "run";
  fs::create_directories(run);
  const FileLock held(run + "/run.lock", "the test's run");  // the first run: this process
  const auto r = run_tool("xlme-pretrain", tiny_pretrain_args(run, 2));
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(
      r.err, {"run folder '" + run + "' is in use",
              "pid " + std::to_string(::getpid()) + " on host " + host_name(), run + "/run.lock"}))
      << r.err;
  EXPECT_FALSE(fs::exists(run + "/checkpoints"));
  EXPECT_FALSE(fs::exists(run + "/metrics.jsonl"));
}

// A run.lock, logs/rank0.log or metrics.jsonl that is a symbolic link is refused
// naming the file, and the link's target (the user's notes) is neither truncated nor appended to.
TEST(Faults, RunFilesThatAreSymbolicLinksAreRefusedAndTheirTargetsKept) {
  for (const std::string name : {"run.lock", "logs/rank0.log", "metrics.jsonl"}) {
    SCOPED_TRACE(name);
    TempDir dir;
    const std::string run = dir / "run";
    const std::string notes = dir / "notes";
    testing::write_file(notes, "my notes\n");
    fs::create_directories(fs::path(run + "/" + name).parent_path());
    fs::create_symlink(notes, run + "/" + name);
    const auto r = run_tool("xlme-pretrain", tiny_pretrain_args(run, 1));
    EXPECT_EQ(r.code, kExitError);
    EXPECT_TRUE(contains_all(
        r.err, {"'" + run + "/" + name + "' is a symbolic link", "remove or rename it"}))
        << r.err;
    EXPECT_EQ(read_file(notes), "my notes\n");
  }
}

// A train.micro_batch_tokens of 2e9 would pass a dry run (its allocation overcommitted) and grow
// past the machine's memory; it is refused before anything is allocated, naming the key.
TEST(Faults, MicroBatchLargerThanTheMachinesMemoryIsRefusedBeforeAllocating) {
  TempDir dir;
  const auto r = testing::run_tool_measured(
      "xlme-pretrain", tiny_pretrain_args(dir / "run", 1,
                                          {"--set", "train.micro_batch_tokens=2000000000", "--set",
                                           "train.tokens_per_task=2000000000"}));
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {"train.micro_batch_tokens 2000000000 needs at least",
                                   "GiB of memory; lower train.micro_batch_tokens"}))
      << r.err;
  EXPECT_LT(r.peak_rss_kib, 2 << 20) << "peak RSS " << r.peak_rss_kib << " KiB";
}

// A checkpoint folder named step_..40 holding step 1 is not taken as the newest (every resume
// would rewind): it is skipped with a warning naming both steps and the right name.
TEST(Faults, RenamedCheckpointIsNotTakenAsTheNewest) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_tool("xlme-pretrain", tiny_pretrain_args(run, 2)).code, kExitOk);
  fs::copy(run + "/checkpoints/step_00000001", run + "/checkpoints/step_00000040",
           fs::copy_options::recursive);
  const auto r = run_tool("xlme-pretrain", tiny_pretrain_args(run, 3));
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(
      contains_all(r.err, {"checkpoint '" + run + "/checkpoints/step_00000040' holds step 1",
                           "not the step 40 of its name", "rename it to 'step_00000001'"}))
      << r.err;
  EXPECT_TRUE(verifies(step_folder(run, 3)));
}

// Another run's checkpoint copied into checkpoints/ is refused with a message that names the
// other run and what to do (not one about a data-state seed).
TEST(Faults, AnotherRunsCheckpointCopiedInIsNamed) {
  TempDir dir;
  const std::string run = dir / "run", other = dir / "other";
  ASSERT_EQ(run_tool("xlme-pretrain", tiny_pretrain_args(run, 1)).code, kExitOk);
  ASSERT_EQ(run_tool("xlme-pretrain", tiny_pretrain_args(other, 2, {"--set", "run.seed=7"})).code,
            kExitOk);
  fs::copy(other + "/checkpoints/step_00000002", run + "/checkpoints/step_00000002",
           fs::copy_options::recursive);
  const auto r = run_tool("xlme-pretrain", tiny_pretrain_args(run, 3));
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(
      r.err, {"checkpoint '" + run + "/checkpoints/step_00000002' was written by another run",
              "run.out_dir '" + other + "'", "copied from another run folder?",
              "Move it out of '" + run + "/checkpoints'"}))
      << r.err;
}

// run.out_dir pointing at '/' is refused: it would write checkpoints/, logs/ and metrics.jsonl
// there.
TEST(Faults, RunFolderAtTheFileSystemRootIsRefused) {
  for (const std::string root : {"/", "/tmp/../", "//"}) {
    SCOPED_TRACE(root);
    // Shards that do not exist: were the check gone, the run would stop before its first save.
    const auto r = run_tool("xlme-pretrain",
                            tiny_pretrain_args(root, 1, {"--set", "data.shards=/nonexistent"}));
    EXPECT_EQ(r.code, kExitError);
    EXPECT_TRUE(contains_all(r.err, {"run.out_dir '" + root + "' is the root of the file system",
                                     "choose a folder for the run"}))
        << r.err;
  }
  EXPECT_FALSE(fs::exists("/logs/rank0.log"));
}

// Item 3: the lock goes with the process; the next run proceeds.
TEST(Faults, TheRunFolderLockEndsWithTheRun) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_in_process(fault_run_config(run, 1, 1, 5)), kExitOk);
  ASSERT_EQ(run_in_process(fault_run_config(run, 2, 1, 5)), kExitOk);
  EXPECT_TRUE(verifies(step_folder(run, 2)));
}

// Item 4: disk full while model.pt is written: one error line naming the file and the size, the
// usual exit code, the previous checkpoint untouched and no temporary folder left.
TEST(Faults, DiskFullWritingTheModelIsAnErrorAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string run = dir / "run";
  const testing::TmpfsMount disk(run + "/checkpoints", 1 << 20);
  if (!disk.skipped().empty()) GTEST_SKIP() << disk.skipped();
  auto r = run_tool("xlme-pretrain", tiny_pretrain_args(run, 1));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const std::string first = step_folder(run, 1);
  const auto before = snapshot(run + "/checkpoints");
  // Fill the disk but for the rank file and half of model.pt.
  const uint64_t room = fs::file_size(first + "/rank0.pt") + fs::file_size(first + "/model.pt") / 2;
  const uint64_t fill = free_bytes(run + "/checkpoints") - room;
  testing::write_file(run + "/checkpoints/filler", std::string(fill, '\0'));

  r = run_tool("xlme-pretrain", tiny_pretrain_args(run, 2));
  EXPECT_EQ(r.code, kExitError) << r.err;
  EXPECT_TRUE(contains_all(
      r.err, {"no space left on the device writing '" + step_folder(run, 2) + ".tmp/model.pt'",
              "needed ~", "MB free"}))
      << r.err;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  EXPECT_TRUE(nothing_lost(before));
  EXPECT_TRUE(verifies(first));
  EXPECT_FALSE(fs::exists(step_folder(run, 2) + ".tmp"));
  EXPECT_FALSE(fs::exists(step_folder(run, 2)));
}

// Item 8: one flipped byte in the newest manifest: --resume auto skips it naming the file and the
// field; verification, an explicit --resume and xlme-export name them in their error.
TEST(Faults, DamagedManifestIsNamedAndSkippedByResumeAuto) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_in_process(fault_run_config(run, 4, 2, 5)), kExitOk);
  testing::flip_manifest_byte(step_folder(run, 4));
  const std::string manifest = step_folder(run, 4) + "/manifest.yaml";
  const std::string message =
      error_message([&] { checkpoint::CheckpointManager::verify(step_folder(run, 4)); });
  EXPECT_TRUE(contains_all(message, {manifest, "field 'files.", ".bytes'", "malformed"}))
      << message;
  train::PretrainOptions explicit_resume;
  explicit_resume.resume = step_folder(run, 4);
  EXPECT_TRUE(contains_all(
      error_message([&] { run_in_process(fault_run_config(run, 5, 2, 5), explicit_resume); }),
      {manifest, ".bytes'"}));
  const auto r =
      run_tool("xlme-export", {"--checkpoint", step_folder(run, 4), "--out", dir / "export"});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {manifest, ".bytes'"})) << r.err;
  EXPECT_EQ(r.err.find("bad conversion"), std::string::npos) << r.err;

  const auto latest = checkpoint::CheckpointManager(run + "/checkpoints", 5, 0).latest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 2);
}

// Item 9: --resume with a path that does not exist says so.
TEST(Faults, ResumeFromAMissingPathSaysItDoesNotExist) {
  TempDir dir;
  train::PretrainOptions options;
  options.resume = dir / "run/checkpoints/step_00000100";
  const std::string message =
      error_message([&] { run_in_process(fault_run_config(dir / "run", 2, 1, 5), options); });
  EXPECT_TRUE(contains_all(message, {options.resume, "does not exist"})) << message;
}

// Item 9: resuming with another model shape names the field that differs.
TEST(Faults, ResumeWithAnotherModelShapeNamesTheField) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_in_process(fault_run_config(run, 2, 1, 5)), kExitOk);
  const auto before = snapshot(run);
  auto wider = fault_run_config(run, 4, 1, 5);
  wider.model.ffn_size = 48;
  wider.model.dropout = 0.2;  // may change on resume: not named
  const std::string message = error_message([&] { run_in_process(wider); });
  EXPECT_TRUE(contains_all(message, {step_folder(run, 2),
                                     "model.ffn_size: 64 in the checkpoint, "
                                     "48 now"}))
      << message;
  EXPECT_EQ(message.find("model.dropout"), std::string::npos) << message;
  EXPECT_TRUE(nothing_lost(before));
}

// Item 9: --config naming a folder, an empty run.out_dir.
TEST(Faults, ConfigFolderAndEmptyOutDirAreNamed) {
  TempDir dir;
  auto r = run_tool("xlme-pretrain", {"--config", dir.path().string()});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {dir.path().string(), "is a folder"})) << r.err;
  r = run_tool("xlme-pretrain", {"--set", "run.out_dir="});
  EXPECT_EQ(r.code, kExitError);
  EXPECT_TRUE(contains_all(r.err, {"run.out_dir", "is empty"})) << r.err;
}

// Item 9: SIGTERM during start-up is a stop like any other: exit code 75, not death by the signal
// (143). Rank 0 of 2 is signalled while it waits at the rendezvous for rank 1, which never comes:
// it stops at once (without waiting for the whole rendezvous timeout) and, no step
// having run, saves nothing.
TEST(Faults, StopSignalDuringStartUpExits75) {
  TempDir dir;
  const std::string run = dir / "run";
  const auto args = tiny_pretrain_args(run, 50);
  const std::string env =
      "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(testing::free_port()) +
      " RANK=";
  const pid_t rank0 = testing::start_tool("xlme-pretrain", args, env + "0", dir / "err0");
  ASSERT_TRUE(testing::wait_for_text(dir / "err0", "xlme-pretrain - ", 60));
  ::kill(rank0, SIGTERM);
  const int code0 = testing::wait_exit_code(rank0);
  const std::string err = read_file(dir / "err0");
  EXPECT_EQ(code0, kExitPreempted) << err;
  EXPECT_TRUE(contains_all(err, {"stopped by a signal while waiting for rank(s) 1 to join"}))
      << err;
  EXPECT_FALSE(fs::exists(step_folder(run, 0)));
}

// A closed terminal or a dropped ssh session (SIGHUP) stops a run as SIGTERM does: it saves the
// last finished step and exits 75. It used to die of the signal (exit 129), losing every step
// since the last save.
TEST(Faults, HangUpSavesTheLastStepAndExits75) {
  TempDir dir;
  const std::string run = dir / "run";
  const pid_t pid = testing::start_tool(
      "xlme-pretrain",
      tiny_pretrain_args(run, 100000,
                         {"--set", "train.save_every=100000", "--set", "train.log_every=1"}),
      "", dir / "err");
  ASSERT_TRUE(testing::wait_for_text(dir / "err", "step 3/100000", 120)) << read_file(dir / "err");
  ::kill(pid, SIGHUP);
  const int code = testing::wait_exit_code(pid);
  const std::string err = read_file(dir / "err");
  EXPECT_EQ(code, kExitPreempted) << err;
  EXPECT_TRUE(contains_all(err, {"on a stop signal", "resume with --resume auto"})) << err;
  EXPECT_GE(testing::newest_checkpoint_step(run), 3) << err;
}

// A console that goes away (`xlme-pretrain ... | head -3`, or tee killed) used to kill the run by
// SIGPIPE at its next log line (exit 141). Writes to it now fail and the run goes on; the rank's
// log file has every line.
TEST(Faults, AClosedConsolePipeDoesNotEndTheRun) {
  TempDir dir;
  const std::string run = dir / "run";
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // nobody reads the console
  const std::string command = testing::tool_command("xlme-pretrain", tiny_pretrain_args(run, 3));
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string log = read_file(run + "/logs/rank0.log");
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status) << "\n" << log;
  EXPECT_EQ(WEXITSTATUS(status), kExitOk) << log;
  EXPECT_TRUE(contains_all(log, {"done: 3 steps"})) << log;
  EXPECT_EQ(testing::newest_checkpoint_step(run), 3) << log;
}

// Item 9: ranks given different run.out_dir folders fail at start, before any step, naming it.
TEST(Faults, RanksWithDifferentRunFoldersFailAtStart) {
  TempDir dir;
  const std::string env =
      "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(testing::free_port()) +
      " RANK=";
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string run = dir / ("run" + std::to_string(rank));
    pids.push_back(testing::start_tool("xlme-pretrain", tiny_pretrain_args(run, 2),
                                       env + std::to_string(rank),
                                       dir / ("err" + std::to_string(rank))));
  }
  for (int rank = 0; rank < 2; ++rank) {
    const std::string run = dir / ("run" + std::to_string(rank));
    const int code = testing::wait_exit_code(pids[rank]);
    const std::string err = read_file(dir / ("err" + std::to_string(rank)));
    EXPECT_EQ(code, kExitError) << err;
    EXPECT_TRUE(contains_all(err, {"rank " + std::to_string(rank) + ": run.out_dir '" + run +
                                   "' is not the same folder on every rank"}))
        << err;
    EXPECT_FALSE(fs::exists(run + "/checkpoints")) << rank;
  }
}

// Ranks with another model.hidden_size or objectives.set (a SIGABRT inside Gloo otherwise): every
// rank fails at start naming the rank that differs and the key (any key of the resolved config).
TEST(Faults, RanksWithDifferentModelConfigsFailAtStartNamingTheRank) {
  for (const auto& [set, section] :
       {std::pair<std::string, std::string>{"model.hidden_size=64", "model.hidden_size"},
        {"objectives.set=xlme-mono", "objectives.set"}}) {
    SCOPED_TRACE(set);
    TempDir dir;
    const std::string run = dir / "run";
    const std::string env =
        "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(testing::free_port()) +
        " RANK=";
    std::vector<pid_t> pids;
    for (int rank = 0; rank < 2; ++rank) {
      const auto extra =
          rank == 1 ? std::vector<std::string>{"--set", set} : std::vector<std::string>{};
      pids.push_back(testing::start_tool("xlme-pretrain", tiny_pretrain_args(run, 2, extra),
                                         env + std::to_string(rank),
                                         dir / ("err" + std::to_string(rank))));
    }
    for (int rank = 0; rank < 2; ++rank) {
      const int code = testing::wait_exit_code(pids[rank]);
      const std::string err = read_file(dir / ("err" + std::to_string(rank)));
      EXPECT_EQ(code, kExitError) << err;
      EXPECT_TRUE(
          contains_all(err, {"rank " + std::to_string(rank) +
                                 ": the config of rank(s) 1 differs from rank 0's in " + section,
                             "the same --config"}))
          << err;
    }
    EXPECT_FALSE(fs::exists(run + "/checkpoints"));
  }
}

// Ranks compare what they read, not where: rank 1 given a copy of rank 0's shards at another path
// trains with it; given other shards (another corpus: same languages, other sentences), both
// ranks fail at start naming the rank and the shards that differ, before any step.
TEST(Faults, RanksWithOtherShardsFailAtStartNamingTheRankAndTheShard) {
  TempDir dir;
  const std::string copy = dir / "copy", other = dir / "other";
  fs::copy(testing::tiny_shards(), copy, fs::copy_options::recursive);
  data::write_synthetic_shards(other, 64, 20000, 10000, /*seed=*/6);
  for (const std::string& shards : {copy, other}) {
    SCOPED_TRACE(shards);
    const std::string run = dir / ("run-" + fs::path(shards).filename().string());
    const std::string env =
        "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(testing::free_port()) +
        " RANK=";
    std::vector<pid_t> pids;
    for (int rank = 0; rank < 2; ++rank) {
      // One micro-batch per rank of two.
      std::vector<std::string> extra = {"--set", "train.tokens_per_task=128"};
      if (rank == 1) extra.insert(extra.end(), {"--set", "data.shards=" + shards});
      pids.push_back(testing::start_tool("xlme-pretrain", tiny_pretrain_args(run, 2, extra),
                                         env + std::to_string(rank),
                                         dir / ("err" + std::to_string(rank))));
    }
    for (int rank = 0; rank < 2; ++rank) {
      const int code = testing::wait_exit_code(pids[rank]);
      const std::string err = read_file(dir / ("err" + std::to_string(rank)));
      if (shards == copy) {
        EXPECT_EQ(code, kExitOk) << err;
        continue;
      }
      EXPECT_EQ(code, kExitError) << err;
      EXPECT_TRUE(contains_all(
          err, {"rank " + std::to_string(rank) + ": the shards of rank(s) 1 differ from rank 0's",
                "mono/de (rank 0: ", "rank 1: ", "tokens, .bin CRC32",
                "every rank must read the same data"}))
          << err;
    }
    EXPECT_EQ(fs::exists(run + "/checkpoints"), shards == copy);
  }
}

// Item 9: a resumed run rewrites what the stopped run logged after its checkpoint: each step once.
TEST(Faults, MetricsAreNotDuplicatedAfterAResume) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(run_in_process(fault_run_config(run, 6, 2, 5)), kExitOk);
  fs::remove_all(step_folder(run, 6));  // as if killed between logging step 6 and saving it
  ASSERT_EQ(run_in_process(fault_run_config(run, 6, 2, 5)), kExitOk);
  std::istringstream lines(read_file(run + "/metrics.jsonl"));
  std::vector<std::string> steps;
  for (std::string line; std::getline(lines, line);) {
    steps.push_back(line.substr(0, line.find(',')));
  }
  const std::vector<std::string> expected = {"{\"step\": 1", "{\"step\": 2", "{\"step\": 3",
                                             "{\"step\": 4", "{\"step\": 5", "{\"step\": 6"};
  EXPECT_EQ(steps, expected) << read_file(run + "/metrics.jsonl");
}

// Item 9: MASTER_PORT taken by another process is named as such.
TEST(Faults, TakenMasterPortIsNamed) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  dist::LaunchInfo launch;
  launch.world_size = 2;
  launch.master_port = ntohs(addr.sin_port);
  const std::string message = error_message(
      [&] { dist::Communicator::create(launch, torch::kCPU, "gloo", std::chrono::seconds(5)); });
  ::close(fd);
  EXPECT_TRUE(
      contains_all(message, {"MASTER_PORT " + std::to_string(launch.master_port), "already taken"}))
      << message;
  EXPECT_EQ(message.find("frame #"), std::string::npos) << message;  // no backtrace
}

// Item 9: rank 0 names the ranks it waits for every 30 s instead of waiting in silence; at each
// quarter of a shorter start-up timeout (here 4 s: at 1, 2 and 3 s), never at the deadline.
TEST(Faults, RankZeroNamesTheMissingRankWhileWaiting) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  dist::LaunchInfo launch;
  launch.world_size = 3;
  launch.master_port = testing::free_port();
  const std::string message = error_message(
      [&] { dist::Communicator::create(launch, torch::kCPU, "gloo", std::chrono::seconds(4)); });
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_TRUE(contains_all(message, {"rank(s) 1, 2 of 3 did not join", "within 4 s"})) << message;
  // Reports at 1, 2 and 3 s; a loaded machine may let the last one fall past the deadline.
  const std::string text = log.str();
  const std::string report = "still waiting for rank(s) 1, 2 of 3 after ";
  int reports = 0;
  for (auto at = text.find(report); at != std::string::npos; at = text.find(report, at + 1)) {
    ++reports;
  }
  EXPECT_GE(reports, 2) << text;
  EXPECT_LE(reports, 3) << text;
  EXPECT_TRUE(contains_all(text, {"giving up after dist.startup_timeout_s = 4 s"})) << text;
  const auto first = text.find(report);
  ASSERT_NE(first, std::string::npos) << text;
  const char first_second = text[first + report.size()];
  EXPECT_TRUE(first_second == '1' || first_second == '2') << text;  // about 1 s in
}

}  // namespace
}  // namespace xlme
