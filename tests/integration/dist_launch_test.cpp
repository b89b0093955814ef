// Multi-process runs as users launch them, each with 2 Gloo CPU ranks of the tiny model: torch
// 2.11's torchrun (the project's .venv) in each rendezvous form, scripts/xlme-torchrun's exit
// code 75 after a preemption, SIGUSR1 to torchrun itself (no orphaned workers), the SLURM
// template scripts/slurm/xlme.sbatch with a stand-in srun; and the failures noticed in seconds:
// the start-up timeout naming the missing rank, a stop signal during the rendezvous, a frozen or
// killed rank (the heartbeat), and a killed rank's log ending with its last complete line.
#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/common/exit_codes.h"
#include "xlme/common/logging.h"

#include "fault_fixtures.h"
#include "test_util.h"

#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace xlme {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::contains_all;
using testing::pretrain_binary;
using testing::quote;
using testing::read_file;
using testing::start_shell;
using testing::step_folder;
using testing::TempDir;
using testing::tiny_pretrain_args;
using testing::verifies;
using testing::wait_code;
using testing::wait_for_text;
using testing::write_file;

// The torchrun of the project's Python environment (XLME_PYTHON's folder).
std::string torchrun() {
  return (fs::path(XLME_PYTHON).parent_path() / "torchrun").string();
}

std::string joined(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += " " + quote(a);
  return out;
}

// The pids whose parent is `parent` (from /proc).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path() / "stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) {
      children.push_back(std::stoi(name));
    }
  }
  return children;
}

// Whether `pid` (a child not yet waited for) still runs.
bool running(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

// Waits until `run` holds a complete checkpoint at step `step` or later; false at once when `pid`
// has ended. (Not step `step` itself: with train.save_every=1 and keep_last=3 a fast run can prune
// it before a poll sees it.)
bool wait_for_checkpoint(const std::string& run, int64_t step, double seconds, pid_t pid = -1) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (testing::newest_checkpoint_step(run) >= step) return true;
    if (pid > 0 && !running(pid)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The tiny run's arguments, with the start-up and heartbeat settings of these tests.
std::vector<std::string> run_args(const std::string& out_dir, int64_t steps,
                                  std::vector<std::string> extra = {}) {
  // train.tokens_per_task: one micro-batch per rank of two.
  for (const char* set :
       {"dist.startup_timeout_s=20", "dist.heartbeat_s=2", "train.tokens_per_task=128"}) {
    extra.push_back("--set");
    extra.push_back(set);
  }
  return tiny_pretrain_args(out_dir, steps, extra);
}

std::string rank_env(int rank, int port) {
  return "env WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
         " RANK=" + std::to_string(rank);
}

class TorchrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(torchrun())) GTEST_SKIP() << "no torchrun at " << torchrun();
  }
};

// Every rendezvous form of torch 2.11's torchrun: both ranks train and every checkpoint holds
// both ranks' files (the default rendezvous failed at once: "MASTER_PORT ... is already taken").
class TorchrunForms : public TorchrunTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(TorchrunForms, TwoRanksTrainAndSaveBothRanksFiles) {
  TempDir dir;
  const std::string run = dir / "run";
  const std::string port = std::to_string(testing::free_port());
  std::string form;
  if (GetParam() == "standalone") form = "--standalone";
  if (GetParam() == "c10d") form = "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:" + port;
  if (GetParam() == "static") {
    form = "--nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --master-port " + port;
  }
  const pid_t pid = start_shell(torchrun() + " --nproc-per-node 2 " + form + " --no-python " +
                                    quote(pretrain_binary()) + joined(run_args(run, 2)),
                                dir / "log");
  const int code = wait_code(pid, 120);
  EXPECT_EQ(code, kExitOk) << read_file(dir / "log");
  EXPECT_TRUE(verifies(step_folder(run, 2))) << read_file(dir / "log");
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(contains_all(read_file(run + "/logs/rank" + rank + ".log"),
                             {"distributed: rank " + rank + " of 2", "via torchrun"}))
        << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Rendezvous, TorchrunForms,
                         ::testing::Values("standalone", "c10d", "static"));

