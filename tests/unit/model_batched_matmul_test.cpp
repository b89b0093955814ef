// The attention's batched products: equal to torch::matmul (values and gradients) for the layouts
// attention hands over (heads' views, transposes, copies), on the fast path where it applies.
#include "xlme/model/batched_matmul.h"

#include "xlme/common/precision.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace xlme::model {
namespace {

// Values and both gradients of batched_matmul against torch::matmul on the same operands.
void expect_same_as_matmul(const std::function<torch::Tensor(const torch::Tensor&)>& make_a,
                           const std::function<torch::Tensor(const torch::Tensor&)>& make_b,
                           const torch::Tensor& a_base, const torch::Tensor& b_base,
                           const std::string& what, double alpha = 1.0) {
  auto a1 = a_base.clone().requires_grad_(), b1 = b_base.clone().requires_grad_();
  auto a2 = a_base.clone().requires_grad_(), b2 = b_base.clone().requires_grad_();
  const auto ours = batched_matmul(make_a(a1), make_b(b1), alpha);
  const auto reference = torch::matmul(make_a(a2) * alpha, make_b(b2));
  ASSERT_EQ(ours.sizes(), reference.sizes()) << what;
  EXPECT_TRUE(torch::allclose(ours, reference, 1e-12, 1e-12)) << what;
  const auto weights = torch::randn_like(reference);  // a non-uniform upstream gradient
  (ours * weights).sum().backward();
  (reference * weights).sum().backward();
  EXPECT_TRUE(torch::allclose(a1.grad(), a2.grad(), 1e-12, 1e-12)) << what;
  EXPECT_TRUE(torch::allclose(b1.grad(), b2.grad(), 1e-12, 1e-12)) << what;
}

TEST(BatchedMatmul, EqualsMatmulForTheLayoutsAttentionUses) {
  torch::manual_seed(0);
  const auto opts = torch::kFloat64;
  const int64_t batch = 2, heads = 3, length = 5, head_dim = 4;
  const auto identity = [](const torch::Tensor& t) { return t; };
  // Heads split from [B, T, H * d_k] as attention does: [B, H, T, d_k] views, leading dim H * d_k.
  const auto split = [&](const torch::Tensor& t) {
    return t.view({batch, length, heads, head_dim}).transpose(1, 2);
  };
  const auto split_transposed = [&](const torch::Tensor& t) { return split(t).transpose(-2, -1); };
  const auto x = torch::randn({batch, length, heads * head_dim}, opts);
  const auto y = torch::randn({batch, length, heads * head_dim}, opts);
  expect_same_as_matmul(split, split_transposed, x, y, "q k^T from head views");
  // The scores' scale as the product's factor (values and both gradients scaled).
  expect_same_as_matmul(split, split_transposed, x, y, "0.3 q k^T", 0.3);
  const auto probs = torch::randn({batch, heads, length, length}, opts);
  expect_same_as_matmul(identity, split, probs, y, "probs v");
  // Contiguous 3-D operands, and operands BLAS cannot read as they are (every other column).
  expect_same_as_matmul(identity, identity, torch::randn({4, 3, 6}, opts),
                        torch::randn({4, 6, 2}, opts), "contiguous");
  const auto every_other = [](const torch::Tensor& t) { return t.slice(-1, 0, t.size(-1), 2); };
  expect_same_as_matmul(every_other, identity, torch::randn({4, 3, 12}, opts),
                        torch::randn({4, 6, 2}, opts), "strided columns");
}

TEST(BatchedMatmul, TakesItsOwnPathForFloatCpuOnly) {
  const auto a = torch::randn({2, 3, 4}), b = torch::randn({2, 4, 5});
  EXPECT_TRUE(batched_matmul_fast_path(a, b));
  EXPECT_TRUE(batched_matmul_fast_path(a.to(torch::kFloat64), b.to(torch::kFloat64)));
  EXPECT_FALSE(batched_matmul_fast_path(a.to(torch::kBFloat16), b.to(torch::kBFloat16)));
  EXPECT_FALSE(batched_matmul_fast_path(a, b.to(torch::kFloat64)));
  EXPECT_FALSE(batched_matmul_fast_path(a, torch::randn({1, 4, 5})));  // would broadcast
  {
    AutocastScope autocast(torch::kCPU, /*enabled=*/true);  // autocast decides the dtype
    EXPECT_FALSE(batched_matmul_fast_path(a, b));
  }
}

TEST(BatchedMatmul, IsTheSameOnAnyThreadCount) {
  const int threads = at::get_num_threads();
  const auto a = torch::randn({16, 64, 32}), b = torch::randn({16, 32, 48});
  at::set_num_threads(1);
  const auto one = batched_matmul(a, b);
  at::set_num_threads(2);
  const auto two = batched_matmul(a, b);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, two));
  EXPECT_TRUE(torch::allclose(one, torch::matmul(a, b), 1e-5, 1e-5));
}

}  // namespace
}  // namespace xlme::model
