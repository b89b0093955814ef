// Dropout's CPU path: the counter-based keep mask (rate, scale, independence of neighbouring
// elements, seeding from LibTorch's generator, thread count) and its gradient; the switch that
// turns it off (XLME_OPS, ops/registry.h).
#include "xlme/ops/dropout.h"

#include "xlme/ops/registry.h"

#include "test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>

namespace xlme::ops {
namespace {

using xlme::testing::error_message;

TEST(Dropout, DropsTheRateAskedAndScalesTheRest) {
  constexpr double kP = 0.1;
  const auto mask = dropout_mask({1000, 1000}, kP, /*seed=*/42, torch::kFloat32);
  const double dropped = (mask == 0).to(torch::kDouble).mean().item<double>();
  // 10^6 Bernoulli(0.1) draws: standard deviation 3e-4; 5 of them.
  EXPECT_NEAR(dropped, kP, 0.0015);
  const auto kept = mask.masked_select(mask != 0);
  EXPECT_TRUE(torch::all(kept == static_cast<float>(1.0 / (1.0 - kP))).item<bool>());
}

TEST(Dropout, NeighbouringElementsAreIndependent) {
  // Elements 2k and 2k + 1 take the two halves of one 64-bit draw: both dropped must have
  // probability p^2, and an element must not predict the next pair's.
  constexpr double kP = 0.3;
  const auto dropped = (dropout_mask({1000000}, kP, 7, torch::kFloat32) == 0).to(torch::kDouble);
  const auto pairs = dropped.view({-1, 2});
  const double both = (pairs.select(1, 0) * pairs.select(1, 1)).mean().item<double>();
  EXPECT_NEAR(both, kP * kP, 0.002);  // sd ~4e-4 over 5e5 pairs
  const double across =
      (dropped.slice(0, 1, -1, 2) * dropped.slice(0, 2, 1000000, 2)).mean().item<double>();
  EXPECT_NEAR(across, kP * kP, 0.002);
}

TEST(Dropout, SeedDecidesTheMaskWhateverTheThreadCount) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = dropout_mask({333, 777}, 0.1, 123, torch::kFloat32);
  at::set_num_threads(2);
  const auto two = dropout_mask({333, 777}, 0.1, 123, torch::kFloat32);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, two));
  EXPECT_FALSE(torch::equal(one, dropout_mask({333, 777}, 0.1, 124, torch::kFloat32)));
}

TEST(Dropout, ManualSeedReproducesTheMasks) {
  const auto x = torch::ones({64, 64});
  torch::manual_seed(5);
  const auto a = ops::dropout(x, 0.2, /*training=*/true);
  const auto b = ops::dropout(x, 0.2, true);
  torch::manual_seed(5);
  EXPECT_TRUE(torch::equal(a, ops::dropout(x, 0.2, true)));
  EXPECT_FALSE(torch::equal(a, b));  // the next call draws a new seed
}

TEST(Dropout, GradientIsTheMaskTimesTheScale) {
  const auto x = torch::randn({50, 40}, torch::requires_grad());
  const auto y = ops::dropout(x, 0.25, true);
  y.sum().backward();
  const auto kept = (y != 0).to(torch::kFloat32);
  EXPECT_TRUE(torch::allclose(x.grad(), kept / 0.75));
  EXPECT_TRUE(torch::allclose(y, x.detach() * kept / 0.75));
}

TEST(Dropout, EvaluationAndZeroRateLeaveTheInputAndBf16StaysBf16) {
  const auto x = torch::randn({8, 8});
  EXPECT_TRUE(ops::dropout(x, 0.1, /*training=*/false).is_same(x));
  EXPECT_TRUE(ops::dropout(x, 0.0, true).is_same(x));
  EXPECT_EQ(ops::dropout(x.to(torch::kBFloat16), 0.1, true).scalar_type(), torch::kBFloat16);
}

TEST(Dropout, RejectsARateOfOne) {
  EXPECT_EQ(error_message([] { dropout_mask({4}, 1.0, 0, torch::kFloat32); }),
            "dropout probability must be in [0, 1), got 1");
}

// The mask of each call is dropout_mask's with a seed drawn from LibTorch's default generator.
TEST(Dropout, TheSeedComesFromLibTorchsGenerator) {
  const auto x = torch::ones({40, 30});
  torch::manual_seed(17);
  const auto dropped = ops::dropout(x, 0.3, /*training=*/true);
  torch::manual_seed(17);
  const uint64_t seed =
      at::detail::getDefaultCPUGenerator().get<at::CPUGeneratorImpl>()->random64();
  EXPECT_TRUE(torch::equal(dropped, dropout_mask({40, 30}, 0.3, seed, torch::kFloat32)));
}

// Restores the default choices when a test that changed them ends.
struct OpsRestored {
  ~OpsRestored() { set_ops(""); }
};

