// Distributed runs with two Gloo ranks on loopback: gradient buckets sent during the
// backward give the weights of buckets sent after it, bit for bit; ZeRO-1 gives the weights of the
// unsharded run and checkpoints that resume on one rank or two, with or without it; a run.out_dir
// that is not one shared folder is refused at start and no checkpoint is committed without every
// rank's file; ranks with different configs fail at start naming the keys; a resume that would
// change the tokens per step is refused naming the world sizes that keep them.
#include "xlme/checkpoint/manager.h"
#include "xlme/common/runtime.h"
#include "xlme/train/pretrain.h"
#include "xlme/train/trainer.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointManager;
using xlme::testing::contains_all;
using xlme::testing::read_file;
using xlme::testing::spawn_self;
using xlme::testing::TempDir;
using xlme::testing::wait_exit_code;

constexpr const char* kWorker = "DistScaling.DISABLED_Worker";

// A model of about 0.7M parameters (a 4096 x 128 embedding) in several 1 MB gradient buckets;
// `rows_per_rank` sequences of 16 tokens per micro-batch, 64 tokens per task and step. Without
// `clip`, no gradient clipping.
// No dropout and argmax sampling: the ranks' random streams do not matter.
config::Config bucket_config(int64_t rows_per_rank, bool clip = true) {
  auto c = xlme::testing::tiny_train_config(rows_per_rank, 1, 0.0);
  if (!clip) c.train.clip_norm = 0;
  c.model.vocab_size = 4096;
  c.model.hidden_size = 128;
  c.model.ffn_size = 256;
  c.model.generator.sampling_temperature = 1e-6;
  c.train.tokens_per_task = 2 * 2 * 2 * 16;
  c.dist.bucket_mb = 1;
  return c;
}

data::SyntheticBatches make_source(const config::Config& c, int64_t rows, int rank, int world) {
  return data::SyntheticBatches(data::SpecialIds::for_vocab(c.model.vocab_size), rows, 16, 0.15, 21,
                                rank, world);
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// The largest absolute difference between the two models' parameters.
double max_difference(model::ElectraModel& a, model::ElectraModel& b) {
  double most = 0;
  const auto pb = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    most = std::max(most, (item.value() - pb[item.key()]).abs().max().item<double>());
  }
  return most;
}

model::ElectraModel load_model(const config::Config& c, const std::string& file) {
  auto model = xlme::testing::make_tiny_model(c, 0);
  torch::load(model, file);
  return model;
}

// A pre-training run of `steps` on synthetic batches in `out_dir` (one rank's side).
config::Config run_config(const std::string& out_dir, int64_t steps) {
  auto c = xlme::testing::tiny_train_config(2, 1, 0.0);
  c.train.tokens_per_task = 2 * 2 * 16;
  c.train.steps = steps;
  c.train.warmup_steps = 1;
  c.train.save_every = 0;
  c.train.validate_every = 0;
  c.run.out_dir = out_dir;
  return c;
}

int run_pretrain(const config::Config& c, std::shared_ptr<dist::Communicator> comm) {
  auto source = make_source(c, 2, comm->rank(), comm->world_size());
  return pretrain(c, PretrainOptions{}, source, std::move(comm));
}

