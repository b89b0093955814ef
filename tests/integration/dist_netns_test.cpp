// Two hosts in one machine: two network namespaces joined by a veth pair, a Gloo rank of the tiny
// model in each. The link cut mid-run is noticed by both ranks within the heartbeat, the last
// checkpoint stays intact, and the run resumed from it ends bit-identical to an uninterrupted
// run; a host name that resolves to a loopback address (Debian's 127.0.1.1) is named with the fix.
// Skipped, with the reason, where namespaces cannot be made (no root, no iproute2).
#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/common/exit_codes.h"

#include "fault_fixtures.h"
#include "test_util.h"

#include <chrono>
#include <csignal>
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

// Two namespaces "xlme<pid>a" and "...b", the veth ends "xa<pid>" (10.213.0.1/24) and "xb<pid>"
// (10.213.0.2/24), removed with everything in them at scope exit.
class NamespacePair {
 public:
  NamespacePair() {
    const std::string id = std::to_string(::getpid());
    for (const char side : {'a', 'b'}) {
      ns_.push_back("xlme" + id + side);
      veth_.push_back(std::string("x") + side + id);
    }
    const std::string steps[] = {
        "ip netns add " + ns_[0],
        "ip netns add " + ns_[1],
        "ip link add " + veth_[0] + " netns " + ns_[0] + " type veth peer name " + veth_[1] +
            " netns " + ns_[1],
        in(0, "ip addr add " + address(0) + "/24 dev " + veth_[0]),
        in(1, "ip addr add " + address(1) + "/24 dev " + veth_[1]),
        in(0, "ip link set lo up"),
        in(1, "ip link set lo up"),
        in(0, "ip link set " + veth_[0] + " up"),
        in(1, "ip link set " + veth_[1] + " up"),
    };
    for (const auto& step : steps) {
      if (std::system((step + " >/dev/null 2>" + quote(scratch_ / "err")).c_str()) != 0) {
        why_ = "cannot make two network namespaces: '" + step + "' failed (" +
               read_file(scratch_ / "err") + "); needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and " +
               "iproute2 (scripts/install_packages.sh iproute2)";
        return;
      }
    }
  }
  ~NamespacePair() {
    for (const auto& ns : ns_) {
      std::system(("ip netns del " + ns + " 2>/dev/null").c_str());
      std::error_code ec;
      fs::remove_all("/etc/netns/" + ns, ec);
    }
  }
  NamespacePair(const NamespacePair&) = delete;
  NamespacePair& operator=(const NamespacePair&) = delete;

  const std::string& skipped() const { return why_; }
  // `command` run inside side `side` (0 or 1).
  std::string in(int side, const std::string& command) const {
    return "ip netns exec " + ns_[side] + " " + command;
  }
  std::string address(int side) const { return side == 0 ? "10.213.0.1" : "10.213.0.2"; }
  const std::string& veth(int side) const { return veth_[side]; }
  const std::string& ns(int side) const { return ns_[side]; }

 private:
  TempDir scratch_;
  std::vector<std::string> ns_, veth_;
  std::string why_;
};

std::vector<std::string> netns_run_args(const std::string& out_dir, int64_t steps) {
  return tiny_pretrain_args(out_dir, steps,
                            {"--set", "dist.startup_timeout_s=30", "--set", "dist.heartbeat_s=2",
                             "--set", "train.tokens_per_task=128"});
}

std::string args_text(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += " " + quote(a);
  return out;
}

// Starts both ranks, rank r in side r, with `prefix(r)` before the binary.
std::vector<pid_t> start_ranks(const NamespacePair& net, const std::vector<std::string>& args,
                               const TempDir& dir, const std::string& tag,
                               const std::function<std::string(int)>& prefix) {
  const std::string port = std::to_string(testing::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string env = "env WORLD_SIZE=2 RANK=" + std::to_string(rank) +
                            " MASTER_ADDR=" + net.address(0) + " MASTER_PORT=" + port;
    pids.push_back(
        start_shell(prefix(rank) + env + " " + quote(pretrain_binary()) + args_text(args),
                    dir / (tag + std::to_string(rank))));
  }
  return pids;
}

std::string newest_valid_checkpoint(const std::string& run) {
  std::string newest;
  for (const auto& entry : fs::directory_iterator(run + "/checkpoints")) {
    const std::string path = entry.path().string();
    if (entry.path().filename().string().rfind("step_", 0) == 0 && verifies(path) &&
        path > newest) {
      newest = path;
    }
  }
  return newest;
}

