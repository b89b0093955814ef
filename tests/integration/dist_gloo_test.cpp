// Two real processes on a real Gloo process group over loopback: all-reduce, broadcast, bucketed
// gradient averaging and parameter broadcast give what one process computes from both ranks'
// values, with rank 0 serving the store or torchrun's agent serving it; the start-up check names a
// rank that never joins.
#include "xlme/dist/communicator.h"

#include "test_util.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <fstream>

namespace xlme::dist {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::free_port;
using xlme::testing::read_file;
using xlme::testing::spawn_self;
using xlme::testing::TempDir;
using xlme::testing::wait_exit_code;

pid_t spawn_worker(const std::map<std::string, std::string>& vars) {
  return spawn_self("DistGloo.DISABLED_Worker", vars);
}

// Runs inside the spawned processes only (disabled for a normal test run).
TEST(DistGloo, DISABLED_Worker) {
  const std::string mode = std::getenv("XLME_DIST_MODE");
  std::ofstream result(std::getenv("XLME_DIST_RESULT"));
  const LaunchInfo launch = launch_info_from_env();
  if (mode == "missing") {
    try {
      Communicator::create(launch, torch::kCPU, "gloo", std::chrono::seconds(2));
      result << "created without the other rank";
    } catch (const xlme::Error& e) {
      result << e.what();
    }
    return;
  }
  const auto comm = Communicator::create(launch, torch::kCPU, "gloo", std::chrono::seconds(30));
  const int r = comm->rank();
  ASSERT_EQ(comm->world_size(), 2);

  std::vector<torch::Tensor> sums{torch::tensor({r + 1.0, 10.0 * (r + 1)}), torch::full({3}, r)};
  comm->all_reduce_sum(sums);
  EXPECT_TRUE(torch::equal(sums[0], torch::tensor({3.0, 30.0})));
  EXPECT_TRUE(torch::equal(sums[1], torch::full({3}, 1)));

  std::vector<torch::Tensor> from_one{r == 1 ? torch::arange(5.0) : torch::zeros({5})};
  comm->broadcast(from_one, /*root=*/1);
  EXPECT_TRUE(torch::equal(from_one[0], torch::arange(5.0)));

  // Gradients: rank r holds (r + 1) * i for parameter i; parameter 3 has no gradient on rank 0.
  // A 40-byte bucket limit splits the 3 x 4 + 5 + 2 x 2 + 1 floats into several collectives.
  std::vector<torch::Tensor> params{torch::zeros({3, 4}), torch::zeros({5}), torch::zeros({2, 2}),
                                    torch::zeros({1}, torch::kFloat64)};
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (r == 0 && i == 3) continue;
    params[i].mutable_grad() = torch::full_like(params[i], (r + 1.0) * (i + 1));
  }
  all_reduce_gradients(*comm, params, /*bucket_bytes=*/40, /*average=*/true);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), torch::full_like(params[i], 1.5 * (i + 1)))) << i;
  }
  EXPECT_TRUE(torch::equal(params[3].grad(), torch::full({1}, 4.0, torch::kFloat64)));

  // Host scalars and started sums: the communicator makes the tensors on its own device.
  EXPECT_EQ(comm->reduce_scalars({r + 1.0, -2.0 * r}, ScalarOp::kSum),
            (std::vector<double>{3.0, -2.0}));
  EXPECT_EQ(comm->reduce_scalars({r + 1.0, -2.0 * r}, ScalarOp::kMin),
            (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ(comm->reduce_scalars({r + 1.0, -2.0 * r}, ScalarOp::kMax),
            (std::vector<double>{2.0, 0.0}));
  PendingSum first = comm->start_sum(r == 1 ? 1.0 : 0.0);
  PendingSum second = comm->start_sum(10.0);
  EXPECT_TRUE(first.pending());
  EXPECT_EQ(second.get(), 20.0);  // read out of order: each sum is its own collective
  EXPECT_EQ(first.get(), 1.0);
  EXPECT_FALSE(first.pending());

  std::vector<torch::Tensor> weights{torch::full({4}, r + 7.0), torch::full({2, 3}, -r)};
  broadcast_tensors(*comm, weights, /*root=*/0);
  EXPECT_TRUE(torch::equal(weights[0], torch::full({4}, 7.0)));
  EXPECT_TRUE(torch::equal(weights[1], torch::zeros({2, 3}, torch::kLong)));
  comm->barrier();
  if (!::testing::Test::HasFailure()) result << "ok";
}

TEST(DistGloo, TwoProcessesAgreeWithTheCombinedComputation) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    pids.push_back(spawn_worker({{"RANK", std::to_string(rank)},
                                 {"WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", port},
                                 {"XLME_DIST_MODE", "collectives"},
                                 {"XLME_DIST_RESULT", dir / ("rank" + std::to_string(rank))}}));
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wait_exit_code(pids[rank]), 0) << "rank " << rank;
    EXPECT_EQ(read_file(dir / ("rank" + std::to_string(rank))), "ok") << "rank " << rank;
  }
}

// torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE=True) on MASTER_PORT: the
// ranks join it as clients (rank 0 used to fail with "MASTER_PORT ... is already taken"), twice
// on the same store as after a restart of the workers, each attempt under its own keys.
TEST(DistGloo, TwoProcessesJoinTorchrunsAgentStore) {
  TempDir dir;
  const int port = free_port();
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(30);
  const auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  for (const std::string attempt : {"0", "1"}) {
    std::vector<pid_t> pids;
    for (int rank = 0; rank < 2; ++rank) {
      pids.push_back(spawn_worker({{"RANK", std::to_string(rank)},
                                   {"WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", std::to_string(port)},
                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                   {"TORCHELASTIC_RESTART_COUNT", attempt},
                                   {"XLME_DIST_MODE", "collectives"},
                                   {"XLME_DIST_RESULT", dir / ("rank" + std::to_string(rank))}}));
    }
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(wait_exit_code(pids[rank]), 0) << "attempt " << attempt << ", rank " << rank;
      EXPECT_EQ(read_file(dir / ("rank" + std::to_string(rank))), "ok")
          << "attempt " << attempt << ", rank " << rank;
    }
    EXPECT_TRUE(agent->check({"xlme/attempt_" + attempt + "/xlme/alive/1"})) << attempt;
  }
}

TEST(DistGloo, StartupCheckNamesTheRankThatNeverJoins) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  const pid_t pid = spawn_worker({{"RANK", "0"},
                                  {"WORLD_SIZE", "2"},
                                  {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", port},
                                  {"XLME_DIST_MODE", "missing"},
                                  {"XLME_DIST_RESULT", dir / "rank0"}});
  EXPECT_EQ(wait_exit_code(pid), 0);
  EXPECT_TRUE(contains_all(
      read_file(dir / "rank0"),
      {"rank(s) 1 of 2 did not join the rendezvous at 127.0.0.1:" + port, "within 2 s"}));
}

TEST(DistGloo, OneProcessNeedsNoProcessGroup) {
  LaunchInfo single;
  const auto comm = Communicator::create(single, torch::kCPU, "gloo", std::chrono::seconds(1));
  std::vector<torch::Tensor> t{torch::ones({2})};
  comm->all_reduce_sum(t);
  comm->broadcast(t, 0);
  comm->barrier();
  EXPECT_TRUE(torch::equal(t[0], torch::ones({2})));
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->reduce_scalars({4.0, -1.0}, ScalarOp::kMax), (std::vector<double>{4.0, -1.0}));
  EXPECT_EQ(comm->start_sum(3.0).get(), 3.0);
}

// NCCL refuses tensors that are not on its GPU, Gloo takes CPU tensors whatever the device: a
// collective given a tensor on another device than the communicator's fails on every backend and
// with one process too, naming both devices, so that a CPU test catches what NCCL would refuse
// (resume_path once all-reduced a CPU tensor on every GPU run). The meta device stands in for a
// second device on a machine without a GPU.
TEST(DistGloo, ATensorOnAnotherDeviceIsRefusedNamingBoth) {
  const auto comm =
      Communicator::create(LaunchInfo{}, torch::kCPU, "gloo", std::chrono::seconds(1));
  std::vector<torch::Tensor> mixed{torch::ones({2}), torch::ones({3}, torch::Device(torch::kMeta))};
  EXPECT_TRUE(contains_all(error_message([&] { comm->all_reduce_sum(mixed); }),
                           {"all-reduce: tensor 1 of 2 is on meta",
                            "this communicator's collectives run on cpu (gloo)"}));
  EXPECT_TRUE(contains_all(error_message([&] { comm->broadcast(mixed, 0); }),
                           {"broadcast: tensor 1 of 2 is on meta"}));
  EXPECT_EQ(comm->device(), torch::Device(torch::kCPU));
  EXPECT_TRUE(contains_all(error_message([] {
                             Communicator::create(LaunchInfo{}, torch::kCPU, "nccl",
                                                  std::chrono::seconds(1));
                           }),
                           {"dist.backend=nccl needs CUDA tensors but this process runs on cpu"}));
}

}  // namespace
}  // namespace xlme::dist