// Runs inside the spawned ranks only; XLME_MODE says what to do, the outcome goes to
// <XLME_DIR>/result<rank>.
TEST(DistScaling, DISABLED_Worker) {
  const std::string mode = env("XLME_MODE"), dir = env("XLME_DIR");
  const auto launch = dist::launch_info_from_env();
  std::ofstream result(dir + "/result" + std::to_string(launch.rank));
  try {
    const auto comm =
        dist::Communicator::create(launch, torch::kCPU, "gloo", std::chrono::seconds(60));
    const int rank = comm->rank();
    if (mode == "overlap") {
      // The same 3 steps with dist.overlap on and off; rank 0 saves the models.
      for (const bool on : {true, false}) {
        auto c = bucket_config(2);
        c.dist.overlap = on;
        auto source = make_source(c, 2, rank, 2);
        Trainer trainer(c, xlme::testing::make_tiny_model(c, 100 + rank), source, comm);
        for (int i = 0; i < 3; ++i) trainer.train_step();
        const auto& buckets = trainer.gradient_buckets();
        result << "overlap " << (on ? "on" : "off") << ": " << buckets.bucket_count()
               << " buckets, " << buckets.sent_during_backward() << " sent during the backward\n";
        if (rank == 0)
          torch::save(trainer.model(), dir + "/overlap_" + (on ? "on" : "off") + ".pt");
      }
    } else if (mode == "zero") {
      // The same 3 steps with train.zero 1 and 0, with gradient clipping and without.
      for (const bool clip : {true, false}) {
        for (const int zero : {1, 0}) {
          auto c = bucket_config(2);
          c.train.zero = zero;
          if (!clip) c.train.clip_norm = 0;
          auto source = make_source(c, 2, rank, 2);
          Trainer trainer(c, xlme::testing::make_tiny_model(c, 100 + rank), source, comm);
          for (int i = 0; i < 3; ++i) trainer.train_step();
          if (rank == 0) {
            torch::save(trainer.model(), fmt::format("{}/zero{}_clip{}.pt", dir, zero, clip));
          }
        }
      }
    } else if (mode == "save") {
      // 2 steps with train.zero 0 and 1, each saved by both ranks into its own checkpoint folder.
      for (const int zero : {0, 1}) {
        auto c = bucket_config(2, /*clip=*/false);
        c.train.zero = zero;
        auto source = make_source(c, 2, rank, 2);
        Trainer trainer(c, xlme::testing::make_tiny_model(c, 100 + rank), source, comm);
        for (int i = 0; i < 2; ++i) trainer.train_step();
        CheckpointManager manager(dir + "/two_zero" + std::to_string(zero), 3, 0);
        trainer.save_checkpoint(manager);
      }
    } else if (mode == "resume") {
      // One more step from <dir>/one's checkpoint of step 2, with train.zero 0 and 1.
      for (const int zero : {0, 1}) {
        auto c = bucket_config(2, /*clip=*/false);
        c.train.zero = zero;
        auto source = make_source(c, 2, rank, 2);
        Trainer trainer(c, xlme::testing::make_tiny_model(c, 100 + rank), source, comm);
        trainer.load_checkpoint(CheckpointManager::verify(dir + "/one/step_00000002"));
        trainer.train_step();
        if (rank == 0) {
          torch::save(trainer.model(), dir + "/resumed_zero" + std::to_string(zero) + ".pt");
        }
      }
    } else if (mode == "commit") {
      // Each rank's checkpoints in a folder of its own: rank 0 must not commit one.
      auto c = bucket_config(2);
      auto source = make_source(c, 2, rank, 2);
      Trainer trainer(c, xlme::testing::make_tiny_model(c, 100), source, comm);
      trainer.train_step();
      CheckpointManager manager(dir + "/ckpt" + std::to_string(rank), 3, 0);
      trainer.save_checkpoint(manager);
      result << "saved";
    } else if (mode == "batch") {
      // train.tokens_per_task of 3 micro-batches rounded up to 2 per rank: 128 tokens per step.
      auto c = xlme::testing::tiny_train_config(2, 3, 0.0);
      c.train.batch_rounding = "up";
      auto source = make_source(c, 2, rank, 2);
      Trainer trainer(c, xlme::testing::make_tiny_model(c, 100), source, comm);
      trainer.train_step();
      trainer.save_checkpoint(CheckpointManager(dir + "/batch", 3, 0));
    } else if (mode == "threads") {
      // Launched by hand: no launcher variable says how many ranks share this host.
      for (const char* name : {"OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                               "SLURM_TASKS_PER_NODE"}) {
        ::unsetenv(name);
      }
      auto c = run_config(dir + "/run", 1);
      c.run.threads = 0;
      const auto threads = share_cores_among_local_ranks(c, *comm);
      result << (threads ? fmt::format("{} threads from {}; LibTorch {}", threads->intra_op,
                                       threads->source, at::get_num_threads())
                         : std::string("unchanged"));
    } else if (mode == "folder" || mode == "config") {
      auto c = run_config(env("XLME_OUT_DIR"), 2);
      if (rank == 1 && mode == "config") {
        for (const std::string key : {"train.lr", "model.hidden_size", "train.steps"}) {
          if (env("XLME_DIFFER") != key) continue;
          if (key == "train.lr") c.train.lr = 2e-3;
          if (key == "model.hidden_size") c.model.hidden_size = 64;
          if (key == "train.steps") c.train.steps = 3;
        }
      }
      result << "exit " << run_pretrain(c, comm);
    }
  } catch (const std::exception& e) {
    result << "error: " << e.what();
  }
}

// Spawns both ranks in `mode` and waits for them; returns each rank's result file.
std::vector<std::string> two_ranks(const std::string& dir, const std::string& mode,
                                   std::map<std::string, std::string> extra = {},
                                   const std::map<int, std::string>& out_dirs = {}) {
  const std::string port = std::to_string(xlme::testing::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, std::string> vars = extra;
    vars.insert({{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", port},
                 {"XLME_MODE", mode},
                 {"XLME_DIR", dir}});
    if (out_dirs.count(rank)) vars["XLME_OUT_DIR"] = out_dirs.at(rank);
    pids.push_back(spawn_self(kWorker, vars));
  }
  std::vector<std::string> results;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wait_exit_code(pids[rank]), 0) << "rank " << rank;
    results.push_back(read_file(dir + "/result" + std::to_string(rank)));
  }
  return results;
}