TEST(DistNetns, LinkCutIsNoticedByBothRanksAndTheResumeIsBitIdentical) {
  NamespacePair net;
  if (!net.skipped().empty()) GTEST_SKIP() << net.skipped();
  TempDir dir;
  constexpr int64_t kSteps = 30;
  auto in_side = [&](int rank) {
    return "ip netns exec " + net.ns(rank) + " env GLOO_SOCKET_IFNAME=" + net.veth(rank) + " ";
  };

  const std::string run = dir / "run";
  std::vector<pid_t> pids = start_ranks(net, netns_run_args(run, kSteps), dir, "cut", in_side);
  bool progressed = false;
  for (int i = 0; i < 3000 && !progressed; ++i) {
    progressed = testing::newest_checkpoint_step(run) >= 3;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(progressed) << read_file(dir / "cut0");
  const auto cut = Clock::now();
  ASSERT_EQ(std::system(net.in(1, "ip link set " + net.veth(1) + " down").c_str()), 0);
  for (int rank = 0; rank < 2; ++rank) {
    const int code = wait_code(pids[rank], 60);
    const double seconds = std::chrono::duration<double>(Clock::now() - cut).count();
    const std::string log = read_file(dir / ("cut" + std::to_string(rank)));
    std::cout << "rank " << rank << " noticed the cut link after " << seconds << " s\n";
    EXPECT_EQ(code, kExitError) << log;
    EXPECT_TRUE(contains_all(log, {"dist.heartbeat_s = 2"})) << log;
    EXPECT_LT(seconds, 10) << log;
  }
  const std::string last = newest_valid_checkpoint(run);
  ASSERT_FALSE(last.empty());
  std::cout << "last checkpoint before the cut: " << last << "\n";

  // The link back, the same command resumes and finishes.
  ASSERT_EQ(std::system(net.in(1, "ip link set " + net.veth(1) + " up").c_str()), 0);
  pids = start_ranks(net, netns_run_args(run, kSteps), dir, "resume", in_side);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wait_code(pids[rank], 120), kExitOk)
        << read_file(dir / ("resume" + std::to_string(rank)));
  }
  EXPECT_TRUE(contains_all(read_file(run + "/logs/rank0.log"), {"resum"}));

  // The same two ranks uninterrupted, on loopback.
  const std::string reference = dir / "reference";
  pids = start_ranks(net, netns_run_args(reference, kSteps), dir, "reference",
                     [&](int) { return "ip netns exec " + net.ns(0) + " "; });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wait_code(pids[rank], 120), kExitOk)
        << read_file(dir / ("reference" + std::to_string(rank)));
  }
  const auto resumed = checkpoint::read_module_archive(
      step_folder(run, kSteps) + "/" + checkpoint::kModelFile, uint64_t{1} << 30);
  const auto uninterrupted = checkpoint::read_module_archive(
      step_folder(reference, kSteps) + "/" + checkpoint::kModelFile, uint64_t{1} << 30);
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (const auto& [name, tensor] : uninterrupted) {
    ASSERT_TRUE(resumed.count(name)) << name;
    EXPECT_TRUE(torch::equal(resumed.at(name), tensor)) << name;
  }
}

// Each "host" maps its own name to 127.0.1.1, as Debian's /etc/hosts does (ip netns exec mounts
// /etc/netns/<ns>/hosts over /etc/hosts; unshare gives each its own host name). Gloo would announce
// the loopback address: one rank failed at once and the other waited 5 x dist.timeout_s. Both
// now fail at start naming the host, the address and the fix.
TEST(DistNetns, HostNameOnALoopbackAddressIsNamedWithTheFix) {
  NamespacePair net;
  if (!net.skipped().empty()) GTEST_SKIP() << net.skipped();
  if (std::system("command -v unshare >/dev/null") != 0) GTEST_SKIP() << "no unshare (util-linux)";
  TempDir dir;
  const std::string names[] = {"xlme-host-a", "xlme-host-b"};
  for (int side = 0; side < 2; ++side) {
    testing::write_file("/etc/netns/" + net.ns(side) + "/hosts",
                        "127.0.0.1 localhost\n127.0.1.1 " + names[side] + "\n" +
                            net.address(1 - side) + " " + names[1 - side] + "\n");
  }
  const auto start = Clock::now();
  const auto pids = start_ranks(net, netns_run_args(dir / "run", 5), dir, "log", [&](int rank) {
    return "ip netns exec " + net.ns(rank) + " unshare --uts sh -c 'hostname " + names[rank] +
           " && exec \"$0\" \"$@\"' ";
  });
  for (int rank = 0; rank < 2; ++rank) {
    const int code = wait_code(pids[rank], 60);
    const std::string log = read_file(dir / ("log" + std::to_string(rank)));
    EXPECT_EQ(code, kExitError) << log;
    EXPECT_TRUE(contains_all(log, {"rank " + std::to_string(rank) + " on host " + names[rank],
                                   "resolves to 127.0.1.1, a loopback address, but the job spans "
                                   "2 hosts",
                                   "GLOO_SOCKET_IFNAME", "/etc/hosts"}))
        << log;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << "both ranks stopped after " << seconds << " s\n";
  EXPECT_LT(seconds, 30);
}

}  // namespace
}  // namespace xlme