// scripts/xlme-torchrun: a preemption signal to the launcher reaches the workers, which save and
// exit 75, and the launcher exits 75 (torchrun alone exits 1 on a worker's 75).
class TorchrunPreemption : public TorchrunTest, public ::testing::WithParamInterface<int> {};

TEST_P(TorchrunPreemption, WrapperExits75AfterTheWorkersSaved) {
  TempDir dir;
  const std::string run = dir / "run";
  const pid_t pid = start_shell("env TORCHRUN=" + quote(torchrun()) +
                                    " scripts/xlme-torchrun --standalone " + "--nproc-per-node 2 " +
                                    quote(pretrain_binary()) + joined(run_args(run, 100000)),
                                dir / "log");
  ASSERT_TRUE(wait_for_checkpoint(run, 2, 90, pid)) << read_file(dir / "log");
  ::kill(pid, GetParam());
  const int code = wait_code(pid, 60);
  const std::string log = read_file(dir / "log");
  EXPECT_EQ(code, kExitPreempted) << log;
  EXPECT_TRUE(contains_all(log, {"xlme-torchrun: the workers stopped on a preemption"})) << log;
  EXPECT_TRUE(contains_all(read_file(run + "/logs/rank0.log"), {"stopping at step"}));
  EXPECT_TRUE(contains_all(read_file(run + "/logs/rank1.log"), {"stopping at step"}));
}

INSTANTIATE_TEST_SUITE_P(Signals, TorchrunPreemption, ::testing::Values(SIGTERM, SIGUSR1, SIGUSR2),
                         [](const auto& info) {
                           return std::string("SIG") + sigabbrev_np(info.param);
                         });

// An unusable TMPDIR (the wrapper keeps the workers' exit codes there) is named with what to set,
// before torchrun starts; the wrapper used to go on with no folder and lose the exit codes.
TEST(TorchrunWrapper, UnusableTmpdirIsNamedWithWhatToSet) {
  TempDir dir;
  const std::string missing = dir / "no-such-folder";
  const pid_t pid = start_shell("env TMPDIR=" + quote(missing) +
                                    " TORCHRUN=/bin/false scripts/xlme-torchrun --standalone "
                                    "--nproc-per-node 1 " +
                                    quote(pretrain_binary()) + " --help",
                                dir / "log");
  const int code = wait_code(pid, 30);
  const std::string log = read_file(dir / "log");
  EXPECT_EQ(code, kExitError) << log;
  EXPECT_TRUE(contains_all(log, {"xlme-torchrun: cannot create its folder", "TMPDIR '" + missing,
                                 "set TMPDIR to a writable folder"}))
      << log;
}

// SIGUSR1 kills torchrun (it does not handle it) and used to leave its workers training on,
// orphaned: each worker now stops when its torchrun dies, saving and exiting 75. This process is
// made their subreaper, so that it collects them.
TEST_F(TorchrunTest, SigusrToTorchrunLeavesNoOrphanedWorkers) {
  TempDir dir;
  const std::string run = dir / "run";
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const pid_t pid = start_shell(torchrun() + " --standalone --nproc-per-node 2 --no-python " +
                                    quote(pretrain_binary()) + joined(run_args(run, 100000)),
                                dir / "log");
  ASSERT_TRUE(wait_for_checkpoint(run, 2, 90, pid)) << read_file(dir / "log");
  const std::vector<pid_t> workers = children_of(pid);
  ASSERT_EQ(workers.size(), 2u) << read_file(dir / "log");
  ::kill(pid, SIGUSR1);
  EXPECT_EQ(wait_code(pid, 30), 128 + SIGUSR1);
  for (const pid_t worker : workers) {
    EXPECT_EQ(wait_code(worker, 30), kExitPreempted) << "worker " << worker;
  }
  EXPECT_TRUE(contains_all(read_file(run + "/logs/rank1.log"), {"stopping at step"}));
}

