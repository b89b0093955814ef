// The fused attention probabilities (position bias, softmax and dropout in one autograd function)
// against the unfused LibTorch operations with the same dropout mask (outputs and the gradients
// of scores, factor and table), in double and in float32 (the AVX2 row kernels).
#include "xlme/model/attention_probs.h"

#include "xlme/model/dropout.h"

#include "test_util.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace xlme::model {
namespace {

struct ProbsCase {
  torch::Tensor scores, factor, table, padding, projection;
};

// [B, H, T, T] scores with T odd (dropout's draw pairs straddle rows; rows are not a multiple of
// the kernels' 8 lanes); the last sequence has 3 padded keys.
ProbsCase make_case(torch::Dtype dtype, int64_t batch, int64_t heads, int64_t length) {
  torch::manual_seed(21);
  const auto opts = torch::TensorOptions().dtype(dtype);
  ProbsCase c;
  c.scores = 3 * torch::randn({batch, heads, length, length}, opts);
  c.factor = 1 + torch::rand({batch, heads, length, 1}, opts) * 2;
  c.table = torch::randn({heads, length, length}, opts);
  c.padding = torch::zeros({batch, length}, torch::kBool);
  c.padding[batch - 1].narrow(0, length - 3, 3).fill_(true);
  c.projection = torch::randn({batch, heads, length, length}, opts);
  return c;
}

// What math attention computed before the fusion: the bias and the padding added, softmax,
// model::dropout.
torch::Tensor unfused(const torch::Tensor& scores, const torch::Tensor& factor,
                      const torch::Tensor& table, const torch::Tensor& padding, double p,
                      bool training) {
  auto biased = scores;
  if (table.defined()) biased = biased + (factor.defined() ? factor * table : table);
  if (padding.defined()) {
    const auto minus_inf =
        torch::full({}, -std::numeric_limits<double>::infinity(), scores.options());
    biased =
        torch::where(padding.view({padding.size(0), 1, 1, padding.size(1)}), minus_inf, biased);
  }
  return xlme::model::dropout(torch::softmax(biased, -1), p, training);
}

struct Result {
  torch::Tensor out, dscores, dfactor, dtable;
};

template <typename F>
Result run(const ProbsCase& c, bool with_factor, bool with_table, bool with_padding, double p,
           bool training, F&& probs) {
  const auto scores = c.scores.detach().clone().requires_grad_(true);
  const auto factor = c.factor.detach().clone().requires_grad_(true);
  const auto table = c.table.detach().clone().requires_grad_(true);
  torch::manual_seed(99);  // the dropout seed: the same draw on both sides
  const auto out = probs(scores, with_table && with_factor ? factor : torch::Tensor(),
                         with_table ? table : torch::Tensor(),
                         with_padding ? c.padding : torch::Tensor(), p, training);
  (out * c.projection).sum().backward();
  const auto grad_or_zero = [](const torch::Tensor& t) {
    return t.grad().defined() ? t.grad() : torch::zeros_like(t);
  };
  return {out.detach(), scores.grad(), grad_or_zero(factor), grad_or_zero(table)};
}

// Largest difference within rtol of the reference's largest magnitude (float32 gradients such as
// dfactor = sum_j ds_j t_j cancel, so element-wise relative bounds would measure the summation
// order), plus atol.
::testing::AssertionResult close(const torch::Tensor& a, const torch::Tensor& b, double rtol,
                                 double atol) {
  const double diff = (a - b).abs().max().item<double>();
  const double scale = b.abs().max().item<double>();
  if (diff <= rtol * scale + atol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "largest difference " << diff << " at scale " << scale;
}

void expect_close(const Result& fused, const Result& reference, double rtol, double atol,
                  const std::string& where) {
  EXPECT_TRUE(close(fused.out, reference.out, rtol, atol)) << "output, " << where;
  EXPECT_TRUE(close(fused.dscores, reference.dscores, rtol, atol)) << "dscores, " << where;
  EXPECT_TRUE(close(fused.dfactor, reference.dfactor, rtol, atol)) << "dfactor, " << where;
  EXPECT_TRUE(close(fused.dtable, reference.dtable, rtol, atol)) << "dtable, " << where;
}

void compare_every_variant(torch::Dtype dtype, int64_t batch, int64_t heads, int64_t length,
                           double rtol, double atol) {
  const auto c = make_case(dtype, batch, heads, length);
  for (const bool with_table : {true, false}) {
    for (const bool with_factor : {true, false}) {
      if (!with_table && with_factor) continue;
      for (const bool with_padding : {true, false}) {
        for (const double p : {0.0, 0.25}) {
          for (const bool training : {true, false}) {
            const auto where = fmt::format("table {} factor {} padding {} p {} training {}",
                                           with_table, with_factor, with_padding, p, training);
            const auto fused = run(c, with_factor, with_table, with_padding, p, training,
                                   [](auto&&... a) { return attention_probs(a...); });
            const auto reference = run(c, with_factor, with_table, with_padding, p, training,
                                       [](auto&&... a) { return unfused(a...); });
            expect_close(fused, reference, rtol, atol, where);
            if (p > 0 && training) {
              // The mask is model::dropout's: zeros exactly where the reference has them.
              EXPECT_TRUE(torch::equal(fused.out.eq(0), reference.out.eq(0))) << where;
              const double dropped = fused.out.eq(0).to(torch::kDouble).mean().item<double>();
              EXPECT_GT(dropped, 0.15) << where;
            }
          }
        }
      }
    }
  }
}

TEST(AttentionProbs, EqualsTheUnfusedOperationsInDouble) {
  compare_every_variant(torch::kDouble, 2, 3, 13, 1e-13, 0.0);
}

// float32 takes the AVX2 row kernels and the polynomial exponential where the CPU has them; on 3
// threads the table's gradient is summed from per-thread partial tables.
TEST(AttentionProbs, EqualsTheUnfusedOperationsInFloat32) {
  const int threads = at::get_num_threads();
  at::set_num_threads(3);
  compare_every_variant(torch::kFloat32, 8, 4, 67, 4e-6, 0.0);  // 2,144 rows: several tasks
  at::set_num_threads(threads);
}

// Cross-attention (VECO): queries of one sequence over the keys of another, Tq != Tk, padded
// keys, no bias.
TEST(AttentionProbs, QueriesOverKeysOfAnotherLength) {
  torch::manual_seed(4);
  const auto scores = torch::randn({2, 3, 5, 11}, torch::kDouble).requires_grad_(true);
  auto padding = torch::zeros({2, 11}, torch::kBool);
  padding[0].narrow(0, 7, 4).fill_(true);
  const auto projection = torch::randn({2, 3, 5, 11}, torch::kDouble);
  torch::manual_seed(8);
  const auto fused = attention_probs(scores, {}, {}, padding, 0.25, true);
  const auto fused_grad = torch::autograd::grad({(fused * projection).sum()}, {scores})[0];
  torch::manual_seed(8);
  const auto reference = unfused(scores, {}, {}, padding, 0.25, true);
  const auto reference_grad = torch::autograd::grad({(reference * projection).sum()}, {scores})[0];
  EXPECT_TRUE(close(fused, reference, 1e-13, 0.0));
  EXPECT_TRUE(close(fused_grad, reference_grad, 1e-13, 0.0));
  const auto message = xlme::testing::error_message([&] {
    attention_probs(scores, {}, torch::zeros({3, 5, 5}, torch::kDouble), {}, 0.0, false);
  });
  EXPECT_NE(message.find("need a table [H, Tq, Tk]"), std::string::npos) << message;
  EXPECT_NE(message.find("[3, 5, 5]"), std::string::npos) << message;
}

TEST(AttentionProbs, ARowOfPaddedKeysIsNaNAsInSoftmax) {
  auto c = make_case(torch::kDouble, 2, 2, 5);
  c.padding[1].fill_(true);
  const auto out = attention_probs(c.scores, c.factor, c.table, c.padding, 0.0, false);
  EXPECT_TRUE(torch::isnan(out[1]).all().item<bool>());
  EXPECT_FALSE(torch::isnan(out[0]).any().item<bool>());
  EXPECT_TRUE(torch::allclose(out[0].sum(-1), torch::ones({2, 5}, torch::kDouble)));
}

TEST(AttentionProbs, TakesOnlyFloatCpuScoresOutsideAutocast) {
  const auto c = make_case(torch::kFloat32, 1, 1, 4);
  EXPECT_TRUE(attention_probs_fused(c.scores, c.factor, c.table));
  EXPECT_FALSE(
      attention_probs_fused(c.scores.to(torch::kBFloat16), torch::Tensor(), torch::Tensor()));
  EXPECT_FALSE(attention_probs_fused(c.scores, c.factor.to(torch::kDouble), c.table));
  EXPECT_FALSE(attention_probs_fused(c.scores.transpose(-1, -2), c.factor, c.table));
  const auto message = xlme::testing::error_message([&] {
    attention_probs(c.scores.to(torch::kBFloat16), torch::Tensor(), torch::Tensor(),
                    torch::Tensor(), 0.0, false);
  });
  EXPECT_NE(message.find("attention_probs takes contiguous float32 or float64 CPU scores"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("BFloat16"), std::string::npos) << message;
}

}  // namespace
}  // namespace xlme::model
