// Two trainer processes over Gloo on loopback, each with half of every micro-batch, end where one
// process with the combined batches ends: gradients are summed over ranks after normalizing by
// the counts of both.
#include "xlme/train/trainer.h"

#include "xlme/data/synthetic.h"

#include "export_fixtures.h"
#include "test_util.h"
#include "train_fixtures.h"

#include <torch/serialize.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <utility>

namespace xlme::train {
namespace {

using xlme::testing::read_file;
using xlme::testing::spawn_self;
using xlme::testing::TempDir;
using xlme::testing::wait_exit_code;

constexpr int kSteps = 3;

// XLME_TEACHER set: a distillation student of that teacher, without distill.hidden_cosine, so
// that its last layer's attention output and FFN get no gradient on any rank, and with a weight
// decay large enough to show in a few steps should those parameters be decayed.
config::Config two_rank_config(int64_t batch_per_rank) {
  // Two micro-batches per step over all ranks; argmax sampling and no dropout, so that the ranks'
  // random streams do not matter.
  auto c = xlme::testing::tiny_train_config(batch_per_rank, 1, 0.0);
  c.train.tokens_per_task = 2 * 2 * 2 * 16;  // 2 micro-batches x 2 ranks x 2 sequences x 16
  c.model.generator.sampling_temperature = 1e-6;
  if (const char* teacher = std::getenv("XLME_TEACHER")) {
    c.objectives.set = "distill";
    c.distill.teacher = teacher;
    c.distill.relation_heads = 4;
    c.train.weight_decay = 1.0;
  }
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

// Two spawned ranks train kSteps steps (XLME_TEACHER passed on when set) and rank 0 saves its
// model; one process trains the combined batches. Returns both models.
std::pair<model::ElectraModel, model::ElectraModel> two_ranks_and_one_process(const TempDir& dir) {
  const std::string port = std::to_string(xlme::testing::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, std::string> env{{"RANK", std::to_string(rank)},
                                           {"WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "127.0.0.1"},
                                           {"MASTER_PORT", port},
                                           {"XLME_TRAIN_RESULT", dir / "two_ranks.pt"}};
    if (const char* teacher = std::getenv("XLME_TEACHER")) env["XLME_TEACHER"] = teacher;
    pids.push_back(spawn_self("TrainDist.DISABLED_Worker", env));
  }
  for (const pid_t pid : pids) EXPECT_EQ(wait_exit_code(pid), 0);

  const auto c = two_rank_config(4);  // one process, micro-batches of both ranks' 2 + 2
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 21);
  Trainer single(c, xlme::testing::make_tiny_model(c, 100), source,
                 xlme::testing::single_process());
  EXPECT_EQ(single.micro_batches_per_task(), 2);
  for (int i = 0; i < kSteps; ++i) single.train_step();

  auto two_ranks = xlme::testing::make_tiny_model(c, 0);
  torch::load(two_ranks, dir / "two_ranks.pt");
  return {single.model(), two_ranks};
}

TEST(TrainDist, TwoRanksEqualOneProcessWithTheCombinedBatch) {
  TempDir dir;
  auto [single, two_ranks] = two_ranks_and_one_process(dir);
  xlme::testing::expect_same_parameters(single, two_ranks, 1e-6);
}

// The all-reduce gives every parameter a gradient, zeros where no rank had one; the trainer drops
// those again, so that AdamW's weight decay does not shrink what no rank trains (before the fix
// the two-rank student's last-layer FFN weights were decayed by lr x weight_decay each step).
TEST(TrainDist, ParametersWithoutAGradientOnEveryRankAreLeftAsWithOneProcess) {
  TempDir dir;
  xlme::testing::make_tiny_checkpoint(xlme::testing::tiny_train_config(2, 1, 0.0), dir / "teacher");
  ASSERT_EQ(setenv("XLME_TEACHER", (dir / "teacher").c_str(), 1), 0);
  auto [single, two_ranks] = two_ranks_and_one_process(dir);
  const auto initial = xlme::testing::make_tiny_model(two_rank_config(4), 100);
  unsetenv("XLME_TEACHER");
  xlme::testing::expect_same_parameters(single, two_ranks, 1e-6);
  // The untrained parameters kept their initial values on both sides.
  const auto start = initial->named_parameters();
  int untouched = 0;
  for (const auto& item : two_ranks->named_parameters()) {
    if (item.key().find("layers.0.ffn.") == std::string::npos) continue;
    EXPECT_TRUE(torch::equal(item.value(), start[item.key()])) << item.key();
    ++untouched;
  }
  EXPECT_EQ(untouched, 4);  // intermediate and output, weight and bias
}

}  // namespace
}  // namespace xlme::train