// torchrun's elastic restarts: a worker killed mid-run (SIGKILL, as the kernel's OOM killer or a
// lost device ends one) makes torchrun --max-restarts 1 stop the other and start both again, with
// the same command; they resume from the newest checkpoint (--resume auto, the default) and the
// run ends at its last step with the weights of the same run uninterrupted, bit for bit.
TEST_F(TorchrunTest, MaxRestartsResumesAKilledWorkerBitIdentically) {
  constexpr int64_t kSteps = 40;
  TempDir dir;
  const auto launch = [&](const std::string& run, const std::string& log) {
    return start_shell(torchrun() + " --standalone --nproc-per-node 2 --max-restarts 1 " +
                           "--monitor-interval 0.1 --no-python " + quote(pretrain_binary()) +
                           joined(run_args(run, kSteps)),
                       dir / log);
  };
  const std::string run = dir / "run";
  const pid_t pid = launch(run, "log");
  ASSERT_TRUE(wait_for_checkpoint(run, 3, 90, pid)) << read_file(dir / "log");
  const std::vector<pid_t> workers = children_of(pid);
  ASSERT_EQ(workers.size(), 2u) << read_file(dir / "log");
  const int64_t killed_after = testing::newest_checkpoint_step(run);
  ASSERT_LT(killed_after, kSteps) << "the run ended before a worker could be killed";
  ::kill(workers[1], SIGKILL);
  EXPECT_EQ(wait_code(pid, 120), kExitOk) << read_file(dir / "log");
  // Both workers started again: rank 0 too (torchrun stopped it) resumed from a checkpoint.
  const std::string rank0 = read_file(run + "/logs/rank0.log");
  EXPECT_TRUE(contains_all(rank0, {"resumed from " + run + "/checkpoints/step_"})) << rank0;

  const std::string reference = dir / "reference";
  EXPECT_EQ(wait_code(launch(reference, "reference.log"), 120), kExitOk)
      << read_file(dir / "reference.log");
  const auto resumed = checkpoint::read_module_archive(
      step_folder(run, kSteps) + "/" + checkpoint::kModelFile, uint64_t{1} << 30);
  const auto uninterrupted = checkpoint::read_module_archive(
      step_folder(reference, kSteps) + "/" + checkpoint::kModelFile, uint64_t{1} << 30);
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (const auto& [name, tensor] : uninterrupted) {
    ASSERT_TRUE(resumed.count(name)) << name;
    EXPECT_TRUE(torch::equal(resumed.at(name), tensor))
        << name << " (killed after step " << killed_after << ")";
  }
}

// A TCP port in [15000, 35000) free a moment ago: SLURM's rendezvous port for a job id.
int free_slurm_port() {
  for (int port = 15000 + ::getpid() % 20000, tries = 0; tries < 20000; ++tries) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) return port;
    port = 15000 + (port - 15000 + 1) % 20000;
  }
  return -1;
}