TEST(OpsRegistry, WithDropoutReferenceItIsLibTorchsDropout) {
  const OpsRestored restore;
  const auto x = torch::randn({64, 50});
  const torch::Device cpu(torch::kCPU);
  for (const std::string spec : {"reference", "dropout=reference", "fused,dropout=reference"}) {
    set_ops(spec);
    EXPECT_EQ(implementation(Op::kDropout, cpu), Impl::kReference) << spec;
    torch::manual_seed(8);
    const auto ours = ops::dropout(x, 0.2, /*training=*/true);
    torch::manual_seed(8);
    EXPECT_TRUE(torch::equal(ours, torch::dropout(x, 0.2, /*train=*/true))) << spec;
  }
  for (const std::string spec : {"auto", "fused", "dropout=fused", "reference,dropout=auto", ""}) {
    set_ops(spec);
    EXPECT_EQ(implementation(Op::kDropout, cpu), Impl::kFused) << spec;
  }
}

TEST(OpsRegistry, AFusedFormRunsOnlyWhereOneExists) {
  const OpsRestored restore;
  const torch::Device cpu(torch::kCPU), cuda(torch::kCUDA, 0);
  set_ops("fused");
  EXPECT_EQ(implementation(Op::kMaskedLm, cpu), Impl::kReference);  // no CPU kernel
  EXPECT_EQ(implementation(Op::kMaskedLm, cuda), Impl::kFused);
  EXPECT_EQ(implementation(Op::kDropout, cuda), Impl::kReference);  // no CUDA kernel
  // auto: the CUDA kernels a GPU run showed correct and faster in the Base step; the fused
  // attention (correct, slower than SDPA) and weight_grad stay off.
  set_ops("auto");
  EXPECT_EQ(implementation(Op::kMaskedLm, cuda), Impl::kFused);
  EXPECT_EQ(implementation(Op::kToeplitzBias, cuda), Impl::kFused);
  EXPECT_EQ(implementation(Op::kToeplitzBias, cpu), Impl::kReference);
  EXPECT_EQ(implementation(Op::kResidualLayerNorm, cuda), Impl::kFused);
  EXPECT_EQ(implementation(Op::kFeedForward, cuda), Impl::kFused);
  EXPECT_EQ(implementation(Op::kAttention, cuda), Impl::kReference);
  EXPECT_EQ(describe(cpu),
            "dropout=fused (cpu kernel), masked_lm=reference, residual_layernorm=reference, "
            "attention=reference, toeplitz_bias=reference, feed_forward=reference, "
            "linear=fused (bf16 emulation), weight_grad=fused (in-place fp32 product)");
  set_ops("masked_lm=fused,residual_layernorm=reference");
  EXPECT_EQ(describe(cuda),
            "dropout=reference, masked_lm=fused (triton), residual_layernorm=reference, "
            "attention=reference, toeplitz_bias=fused (one-hot backward), "
            "feed_forward=fused (triton), linear=reference, weight_grad=reference");
}

TEST(OpsRegistry, WhileGraphsLiveAutoKeepsTheRandomOpsACaptureCanHold) {
  const OpsRestored restore;
  const torch::Device cpu(torch::kCPU), cuda(torch::kCUDA, 0);
  set_ops("auto");
  {
    const GraphSafeOps outer;
    {
      const GraphSafeOps inner;
      // The fused random forms not yet checked inside a graph give way to the references ...
      EXPECT_EQ(implementation(Op::kMaskedLm, cuda), Impl::kReference);
      EXPECT_EQ(implementation(Op::kResidualLayerNorm, cuda), Impl::kReference);
      EXPECT_EQ(implementation(Op::kAttention, cuda), Impl::kReference);
      // ... the others stay, and the CPU's choices do not change.
      EXPECT_EQ(implementation(Op::kFeedForward, cuda), Impl::kFused);
      EXPECT_EQ(implementation(Op::kToeplitzBias, cuda), Impl::kFused);
      EXPECT_EQ(implementation(Op::kDropout, cpu), Impl::kFused);
    }
    EXPECT_EQ(implementation(Op::kMaskedLm, cuda), Impl::kReference);  // the outer one lives
    // An explicit choice stands (the kernels read the generator on the device in a capture).
    set_ops("masked_lm=fused");
    EXPECT_EQ(implementation(Op::kMaskedLm, cuda), Impl::kFused);
    set_ops("auto");
  }
  EXPECT_EQ(implementation(Op::kMaskedLm, cuda), Impl::kFused);
}

TEST(OpsRegistry, ModelAttentionAutoIsSdpaOnCudaAndTheMathPathOnTheCpu) {
  EXPECT_TRUE(sdpa_by_default(torch::Device(torch::kCUDA, 0)));
  EXPECT_FALSE(sdpa_by_default(torch::Device(torch::kCPU)));
}

TEST(OpsRegistry, AnUnknownNameOrValueListsTheValidOnes) {
  const OpsRestored restore;
  EXPECT_EQ(error_message([] { set_ops("dropout=reference,sampler=fused"); }),
            "XLME_OPS: unknown op 'sampler' in 'dropout=reference,sampler=fused'; the ops are "
            "dropout, masked_lm, residual_layernorm, attention, toeplitz_bias, feed_forward, "
            "linear, weight_grad");
  EXPECT_EQ(error_message([] { set_ops("masked_lm=fast"); }),
            "XLME_OPS: 'fast' in 'masked_lm=fast' is not auto, reference or fused");
}

}  // namespace
}  // namespace xlme::ops