// The step's last backward sends each bucket as soon as its gradients are final; the
// weights after 3 steps are those of sending every bucket after the backward, bit for bit.
TEST(DistScaling, BucketsSentDuringTheBackwardGiveTheSameWeightsBitForBit) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const auto results = two_ranks(dir, "overlap");
  for (const auto& r : results) {
    EXPECT_TRUE(contains_all(r, {"overlap off: 3 buckets, 0 sent during the backward"})) << r;
    EXPECT_EQ(r.find("error"), std::string::npos) << r;
  }
  // Every bucket goes out from a hook during the backward, none waits for its end (the last one,
  // the shared embeddings, completes with the backward's last node).
  EXPECT_TRUE(contains_all(results[0], {"overlap on: 3 buckets, 3 sent during the backward"}))
      << results[0];
  const auto c = bucket_config(2);
  auto on = load_model(c, dir + "/overlap_on.pt"), off = load_model(c, dir + "/overlap_off.pt");
  xlme::testing::expect_same_parameters(on, off, /*atol=*/0);
}

// ZeRO-1 (reduce-scatter, each rank steps its shard, all-gather) gives the weights of the
// unsharded run: bit for bit without gradient clipping (the same fused AdamW kernel on slices of
// the same elements); with clipping within float rounding, as the global norm is summed from the
// ranks' slices in float64 instead of from per-parameter norms, so the clipping factor may differ
// in its last bit (measured after 3 steps: at most 1.2e-7, one float32 ulp of weights near 1).
TEST(DistScaling, ZeroOneEqualsTheUnshardedRun) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const auto results = two_ranks(dir, "zero");
  for (const auto& r : results) EXPECT_EQ(r, "") << r;
  const auto c = bucket_config(2);
  auto sharded = load_model(c, dir + "/zero1_clipfalse.pt");
  auto plain = load_model(c, dir + "/zero0_clipfalse.pt");
  xlme::testing::expect_same_parameters(sharded, plain, /*atol=*/0);
  auto sharded_clipped = load_model(c, dir + "/zero1_cliptrue.pt");
  auto plain_clipped = load_model(c, dir + "/zero0_cliptrue.pt");
  EXPECT_LE(max_difference(sharded_clipped, plain_clipped), 5e-7);
  EXPECT_GT(max_difference(plain_clipped, plain), 1e-3);  // clipping was active
}

// Checkpoints of a ZeRO-1 run hold the whole optimizer state (the unsharded run's), so
// that they resume on one rank with or without ZeRO (2 -> 1), and a one-rank checkpoint resumes on
// two ranks with ZeRO as without it (1 -> 2): bit for bit (no clipping, see above).
TEST(DistScaling, ZeroCheckpointsResumeOnAnyNumberOfRanks) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  for (const auto& r : two_ranks(dir, "save")) EXPECT_EQ(r, "") << r;
  // 2 -> 1: one process with the combined micro-batches (4 sequences: the same 64 tokens a step).
  std::map<std::string, model::ElectraModel> resumed;
  for (const int saved_zero : {0, 1}) {
    for (const int zero : {0, 1}) {
      auto c = bucket_config(4, /*clip=*/false);
      c.train.zero = zero;
      auto source = make_source(c, 4, 0, 1);
      Trainer single(c, xlme::testing::make_tiny_model(c, 5), source,
                     xlme::testing::single_process());
      single.load_checkpoint(CheckpointManager::verify(
          dir + "/two_zero" + std::to_string(saved_zero) + "/step_00000002"));
      EXPECT_EQ(single.step(), 2);
      single.train_step();
      resumed.emplace(std::to_string(saved_zero) + std::to_string(zero), single.model());
    }
  }
  for (const std::string other : {"01", "10", "11"}) {
    EXPECT_EQ(max_difference(resumed.at("00"), resumed.at(other)), 0.0) << other;
  }
  // 1 -> 2: two steps on one process, then one more on two ranks.
  {
    auto c = bucket_config(4, /*clip=*/false);
    auto source = make_source(c, 4, 0, 1);
    Trainer single(c, xlme::testing::make_tiny_model(c, 5), source,
                   xlme::testing::single_process());
    single.train_step();
    single.train_step();
    single.save_checkpoint(CheckpointManager(dir + "/one", 3, 0));
  }
  for (const auto& r : two_ranks(dir, "resume")) EXPECT_EQ(r, "") << r;
  const auto c = bucket_config(2, /*clip=*/false);
  auto plain = load_model(c, dir + "/resumed_zero0.pt");
  auto sharded = load_model(c, dir + "/resumed_zero1.pt");
  EXPECT_EQ(max_difference(plain, sharded), 0.0);
}