// scripts/slurm/xlme.sbatch run by hand with SLURM's variables, `srun` and `scontrol` replaced by
// stand-ins: srun starts SLURM_NTASKS copies with SLURM_PROCID / SLURM_LOCALID set (and writes
// their pids), scontrol writes its arguments. A normal run exits 0 with both ranks' files; SIGUSR1
// to the tasks (SLURM's --signal=USR1@120) makes the script requeue the job and exit 75.
TEST(SlurmTemplate, RunsAndRequeuesAfterThePreemptionSignal) {
  TempDir dir;
  write_file(dir / "bin/srun",
             "#!/usr/bin/env bash\n"
             "pids=()\n"
             "for ((i = 0; i < SLURM_NTASKS; i++)); do\n"
             "  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST \"$@\" &\n"
             "  pids+=($!); echo $! >> \"$SRUN_PIDS\"\n"
             "done\n"
             "code=0\n"
             "for p in \"${pids[@]}\"; do wait $p; c=$?; [ $c -gt $code ] && code=$c; done\n"
             "exit $code\n");
  write_file(dir / "bin/scontrol", "#!/bin/sh\necho \"$@\" >> \"$SCONTROL_LOG\"\n");
  fs::permissions(dir / "bin/srun", fs::perms::owner_all);
  fs::permissions(dir / "bin/scontrol", fs::perms::owner_all);
  const int port = free_slurm_port();
  ASSERT_GT(port, 0);
  const std::string job = std::to_string(port - 15000 + 20000);  // 15000 + job % 20000 = port
  auto command = [&](const std::string& run, int64_t steps) {
    return "env PATH=" + quote(dir / "bin") + ":\"$PATH\" SLURM_JOB_ID=" + job +
           " SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_JOB_NODELIST=localhost SLURM_SUBMIT_DIR=" +
           quote(XLME_SOURCE_DIR) + " XLME_PRETRAIN=" + quote(pretrain_binary()) +
           " SRUN_PIDS=" + quote(dir / "pids") + " SCONTROL_LOG=" + quote(dir / "scontrol") +
           " bash scripts/slurm/xlme.sbatch" + joined(run_args(run, steps));
  };

  const std::string done = dir / "done";
  EXPECT_EQ(wait_code(start_shell(command(done, 2), dir / "log1"), 120), kExitOk)
      << read_file(dir / "log1");
  EXPECT_TRUE(verifies(step_folder(done, 2)));
  EXPECT_TRUE(contains_all(read_file(done + "/logs/rank0.log"),
                           {"via slurm", "port 15000 + SLURM_JOB_ID % 20000"}));
  EXPECT_FALSE(fs::exists(dir / "scontrol"));

  fs::remove(dir / "pids");
  const std::string stopped = dir / "stopped";
  const pid_t script = start_shell(command(stopped, 100000), dir / "log2");
  ASSERT_TRUE(wait_for_checkpoint(stopped, 2, 90, script)) << read_file(dir / "log2");
  std::istringstream pids(read_file(dir / "pids"));
  for (pid_t task; pids >> task;) ::kill(task, SIGUSR1);
  const int code = wait_code(script, 60);
  EXPECT_EQ(code, kExitPreempted) << read_file(dir / "log2");
  EXPECT_EQ(read_file(dir / "scontrol"), "requeue " + job + "\n");
  EXPECT_TRUE(contains_all(read_file(stopped + "/logs/rank1.log"), {"stopping at step"}));
}

// Rank 0 alone: the start-up timeout, not dist.timeout_s (1800 s), ends the wait, naming rank 1.
TEST(DistStartup, MissingRankIsNamedAfterTheStartupTimeout) {
  TempDir dir;
  const auto start = Clock::now();
  const pid_t pid = start_shell(
      rank_env(0, testing::free_port()) + " " + quote(pretrain_binary()) +
          joined(tiny_pretrain_args(dir / "run", 2, {"--set", "dist.startup_timeout_s=2"})),
      dir / "log");
  EXPECT_EQ(wait_code(pid, 60), kExitError);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string log = read_file(dir / "log");
  EXPECT_TRUE(contains_all(
      log, {"rank(s) 1 of 2 did not join the rendezvous", "within 2 s (dist.startup_timeout_s)"}))
      << log;
  EXPECT_LT(seconds, 30) << log;
}

// SIGTERM during the rendezvous ends the wait at once with exit code 75 (it used to be ignored
// until the rendezvous gave up): rank 0 waiting for rank 1, and rank 1 trying to reach rank 0.
TEST(DistStartup, StopSignalDuringTheRendezvousExits75AtOnce) {
  for (const int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    TempDir dir;
    const pid_t pid =
        start_shell(rank_env(rank, testing::free_port()) + " " + quote(pretrain_binary()) +
                        joined(tiny_pretrain_args(dir / "run", 2)),
                    dir / "log");
    ASSERT_TRUE(wait_for_text(dir / "run/logs/rank" + std::to_string(rank) + ".log",
                              "xlme-pretrain - ", 60));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto signalled = Clock::now();
    ::kill(pid, SIGTERM);
    EXPECT_EQ(wait_code(pid, 30), kExitPreempted) << read_file(dir / "log");
    const double seconds = std::chrono::duration<double>(Clock::now() - signalled).count();
    EXPECT_LT(seconds, 5);
    const std::string log = read_file(dir / "run/logs/rank" + std::to_string(rank) + ".log");
    EXPECT_TRUE(contains_all(log, {"stopped by a signal while", "exit code 75"})) << log;
    EXPECT_FALSE(fs::exists(dir / "run/checkpoints/step_00000000"));
    const std::string console = read_file(dir / "log");
    EXPECT_EQ(console.find("frame #"), std::string::npos) << console;  // no C++ backtrace
  }
}

