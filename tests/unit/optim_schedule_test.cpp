// Learning-rate schedule and AdamW parameter groups.
#include "xlme/optim/optimizer.h"
#include "xlme/optim/schedule.h"
#include "xlme/optim/transformers_schedule.h"

#include "test_util.h"

#include <torch/torch.h>

namespace xlme::optim {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

TEST(LinearSchedule, WarmsUpThenDecaysToZero) {
  const LinearSchedule s(/*peak=*/1e-3, /*warmup=*/4, /*total=*/10);
  // Hand-computed: (step + 1) / 4 during warm-up, then (10 - step) / 6.
  const double expected[] = {0.25e-3,      0.5e-3,   0.75e-3,  1e-3,     1e-3,
                             5e-4 * 5 / 3, 4e-3 / 6, 3e-3 / 6, 2e-3 / 6, 1e-3 / 6};
  for (int step = 0; step < 10; ++step) EXPECT_NEAR(s.lr(step), expected[step], 1e-15) << step;
  EXPECT_EQ(s.lr(10), 0.0);
  EXPECT_EQ(s.lr(50), 0.0);
  const LinearSchedule constant(2.0, 0, 1);
  EXPECT_EQ(constant.lr(0), 2.0);
  EXPECT_TRUE(contains_all(error_message([] { LinearSchedule(1.0, 11, 10); }),
                           {"warm-up 11 must be in [0, total steps 10]"}));
}

// Values of transformers' get_linear_schedule_with_warmup read from an AdamW's lr before each
// optimizer.step(); scheduler.step() pair (as XTREME's run_*.py step them), printed by the
// project's venv.
TEST(TransformersLinearSchedule, MatchesGetLinearScheduleWithWarmup) {
  const TransformersLinearSchedule s(/*peak=*/1e-3, /*warmup=*/4, /*total=*/10);
  const double expected[] = {0.0,
                             0.00025,
                             0.0005,
                             0.00075,
                             0.001,
                             0.0008333333333333334,
                             0.0006666666666666666,
                             0.0005,
                             0.0003333333333333333,
                             0.00016666666666666666,
                             0.0,
                             0.0};
  for (int step = 0; step < 12; ++step) EXPECT_NEAR(s.lr(step), expected[step], 1e-18) << step;
  // A warm-up of 500 in a 3-step run is not cut: the run ends at 2 / 500 of the peak.
  const TransformersLinearSchedule long_warmup(3e-5, 500, 3);
  const double long_expected[] = {0.0, 6.000000000000001e-08, 1.2000000000000002e-07,
                                  1.8000000000000002e-07};
  for (int step = 0; step < 4; ++step) {
    EXPECT_NEAR(long_warmup.lr(step), long_expected[step], 1e-20) << step;
  }
  // Warm-up as long as the run: [0, 1/3, 2/3] of the peak; no warm-up: [1, 2/3, 1/3].
  const TransformersLinearSchedule whole(1.0, 3, 3), none(2.0, 0, 3);
  const double whole_expected[] = {0.0, 0.3333333333333333, 0.6666666666666666, 0.0};
  const double none_expected[] = {2.0, 1.3333333333333333, 0.6666666666666666, 0.0};
  for (int step = 0; step < 4; ++step) {
    EXPECT_NEAR(whole.lr(step), whole_expected[step], 1e-15) << step;
    EXPECT_NEAR(none.lr(step), none_expected[step], 1e-15) << step;
  }
  EXPECT_TRUE(contains_all(error_message([] { TransformersLinearSchedule(1.0, -1, 10); }),
                           {"warm-up -1 must be >= 0 and total steps 10 > 0"}));
}

TEST(AdamW, DecaysMatricesButNotBiasesOrNorms) {
  torch::nn::Linear linear(3, 2);
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({2}));
  std::vector<torch::Tensor> params = linear->parameters();
  for (const auto& p : norm->parameters()) params.push_back(p);
  config::TrainConfig train;
  train.lr = 0.1;
  train.weight_decay = 0.5;
  auto optimizer = make_adamw(params, train);
  ASSERT_EQ(optimizer->param_groups().size(), 2u);
  EXPECT_EQ(optimizer->param_groups()[0].params().size(), 1u);  // linear.weight
  EXPECT_EQ(optimizer->param_groups()[1].params().size(), 3u);  // biases, LayerNorm gain/bias

  // With zero gradients Adam's update is 0: only the decoupled decay moves a parameter,
  // by a factor (1 - lr * weight_decay) = 0.95.
  std::vector<torch::Tensor> before;
  for (auto& p : params) {
    before.push_back(p.detach().clone());
    p.mutable_grad() = torch::zeros_like(p);
  }
  optimizer->step();
  EXPECT_TRUE(torch::allclose(params[0], before[0] * 0.95));
  for (std::size_t i = 1; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i]));

  set_learning_rate(*optimizer, 0.25);
  for (auto& group : optimizer->param_groups()) EXPECT_EQ(group.options().get_lr(), 0.25);
}

}  // namespace
}  // namespace xlme::optim