// A rank whose checkpoint file does not land in rank 0's folder (each rank saving into a
// folder of its own, as with a run.out_dir local to each node) gets no checkpoint committed, and
// both ranks fail naming the rank and the folder: when rank 1 has no such folder (it cannot write)
// and when it has one of its own (its file lands there).
TEST(DistScaling, NoCheckpointIsCommittedWithoutEveryRanksFile) {
  for (const bool rank1_has_a_folder : {false, true}) {
    SCOPED_TRACE(rank1_has_a_folder);
    TempDir tmp;
    const std::string dir = tmp.path().string();
    if (rank1_has_a_folder) fs::create_directories(dir + "/ckpt1/step_00000001.tmp");
    const auto results = two_ranks(dir, "commit");
    const std::string folder = dir + "/ckpt0/step_00000001.tmp";
    EXPECT_TRUE(contains_all(
        results[0],
        {"error: checkpoint not saved: rank 1",
         rank1_has_a_folder
             ? "rank 1's file is not in rank 0's checkpoint folder '" + folder + "'"
             : "rank 1 could not write rank1.pt into the checkpoint folder '" + folder + "'",
         "run.out_dir must be one folder that every rank shares"}))
        << results[0];
    EXPECT_TRUE(contains_all(
        results[1],
        {rank1_has_a_folder ? std::string("error: rank 1: rank 0 did not save the checkpoint of "
                                          "step 1")
                            : "error: rank 1: the checkpoint folder '" + dir +
                                  "/ckpt1/step_00000001.tmp' that rank 0 made is not there"}))
        << results[1];
    EXPECT_FALSE(fs::exists(dir + "/ckpt0/step_00000001"));
    EXPECT_FALSE(fs::exists(folder));
  }
}

// At start, a run.out_dir that another rank does not see as the same folder is refused by
// every rank, naming the rank, its host and its folder.
TEST(DistScaling, ARunFolderNotSharedByEveryRankIsRefusedAtStart) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const auto results = two_ranks(dir, "folder", {}, {{0, dir + "/run0"}, {1, dir + "/run1"}});
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(contains_all(
        results[rank],
        {"rank " + std::to_string(rank) + ": run.out_dir '" + dir + "/run" + std::to_string(rank) +
             "' is not the same folder on every rank",
         std::string("rank 1 on host ") + host + " (its run.out_dir '" + dir + "/run1'",
         "does not exist there", "a file system they all share"}))
        << results[rank];
  }
  EXPECT_FALSE(fs::exists(dir + "/run0/checkpoints"));
  for (const auto& entry : fs::directory_iterator(dir + "/run0")) {
    EXPECT_EQ(entry.path().filename().string().rfind(".shared-folder-probe", 0), std::string::npos)
        << entry.path();  // removed once every rank looked
  }
}