// A rank waiting for rank 0's rendezvous says so a few times, in lines of its own: c10d's client
// used to log each failed attempt with a C++ backtrace (1,235 lines, 65 backtraces a minute).
TEST(DistStartup, ARankWaitingForRankZeroReportsInAFewLines) {
  TempDir dir;
  const int port = testing::free_port();
  const pid_t pid = start_shell(
      rank_env(1, port) + " " + quote(pretrain_binary()) +
          joined(tiny_pretrain_args(dir / "run", 2, {"--set", "dist.startup_timeout_s=6"})),
      dir / "log");
  EXPECT_EQ(wait_code(pid, 60), kExitError);
  const std::string log = read_file(dir / "log");
  EXPECT_EQ(log.find("frame #"), std::string::npos) << log;
  EXPECT_EQ(log.find("[c10d]"), std::string::npos) << log;
  EXPECT_LE(std::count(log.begin(), log.end(), '\n'), 20) << log;
  EXPECT_TRUE(contains_all(log, {"rank 1 of 2: cannot reach the rendezvous at 127.0.0.1:" +
                                     std::to_string(port) + " (Connection refused)",
                                 "that rank 0 is running"}))
      << log;
  const std::string rank_log = read_file(dir / "run/logs/rank1.log");
  EXPECT_TRUE(contains_all(rank_log, {"rank 1 of 2: the rendezvous at 127.0.0.1:" +
                                      std::to_string(port) + " is not up yet"}))
      << rank_log;
  EXPECT_EQ(rank_log.find("frame #"), std::string::npos) << rank_log;
}

// Ranks 0 and 1 of a long run into `run` on `port`, logging to dir/log0 and dir/log1.
std::vector<pid_t> start_two_training_ranks(const TempDir& dir, const std::string& run, int port) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    pids.push_back(start_shell(
        rank_env(rank, port) + " " + quote(pretrain_binary()) + joined(run_args(run, 100000)),
        dir / ("log" + std::to_string(rank))));
  }
  return pids;
}

// A second process started by mistake with a rank that already joined (a leftover RANK, a job
// launched twice) is refused at the rendezvous, naming the first one; it used to join, share the
// rank's heartbeat and hang in an all-reduce. The job trains on.
TEST(DistStartup, ASecondProcessWithTheSameRankIsRefused) {
  TempDir dir;
  const std::string run = dir / "run";
  const int port = testing::free_port();
  const std::vector<pid_t> pids = start_two_training_ranks(dir, run, port);
  ASSERT_TRUE(wait_for_checkpoint(run, 2, 90, pids[0])) << read_file(dir / "log0");
  const auto start = Clock::now();
  const pid_t second = start_shell(
      rank_env(1, port) + " " + quote(pretrain_binary()) + joined(run_args(dir / "run-second", 12)),
      dir / "log-second");
  EXPECT_EQ(wait_code(second, 60), kExitError) << read_file(dir / "log-second");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30);
  const std::string log = read_file(dir / "log-second");
  EXPECT_TRUE(contains_all(log, {"rank 1 of 2: another process already joined the rendezvous at "
                                 "127.0.0.1:" +
                                     std::to_string(port) + " as rank 1 (host:pid ",
                                 "Each rank is started once: check RANK"}))
      << log;
  // The job trains on (a later checkpoint appears) and stops as usual.
  const int64_t after = testing::newest_checkpoint_step(run);
  EXPECT_TRUE(wait_for_checkpoint(run, after + 2, 90, pids[0])) << read_file(dir / "log0");
  for (const pid_t pid : pids) ::kill(pid, SIGTERM);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wait_code(pids[rank], 60), kExitPreempted)
        << read_file(dir / ("log" + std::to_string(rank)));
  }
}

// Two ranks training; rank `victim` gets `signal` once a checkpoint exists. The other rank must
// stop within the heartbeat (2 s) plus a margin, naming the lost rank; returns its log and the
// seconds it took.
struct Noticed {
  int code = -1;
  double seconds = 0;
  std::string log;
};

