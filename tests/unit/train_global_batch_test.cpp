// The global batch: how many micro-batches each rank runs for train.tokens_per_task, rounded as
// train.batch_rounding says, and the error that names the world sizes that divide it.
#include "xlme/train/global_batch.h"

#include "test_util.h"

#include <vector>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

// Base (1,048,576 tokens per task in micro-batches of 16,384) on 24 GPUs is 2.67 micro-batches per
// rank: refused by default, naming the world sizes nearest to 24 that divide it and what rounding
// up (+12.5%) or down (-25%) would give.
TEST(GlobalBatch, ThatDoesNotDivideIsRefusedNamingTheNearestWorldSizes) {
  config::TrainConfig base;
  EXPECT_EQ(global_batch(base, 64).micro_batches, 1);
  EXPECT_EQ(global_batch(base, 8).micro_batches, 8);
  EXPECT_TRUE(contains_all(error_message([&] { global_batch(base, 24); }),
                           {"train.tokens_per_task = 1048576 is not a whole number of "
                            "micro-batches over 24 rank(s)",
                            "the world sizes nearest to 24 that divide it: 4, 8, 16, 32",
                            "up (3 per rank, 1179648 tokens per step, +12.5%)",
                            "down (2 per rank, 786432 tokens per step, -25.0%)"}));
  base.batch_rounding = "up";
  EXPECT_EQ(global_batch(base, 24).tokens_per_step, 1179648);
  EXPECT_EQ(global_batch(base, 40).tokens_per_step, 1310720);  // +25%
  base.batch_rounding = "down";
  EXPECT_EQ(global_batch(base, 48).tokens_per_step, 786432);
  EXPECT_TRUE(contains_all(error_message([&] { global_batch(base, 128); }),
                           {"rounding down leaves no micro-batch"}));
  base.batch_rounding = "error";
  EXPECT_EQ(world_sizes_with(base, 1048576, 24), (std::vector<int>{4, 8, 16, 32}));
  EXPECT_EQ(world_sizes_with(base, 1048576, 64, 2), (std::vector<int>{32, 64}));
}

}  // namespace
}  // namespace xlme::train