// As on a cluster: the same run.out_dir path on both ranks, but rank 1 sees another
// folder there (a disk of its own: its own mount namespace with another folder bound over the
// path). The path strings agree; the probe file does not.
TEST(DistScaling, TheSamePathOnAnotherDiskIsRefusedAtStart) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  fs::create_directories(dir + "/run");
  fs::create_directories(dir + "/other_disk");
  if (std::system(("unshare -rm true >" + dir + "/unshare.log 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "no mount namespace here (unshare -rm: " << read_file(dir + "/unshare.log")
                 << ")";
  }
  char exe[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", exe, sizeof(exe) - 1), 0);
  const std::string port = std::to_string(xlme::testing::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) vars.emplace_back(*e);
    for (const std::string& v :
         {"RANK=" + std::to_string(rank), std::string("WORLD_SIZE=2"),
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + port,
          std::string("XLME_MODE=folder"), "XLME_DIR=" + dir, "XLME_OUT_DIR=" + dir + "/run"}) {
      vars.push_back(v);
    }
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    const std::string mount =
        rank == 1 ? "mount --bind " + dir + "/other_disk " + dir + "/run && " : std::string();
    std::vector<std::string> args = {
        "unshare",
        "-rm",
        "sh",
        "-c",
        mount + "exec \"$0\" --gtest_filter=" + kWorker + " --gtest_also_run_disabled_tests",
        exe};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    ASSERT_EQ(posix_spawnp(&pid, "unshare", nullptr, nullptr, argv.data(), envp.data()), 0);
    pids.push_back(pid);
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wait_exit_code(pids[rank]), 0) << rank;
    const std::string r = read_file(dir + "/result" + std::to_string(rank));
    EXPECT_TRUE(contains_all(r, {"rank " + std::to_string(rank) + ": run.out_dir '" + dir +
                                     "/run' is not the same folder on every rank",
                                 "rank 1 on host", "does not exist there"}))
        << r;
  }
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints"));
}

// Ranks with another train.lr (would train on silently), model.hidden_size (SIGABRT inside
// Gloo) or train.steps (would hang at the end) fail at start on every rank, naming the key and both
// values.
TEST(DistScaling, RanksWithDifferentConfigsFailAtStartNamingTheKeys) {
  for (const auto& [key, values] : std::vector<std::pair<std::string, std::string>>{
           {"train.lr", "(rank 0: 0.001, rank 1: 0.002)"},
           {"model.hidden_size", "(rank 0: 32, rank 1: 64)"},
           {"train.steps", "(rank 0: 2, rank 1: 3)"}}) {
    SCOPED_TRACE(key);
    TempDir tmp;
    const std::string dir = tmp.path().string();
    const auto results =
        two_ranks(dir, "config", {{"XLME_DIFFER", key}}, {{0, dir + "/run"}, {1, dir + "/run"}});
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(
          contains_all(results[rank], {"error: ",
                                       "rank " + std::to_string(rank) +
                                           ": the config of rank(s) 1 differs from rank 0's "
                                           "in " +
                                           key + " " + values,
                                       "the same --config"}))
          << results[rank];
    }
    EXPECT_FALSE(fs::exists(dir + "/run/checkpoints"));
  }
}

// Two ranks launched by hand on one host (no LOCAL_WORLD_SIZE, SLURM_* nor
// OMP_NUM_THREADS) count each other at the rendezvous and take half of the cores each.
TEST(DistScaling, RanksLaunchedByHandShareTheHostsCores) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  const int cores = runtime::available_cores();
  const int each = std::max(1, cores / 2);
  for (const auto& r : two_ranks(dir, "threads")) {
    EXPECT_EQ(r, fmt::format("{} threads from {} cores / 2 local ranks (ranks on this host at the "
                             "rendezvous); LibTorch {}",
                             each, cores, each));
  }
}

// A checkpoint of 2 ranks whose train.tokens_per_task (3 micro-batches) was rounded up
// to 128 tokens per step does not resume on 1 rank (96 tokens) unless train.tokens_per_task is
// changed on purpose; the refusal names the world sizes that keep 128.
TEST(DistScaling, AResumeOnAnotherWorldSizeKeepsTheTokensPerStepOrRefuses) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  for (const auto& r : two_ranks(dir, "batch")) EXPECT_EQ(r, "") << r;
  const std::string path = dir + "/batch/step_00000001";
  auto c = xlme::testing::tiny_train_config(2, 3, 0.0);
  c.train.batch_rounding = "up";
  auto source = make_source(c, 2, 0, 1);
  Trainer single(c, xlme::testing::make_tiny_model(c, 1), source, xlme::testing::single_process());
  EXPECT_EQ(single.tokens_per_step(), 96);
  EXPECT_TRUE(contains_all(
      xlme::testing::error_message(
          [&] { single.load_checkpoint(CheckpointManager::verify(path)); }),
      {"checkpoint '" + path + "' was trained with 128 tokens per step and task on 2 rank(s)",
       "on 1 rank(s) a step would hold 96 (-25.0%", "keeps 128 tokens per step (2, 4 rank(s))",
       "set train.tokens_per_task"}));
  c.train.tokens_per_task = 64;  // a deliberate change
  Trainer changed(c, xlme::testing::make_tiny_model(c, 1), source, xlme::testing::single_process());
  changed.load_checkpoint(CheckpointManager::verify(path));
  EXPECT_EQ(changed.step(), 1);
}

}  // namespace
}  // namespace xlme::train