Noticed lose_a_rank(const TempDir& dir, int victim, int signal) {
  const std::string run = dir / "run";
  const int port = testing::free_port();
  const std::vector<pid_t> pids = start_two_training_ranks(dir, run, port);
  Noticed noticed;
  if (!wait_for_checkpoint(run, 2, 90, pids[0])) {
    for (const pid_t pid : pids) ::kill(pid, SIGKILL);
    for (const pid_t pid : pids) wait_code(pid, 10);
    noticed.log = "no checkpoint: " + read_file(dir / "log0");
    return noticed;
  }
  const auto start = Clock::now();
  ::kill(pids[victim], signal);
  const int survivor = 1 - victim;
  noticed.code = wait_code(pids[survivor], 60);
  noticed.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  noticed.log = read_file(dir / ("log" + std::to_string(survivor)));
  ::kill(pids[victim], SIGKILL);
  wait_code(pids[victim], 10);
  std::cout << "rank " << survivor << " noticed rank " << victim << "'s " << strsignal(signal)
            << " after " << noticed.seconds << " s\n";
  return noticed;
}

TEST(DistHeartbeat, FrozenRankIsNamedWithinTheHeartbeat) {
  TempDir dir;
  const Noticed n = lose_a_rank(dir, 1, SIGSTOP);
  EXPECT_EQ(n.code, kExitError) << n.log;
  EXPECT_TRUE(
      contains_all(n.log, {"rank 1 (host ", "has not been heard from for", "dist.heartbeat_s = 2"}))
      << n.log;
  EXPECT_LT(n.seconds, 8) << n.log;
}

// Rank 0 serves the store: when it freezes, the other ranks' heartbeat cannot reach the store.
TEST(DistHeartbeat, FrozenRankZeroIsNoticedThroughItsStore) {
  TempDir dir;
  const Noticed n = lose_a_rank(dir, 0, SIGSTOP);
  EXPECT_EQ(n.code, kExitError) << n.log;
  EXPECT_TRUE(contains_all(n.log, {"the rendezvous store at 127.0.0.1:", "served by rank 0 (host ",
                                   "has not answered for"}))
      << n.log;
  EXPECT_LT(n.seconds, 8) << n.log;
}

// A killed rank is noticed, and its log ends with its last complete line (it used to lose its
// buffered tail: 0 bytes after 300 s).
TEST(DistHeartbeat, KilledRankIsNamedAndItsLogEndsWithACompleteLine) {
  TempDir dir;
  const Noticed n = lose_a_rank(dir, 1, SIGKILL);
  EXPECT_EQ(n.code, kExitError) << n.log;
  EXPECT_TRUE(contains_all(n.log, {"rank 0: "})) << n.log;
  EXPECT_LT(n.seconds, 8) << n.log;
  const std::string killed = read_file(dir / "run/logs/rank1.log");
  EXPECT_TRUE(contains_all(killed, {"distributed: rank 1 of 2", "checkpoint: "})) << killed;
  ASSERT_FALSE(killed.empty());
  EXPECT_EQ(killed.back(), '\n');
}

// Runs in a spawned process only: logs a line longer than stdio's 4 KiB buffer, then SIGKILLs
// itself.
TEST(RankLog, DISABLED_KilledWriter) {
  logging::init({"info", 1, std::getenv("XLME_LOG_DIR")});
  spdlog::info("first");
  spdlog::info("long {}", std::string(5000, 'x'));
  std::raise(SIGKILL);
}

TEST(RankLog, KilledRankKeepsEveryLineWhole) {
  TempDir dir;
  const pid_t pid =
      testing::spawn_self("RankLog.DISABLED_KilledWriter", {{"XLME_LOG_DIR", dir / "logs"}});
  EXPECT_EQ(wait_code(pid, 60), 128 + SIGKILL);
  const std::string log = read_file(dir / "logs/rank1.log");
  EXPECT_TRUE(contains_all(log, {"first\n", "long " + std::string(5000, 'x') + "\n"}))
      << log.size();
}

}  // namespace
}  // namespace xlme
