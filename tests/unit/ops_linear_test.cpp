// The model's products under bf16 CPU autocast on CPUs without fast bf16 products: float32
// products of bf16-rounded operands, rounded to bf16, equal (values and gradients) what LibTorch's
// own bf16 products give, within bf16's rounding.
#include "xlme/ops/linear.h"

#include "xlme/ops/registry.h"

#include "xlme/common/precision.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

namespace xlme::ops {
namespace {

// Relative distance of a from b, in float64.
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a64 = a.to(torch::kFloat64), b64 = b.to(torch::kFloat64);
  return ((a64 - b64).norm() / b64.norm()).item<double>();
}

TEST(Bf16Products, EmulatedLinearIsTheBf16ProductOfTheRoundedOperands) {
  torch::manual_seed(0);
  const auto x = torch::randn({4, 6, 32}), w = torch::randn({16, 32}), b = torch::randn({16});
  const auto out = bf16_emulated_linear(x, w, b);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  // The exact product of the rounded operands, rounded once to bf16.
  const auto exact =
      torch::linear(bf16_rounded(x).to(torch::kFloat64), bf16_rounded(w).to(torch::kFloat64),
                    bf16_rounded(b).to(torch::kFloat64));
  const auto ulp = exact.abs().to(torch::kFloat32) * std::ldexp(1.0, -7);  // one bf16 step
  EXPECT_TRUE(torch::all((out.to(torch::kFloat64) - exact).abs() <= ulp + 1e-6).item<bool>());
}

TEST(Bf16Products, EmulatedProductsMatchAutocastValuesAndGradients) {
  torch::manual_seed(1);
  const auto x0 = torch::randn({4, 6, 32}), w0 = torch::randn({16, 32}), b0 = torch::randn({16});
  const auto upstream = torch::randn({4, 6, 16});
  auto run = [&](bool emulated) {
    auto x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
         b = b0.clone().requires_grad_();
    torch::Tensor out;
    {
      AutocastScope autocast(torch::kCPU, /*enabled=*/true);
      out = emulated ? bf16_emulated_linear(x, w, b) : torch::linear(x, w, b);
    }
    (out.to(torch::kFloat32) * upstream).sum().backward();
    return std::vector<torch::Tensor>{out, x.grad(), w.grad(), b.grad()};
  };
  const auto ours = run(true), libtorch = run(false);
  EXPECT_EQ(ours[0].scalar_type(), libtorch[0].scalar_type());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_LT(relative_error(ours[i], libtorch[i]), 1e-2) << "output / dx / dw / db: " << i;
  }
  // The same for attention's batched products.
  const auto a = torch::randn({2, 3, 8, 16}), c = torch::randn({2, 3, 16, 8});
  torch::Tensor reference;
  {
    AutocastScope autocast(torch::kCPU, true);
    reference = torch::matmul(a, c);
  }
  const auto emulated = bf16_emulated_matmul(a, c);
  EXPECT_EQ(emulated.scalar_type(), torch::kBFloat16);
  EXPECT_LT(relative_error(emulated, reference), 1e-2);
}

TEST(Bf16Products, EmulatedOnlyUnderBf16AutocastOnCpusWithoutFastBf16) {
  const auto x = torch::randn({2, 4});
  EXPECT_FALSE(emulate_bf16_products(x));
  AutocastScope autocast(torch::kCPU, /*enabled=*/true);
  EXPECT_EQ(emulate_bf16_products(x), !cpu_has_fast_bf16_products());
  // The registry chooses: XLME_OPS linear=reference runs LibTorch's own bf16 products.
  set_ops("linear=reference");
  EXPECT_FALSE(emulate_bf16_products(x));
  set_ops("");
  EXPECT_EQ(emulate_bf16_products(x), !cpu_has_fast_bf16_products());
  // Whichever path runs, the layer's output is bf16 under autocast.
  EXPECT_EQ(linear(x, torch::randn({3, 4}), torch::randn({3})).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(batched_matmul(torch::randn({2, 3, 4}), torch::randn({2, 4, 5})).scalar_type(),
            torch::kBFloat16);
}

// Casts (aten::_to_copy) while `fn` runs.
int64_t casts_during(const std::function<void()>& fn) {
  static std::atomic<int64_t> casts{0};  // the callback is a plain function
  casts = 0;
  const auto counting = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& f)
                                     -> std::unique_ptr<at::ObserverContext> {
        if (std::string(f.name()) == "aten::_to_copy") ++casts;
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  fn();
  at::removeCallback(counting);
  return casts.load();
}

TEST(Bf16Products, StackedWeightsAreCastOncePerAutocastScope) {
  // Attention's query, key and value as one product under bf16 autocast: in a scope's second
  // micro-batch only the input is cast; the weights and biases come from autocast's cache (before,
  // their concatenation was a new tensor to cast in every micro-batch).
  for (const std::string ops : {"weight_grad=reference", "weight_grad=fused"}) {
    set_ops(ops);
    std::vector<torch::Tensor> weights, biases;
    for (int i = 0; i < 3; ++i) {
      weights.push_back(torch::randn({8, 8}).requires_grad_());
      biases.push_back(torch::randn({8}).requires_grad_());
      weights.back().mutable_grad() = torch::zeros({8, 8});
      biases.back().mutable_grad() = torch::zeros({8});
    }
    const auto x = torch::randn({2, 5, 8});
    AutocastScope autocast(torch::kCPU, /*enabled=*/true);
    const auto first = linear(x, weights, biases);
    EXPECT_EQ(first.scalar_type(), torch::kBFloat16) << ops;
    const auto second = casts_during([&] { linear(x, weights, biases).sum(); });
    EXPECT_EQ(second, 1) << ops << ": the input alone";
  }
  set_ops("");
}

}  // namespace
}  // namespace xlme::ops
