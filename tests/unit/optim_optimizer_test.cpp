// The multi-tensor AdamW (LibTorch's fused kernel) against LibTorch's per-parameter AdamW, and the
// gradient norm and clipping helpers against naive double-precision references.
#include "xlme/optim/optimizer.h"

#include "test_util.h"

#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cmath>

namespace xlme::optim {
namespace {

using xlme::testing::TempDir;

// Parameters of several shapes, in the two groups make_adamw builds (matrices decay, vectors do
// not); the same values for both optimizers.
std::vector<torch::Tensor> make_parameters() {
  torch::manual_seed(4);
  // [301, 229]: more than one parallel chunk of the fused kernel, and not a multiple of 8.
  return {torch::randn({5, 3}).requires_grad_(), torch::randn({7}).requires_grad_(),
          torch::randn({2, 4, 3}).requires_grad_(), torch::randn({1}).requires_grad_(),
          torch::randn({301, 229}).requires_grad_()};
}

std::vector<torch::Tensor> clone_parameters(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

config::TrainConfig adamw_settings() {
  config::TrainConfig train;
  train.lr = 3e-2;
  train.weight_decay = 0.1;
  train.adam_beta1 = 0.9;
  train.adam_beta2 = 0.98;
  train.adam_eps = 1e-6;
  return train;
}

// Gradients of step `step` (the same on both sides); parameter 3 has none on odd steps, so that
// its step count falls behind the others'.
void set_gradients(std::vector<torch::Tensor>& params, int step) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i == 3 && step % 2 == 1) {
      params[i].mutable_grad() = torch::Tensor();
      continue;
    }
    torch::manual_seed(100 + step * 10 + static_cast<int>(i));
    params[i].mutable_grad() = torch::randn_like(params[i]);
  }
}

TEST(MultiTensorAdamW, EqualsLibTorchsAdamWWithinRounding) {
  auto ours = make_parameters();
  auto reference = clone_parameters(ours);
  const auto train = adamw_settings();
  auto multi = make_adamw(ours, train);
  ASSERT_NE(dynamic_cast<MultiTensorAdamW*>(multi.get()), nullptr);
  // LibTorch's own AdamW with the same two groups.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : reference) (takes_weight_decay(p) ? decay : no_decay).push_back(p);
  auto options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(train.lr)
            .betas({train.adam_beta1, train.adam_beta2})
            .eps(train.adam_eps)
            .weight_decay(weight_decay));
  };
  groups.emplace_back(decay, options(train.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  torch::optim::AdamW libtorch(std::move(groups), torch::optim::AdamWOptions(train.lr));
  // LibTorch's fused kernel orders and fuses the operations its own way: equal to the loop within
  // float32 rounding, not bit for bit. Per element and step, the two may differ by one rounding
  // of the subtraction p - update (a unit in the last place of |p|, at most |p| 2^-23) and by the
  // roundings of the update itself, computed in a different order (the two bias corrections, the
  // square root with eps, the quotient: 4 x 2^-24 of its size), errors that the later steps carry
  // along. The budget adds both for each step, with the update's size as LibTorch applied it. A
  // wrong formula (a bias correction or the decoupled decay missed) moves them by 1e-3 or more.
  std::vector<torch::Tensor> budget;
  for (const auto& p : reference) budget.push_back(torch::zeros_like(p, torch::kDouble));
  for (int step = 0; step < 12; ++step) {
    set_gradients(ours, step);
    set_gradients(reference, step);
    const double lr = 3e-2 / (1 + step);
    set_learning_rate(*multi, lr);
    set_learning_rate(libtorch, lr);
    std::vector<torch::Tensor> before;
    for (const auto& p : reference) before.push_back(p.detach().to(torch::kDouble));
    multi->step();
    libtorch.step();
    for (std::size_t i = 0; i < reference.size(); ++i) {
      const auto update = (reference[i].detach().to(torch::kDouble) - before[i]).abs();
      budget[i] += before[i].abs() * std::ldexp(1.0, -23) + update * 4 * std::ldexp(1.0, -24);
    }
  }
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const auto error = (ours[i] - reference[i]).abs().to(torch::kDouble);
    const auto& allowed = budget[i];
    EXPECT_TRUE((error <= allowed).all().item<bool>())
        << "parameter " << i << ": worst excess " << (error - allowed).max().item<double>();
  }
}

