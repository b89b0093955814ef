// Launcher environments: torchrun, SLURM (with its compressed node lists), none, and the errors;
// the address the rendezvous store listens on.
#include "xlme/dist/communicator.h"
#include "xlme/dist/launch.h"

#include "test_util.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace xlme::dist {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

// Sets exactly `vars` among the launcher variables for the test's duration.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                             "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST",
                             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"}) {
      unsetenv(name);
    }
  }
  static void set(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) setenv(name.c_str(), value.c_str(), 1);
  }
};

TEST(SlurmNodeList, FirstHost) {
  const std::pair<const char*, const char*> table[] = {
      {"node01", "node01"},
      {"node[01-04]", "node01"},
      {"gpu[07-12,20],cpu1", "gpu07"},
      {"gpu[3,5-7]", "gpu3"},
      {"a-b[001-010]", "a-b001"},
      {"n1,n2,n3", "n1"},
      {"r[1-2]n[3-4]", "r1n3"},
      {"dgx-a100-[0012-0015].cluster", "dgx-a100-0012.cluster"},
  };
  for (const auto& [list, host] : table) EXPECT_EQ(first_slurm_host(list), host) << list;
  EXPECT_TRUE(contains_all(error_message([] { first_slurm_host("gpu[1-2"); }),
                           {"SLURM_JOB_NODELIST='gpu[1-2': unbalanced '['"}));
  EXPECT_TRUE(contains_all(error_message([] { first_slurm_host(""); }), {"names no host"}));
}

TEST_F(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "none");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
}

TEST_F(LaunchEnv, Torchrun) {
  set({{"RANK", "5"},
       {"WORLD_SIZE", "16"},
       {"LOCAL_RANK", "1"},
       {"MASTER_ADDR", "10.0.0.7"},
       {"MASTER_PORT", "29400"},
       {"SLURM_PROCID", "9"}});  // torchrun's variables win
  const LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 16);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.7");
  EXPECT_EQ(info.master_port, 29400);
  EXPECT_FALSE(info.agent_store);
  EXPECT_EQ(info.restart_count, 0);
}

