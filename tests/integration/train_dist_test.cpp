// Two trainer processes over Gloo on loopback, each with half of every micro-batch, end where one
// process with the combined batches ends: gradients are summed over ranks after normalizing by
// the counts of both.
#include "xlme/train/trainer.h"

#include "xlme/data/synthetic.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/serialize.h>

#include <cstdlib>
#include <fstream>

namespace xlme::train {
namespace {

using xlme::testing::read_file;
using xlme::testing::spawn_self;
using xlme::testing::TempDir;
using xlme::testing::wait_exit_code;

constexpr int kSteps = 3;

config::Config two_rank_config(int64_t batch_per_rank) {
  // Two micro-batches per step over all ranks; argmax sampling and no dropout, so that the ranks'
  // random streams do not matter.
  auto c = xlme::testing::tiny_train_config(batch_per_rank, 1, 0.0);
  c.train.tokens_per_task = 2 * 2 * 2 * 16;  // 2 micro-batches x 2 ranks x 2 sequences x 16
  c.model.generator.sampling_temperature = 1e-6;
  return c;
}

// Runs inside the spawned ranks only.
TEST(TrainDist, DISABLED_Worker) {
  const auto launch = dist::launch_info_from_env();
  const auto comm =
      dist::Communicator::create(launch, torch::kCPU, "gloo", std::chrono::seconds(30));
  const auto c = two_rank_config(2);
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 2, 16, 0.15, 21,
                                comm->rank(), comm->world_size());
  // Different initial weights per rank: the trainer must broadcast rank 0's.
  Trainer trainer(c, xlme::testing::make_tiny_model(c, 100 + comm->rank()), source, comm);
  for (int i = 0; i < kSteps; ++i) trainer.train_step();
  if (comm->rank() == 0) torch::save(trainer.model(), std::getenv("XLME_TRAIN_RESULT"));
}

TEST(TrainDist, TwoRanksEqualOneProcessWithTheCombinedBatch) {
  TempDir dir;
  const std::string port = std::to_string(xlme::testing::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    pids.push_back(
        spawn_self("TrainDist.DISABLED_Worker", {{"RANK", std::to_string(rank)},
                                                 {"WORLD_SIZE", "2"},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", port},
                                                 {"XLME_TRAIN_RESULT", dir / "two_ranks.pt"}}));
  }
  for (const pid_t pid : pids) ASSERT_EQ(wait_exit_code(pid), 0);

  const auto c = two_rank_config(4);  // one process, micro-batches of both ranks' 2 + 2
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 21);
  Trainer single(c, xlme::testing::make_tiny_model(c, 100), source,
                 xlme::testing::single_process());
  ASSERT_EQ(single.micro_batches_per_task(), 2);
  for (int i = 0; i < kSteps; ++i) single.train_step();

  auto two_ranks = xlme::testing::make_tiny_model(c, 0);
  torch::load(two_ranks, dir / "two_ranks.pt");
  xlme::testing::expect_same_parameters(single.model(), two_ranks, 1e-6);
}

}  // namespace
}  // namespace xlme::train