// The checkpoint format is LibTorch's: a state saved by one optimizer continues in the other.
TEST(MultiTensorAdamW, StateRoundTripsThroughLibTorchsFormat) {
  const auto train = adamw_settings();
  auto a = make_parameters();
  auto first = make_adamw(a, train);
  for (int step = 0; step < 3; ++step) {
    set_gradients(a, step);
    first->step();
  }
  TempDir dir;
  torch::save(*first, dir / "optimizer.pt");
  auto b = clone_parameters(a);
  auto second = make_adamw(b, train);
  torch::load(*second, dir / "optimizer.pt");
  for (int step = 3; step < 6; ++step) {
    set_gradients(a, step);
    set_gradients(b, step);
    first->step();
    second->step();
  }
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

// On CUDA the fused kernel does the same arithmetic in another order: equal to the CPU's steps
// within float rounding.
TEST(MultiTensorAdamW, CudaStepsEqualTheCpuSteps) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device: the CUDA AdamW path is not run";
  const auto train = adamw_settings();
  auto cpu = make_parameters();
  std::vector<torch::Tensor> gpu;
  for (const auto& p : cpu) gpu.push_back(p.detach().to(torch::kCUDA).requires_grad_());
  auto on_cpu = make_adamw(cpu, train);
  auto on_gpu = make_adamw(gpu, train);
  for (int step = 0; step < 12; ++step) {
    set_gradients(cpu, step);
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      gpu[i].mutable_grad() =
          cpu[i].grad().defined() ? cpu[i].grad().to(torch::kCUDA) : torch::Tensor();
    }
    on_cpu->step();
    on_gpu->step();
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gpu[i].cpu(), cpu[i], /*rtol=*/1e-5, /*atol=*/1e-6)) << i;
  }
}

TEST(GradientNorm, EqualsTheDoublePrecisionNormAndClipsEveryGradient) {
  auto params = make_parameters();
  set_gradients(params, 1);  // parameter 3 without a gradient: left out
  ASSERT_FALSE(params[3].grad().defined());
  double squares = 0;
  std::vector<torch::Tensor> before;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    squares += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    before.push_back(p.grad().clone());
  }
  ASSERT_EQ(before.size(), params.size() - 1);
  const auto norm = gradient_norm(params);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_NEAR(norm.item<double>(), std::sqrt(squares), 1e-6 * std::sqrt(squares));
  scale_gradients(params, 0.25);
  std::size_t k = 0;
  for (const auto& p : params) {
    if (p.grad().defined()) {
      EXPECT_TRUE(torch::equal(p.grad(), before[k++] * 0.25));
    }
  }
  EXPECT_FALSE(params[3].grad().defined());
}

TEST(ClearGradients, DropsEveryGradientAndTheNextBackwardStartsFresh) {
  auto params = make_parameters();
  set_gradients(params, 0);
  clear_gradients(params);
  for (const auto& p : params) EXPECT_FALSE(p.grad().defined());
  // The next backward pass gives each reached parameter its own gradient, not one added to what
  // was there; a parameter the loss does not reach (3) stays without one.
  auto loss = (params[0] * 3.0).sum() + (params[4] * params[4]).sum();
  loss.backward();
  EXPECT_TRUE(torch::equal(params[0].grad(), torch::full_like(params[0], 3.0)));
  EXPECT_TRUE(torch::allclose(params[4].grad(), 2 * params[4].detach()));
  EXPECT_FALSE(params[1].grad().defined());
  EXPECT_FALSE(params[3].grad().defined());
}

}  // namespace
}  // namespace xlme::optim