// torchrun's agent serves the store and says so; only Python's str(True) means yes.
TEST_F(LaunchEnv, TorchrunAgentStore) {
  set({{"RANK", "1"},
       {"WORLD_SIZE", "2"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", "29400"},
       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
       {"TORCHELASTIC_RESTART_COUNT", "2"}});
  LaunchInfo info = launch_info_from_env();
  EXPECT_TRUE(info.agent_store);
  EXPECT_EQ(info.restart_count, 2);
  set({{"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  EXPECT_FALSE(launch_info_from_env().agent_store);
  set({{"TORCHELASTIC_RESTART_COUNT", "-1"}});
  EXPECT_TRUE(contains_all(error_message([] { launch_info_from_env(); }),
                           {"TORCHELASTIC_RESTART_COUNT='-1' is not an integer"}));
}

TEST_F(LaunchEnv, Slurm) {
  set({{"SLURM_PROCID", "3"},
       {"SLURM_NTASKS", "8"},
       {"SLURM_LOCALID", "3"},
       {"SLURM_JOB_NODELIST", "gpu[12-13]"}});
  LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.master_addr, "gpu12");
  EXPECT_EQ(info.master_port, 29500);
  set({{"MASTER_ADDR", "head"}, {"MASTER_PORT", "1234"}});
  info = launch_info_from_env();
  EXPECT_EQ(info.master_addr, "head");
  EXPECT_EQ(info.master_port, 1234);
}

// Without MASTER_PORT, a SLURM job's port comes from its id: two jobs on one node get two ports
// (a fixed 29500 made the second job's ranks hang).
TEST_F(LaunchEnv, SlurmPortFromTheJobId) {
  set({{"SLURM_PROCID", "1"},
       {"SLURM_NTASKS", "2"},
       {"SLURM_JOB_NODELIST", "gpu[12-13]"},
       {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(launch_info_from_env().master_port, 15000 + 3456);
  set({{"SLURM_JOB_ID", "123457"}});
  EXPECT_EQ(launch_info_from_env().master_port, 15000 + 3457);
  set({{"SLURM_JOB_ID", "19999"}});
  EXPECT_EQ(launch_info_from_env().master_port, 34999);
  set({{"MASTER_PORT", "1234"}});  // the user's choice wins
  EXPECT_EQ(launch_info_from_env().master_port, 1234);
  unsetenv("MASTER_PORT");
  set({{"SLURM_JOB_ID", "12a"}});
  EXPECT_TRUE(
      contains_all(error_message([] { launch_info_from_env(); }),
                   {"SLURM launch: environment variable SLURM_JOB_ID='12a' is not an integer"}));
}

TEST_F(LaunchEnv, ErrorsNameTheVariable) {
  set({{"RANK", "0"}});
  EXPECT_TRUE(contains_all(error_message([] { launch_info_from_env(); }),
                           {"torchrun launch: environment variable WORLD_SIZE is not set"}));
  set({{"WORLD_SIZE", "2"}, {"RANK", "2"}});
  EXPECT_TRUE(contains_all(error_message([] { launch_info_from_env(); }),
                           {"RANK='2' is not an integer in [0, 1]"}));
  set({{"RANK", "1"}});
  EXPECT_TRUE(contains_all(error_message([] { launch_info_from_env(); }),
                           {"MASTER_ADDR is not set (WORLD_SIZE=2)"}));
  set({{"MASTER_ADDR", "x"}, {"MASTER_PORT", "http"}});
  EXPECT_TRUE(contains_all(error_message([] { launch_info_from_env(); }),
                           {"MASTER_PORT='http' is not an integer in [1, 65535]"}));
  clear();
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_TRUE(contains_all(error_message([] { launch_info_from_env(); }),
                           {"neither MASTER_ADDR nor SLURM_JOB_NODELIST is set"}));
}

// The device of a rank, for the two layouts one process per GPU comes in.
TEST(ResolveDevice, EveryGpuVisibleOrOnePerProcess) {
  LaunchInfo launch;
  launch.launcher = "slurm";
  launch.world_size = 16;
  launch.rank = 11;
  launch.local_rank = 3;
  // Every GPU of the node visible (torchrun, srun --gpus-per-node=8): the local rank's.
  EXPECT_EQ(resolve_device("auto", launch, 8), torch::Device(torch::kCUDA, 3));
  EXPECT_EQ(resolve_device("cuda", launch, 4), torch::Device(torch::kCUDA, 3));
  // One GPU visible per process (srun --gpus-per-task=1): cuda:0 whatever the local rank (the
  // old LOCAL_RANK % count happened to agree here, but cuda:LOCAL_RANK in the communicator did
  // not: "invalid device ordinal").
  EXPECT_EQ(resolve_device("auto", launch, 1), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(resolve_device("cuda", launch, 1), torch::Device(torch::kCUDA, 0));
  // No GPU, or the CPU asked for.
  EXPECT_EQ(resolve_device("auto", launch, 0), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("cpu", launch, 8), torch::Device(torch::kCPU));
}

TEST(ResolveDevice, ErrorsSayWhatDoesNotFit) {
  LaunchInfo launch;
  launch.launcher = "torchrun";
  launch.local_rank = 3;
  // Two GPUs visible for four local ranks: no silent sharing (LOCAL_RANK % 2 used to pick one).
  EXPECT_TRUE(contains_all(error_message([&] { resolve_device("auto", launch, 2); }),
                           {"local rank 3 (torchrun launch) has no GPU of its own",
                            "sees 2 GPUs, cuda:0..cuda:1", "--gpus-per-task=1"}));
  EXPECT_TRUE(contains_all(error_message([&] { resolve_device("cuda", launch, 0); }),
                           {"run.device is cuda but this process sees no CUDA device"}));
  EXPECT_TRUE(contains_all(error_message([&] { resolve_device("gpu", launch, 1); }),
                           {"run.device must be auto, cpu or cuda, not 'gpu'"}));
}

// The local addresses of the TCP sockets listening on `port`, from the kernel's tables
// (/proc/net/tcp and tcp6 print each 32-bit word of the address in host byte order).
std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state != "0A" || std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
      const std::string hex = local.substr(0, colon);  // 8 or 32 hex digits
      uint32_t words[4] = {};
      for (size_t w = 0; w < hex.size() / 8; ++w) {
        words[w] = static_cast<uint32_t>(std::stoul(hex.substr(8 * w, 8), nullptr, 16));
      }
      char text[INET6_ADDRSTRLEN] = {};
      ::inet_ntop(hex.size() == 8 ? AF_INET : AF_INET6, words, text, sizeof(text));
      found.emplace_back(text);
    }
  }
  return found;
}

// Two real ranks (threads of this process) rendezvous on 127.0.0.1 through c10d's TCP store and
// a Gloo group: rank 0's store listens on loopback alone, not on every interface ("::" or
// "0.0.0.0", what c10d binds by itself), while it serves them.
TEST(DistStore, ListensOnTheMasterAddressOnly) {
  LaunchInfo launch;
  launch.launcher = "torchrun";
  launch.world_size = 2;
  launch.master_addr = "127.0.0.1";
  launch.master_port = xlme::testing::free_port();
  std::shared_ptr<Communicator> ranks[2];
  std::string errors[2];
  auto join = [&](int rank) {
    LaunchInfo mine = launch;
    mine.rank = rank;
    try {
      ranks[rank] = Communicator::create(mine, torch::kCPU, "gloo", std::chrono::seconds(30));
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread one(join, 1);
  join(0);
  one.join();
  ASSERT_TRUE(ranks[0] && ranks[1]) << errors[0] << errors[1];
  const std::vector<std::string> addresses = listening_addresses(launch.master_port);
  ASSERT_FALSE(addresses.empty()) << "nothing listens on port " << launch.master_port;
  for (const auto& address : addresses) {
    EXPECT_TRUE(address == "127.0.0.1" || address == "::ffff:127.0.0.1")
        << "the store listens on " << address << " port " << launch.master_port;
  }
}

}  // namespace
}  // namespace xlme::dist
