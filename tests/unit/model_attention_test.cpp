// Gated-bias attention against a naive loop over (i, j) (outputs and gradients), its gradients
// against central differences, the position bias function against naive loops in double and in
// bf16, and the SDPA kernel against the math kernel (LibTorch >= 2.0).
#include "xlme/model/attention.h"

#include <ATen/autocast_mode.h>
#include "xlme/model/relative_position.h"

#include "test_util.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace xlme::model {
namespace {

struct AttentionCase {
  torch::Tensor q, k, v;   // [B, H, T, d_k]
  torch::Tensor padding;   // [B, T] bool
  torch::Tensor d;         // [H, buckets]
  torch::Tensor u, gv, w;  // [H, d_k], [H, d_k], [H]
  torch::Tensor buckets;   // [T, T]
  int64_t length = 0;
};

AttentionCase make_case(int64_t batch, int64_t heads, int64_t length, int64_t head_dim) {
  torch::manual_seed(7);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  AttentionCase c;
  c.length = length;
  c.q = torch::randn({batch, heads, length, head_dim}, opts);
  c.k = torch::randn({batch, heads, length, head_dim}, opts);
  c.v = torch::randn({batch, heads, length, head_dim}, opts);
  c.padding = torch::zeros({batch, length}, torch::kBool);
  c.padding[batch - 1].narrow(0, length - 2, 2).fill_(true);  // last sequence: 2 pads
  c.d = torch::randn({heads, 8}, opts);
  c.u = torch::randn({heads, head_dim}, opts);
  c.gv = torch::randn({heads, head_dim}, opts);
  c.w = torch::randn({heads}, opts);
  c.buckets = relative_position_buckets(length, 8, 16, torch::kCPU);
  return c;
}

torch::Tensor run(const AttentionCase& c, bool relative, bool gated) {
  PositionBias bias;
  if (relative) bias.table = toeplitz_bias(c.d, c.buckets);
  if (relative && gated) {
    bias.gate_u = c.u;
    bias.gate_v = c.gv;
    bias.gate_w = c.w;
  }
  return attention(c.q, c.k, c.v, c.padding, bias, 0.0, false, AttentionKernel::kMath);
}

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// The formulas of docs/ARCHITECTURE.md#model, one (b, h, i, j) at a time.
torch::Tensor naive(const AttentionCase& c, bool relative, bool gated) {
  const int64_t batch = c.q.size(0), heads = c.q.size(1), length = c.q.size(2), dk = c.q.size(3);
  auto q = c.q.accessor<double, 4>(), k = c.k.accessor<double, 4>(), v = c.v.accessor<double, 4>();
  auto d = c.d.accessor<double, 2>(), u = c.u.accessor<double, 2>(),
       gv = c.gv.accessor<double, 2>();
  auto w = c.w.accessor<double, 1>();
  auto pad = c.padding.accessor<bool, 2>();
  auto out = torch::zeros_like(c.q);
  auto o = out.accessor<double, 4>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < length; ++i) {
        double qu = 0, qv = 0;
        for (int64_t x = 0; x < dk; ++x) {
          qu += q[b][h][i][x] * u[h][x];
          qv += q[b][h][i][x] * gv[h][x];
        }
        const double g_update = sigmoid(qu), g_reset = sigmoid(qv);
        std::vector<double> score(static_cast<size_t>(length));
        double top = -1e300;
        for (int64_t j = 0; j < length; ++j) {
          double s = 0;
          for (int64_t x = 0; x < dk; ++x) s += q[b][h][i][x] * k[b][h][j][x];
          s /= std::sqrt(static_cast<double>(dk));
          if (relative) {
            const double dist = d[h][relative_position_bucket(i - j, 8, 16)];
            s += gated ? dist * (1 + g_update + (1 - g_update) * w[h] * g_reset) : dist;
          }
          score[static_cast<size_t>(j)] = s;
          if (!pad[b][j]) top = std::max(top, s);
        }
        double total = 0;
        for (int64_t j = 0; j < length; ++j) {
          auto& s = score[static_cast<size_t>(j)];
          s = pad[b][j] ? 0.0 : std::exp(s - top);
          total += s;
        }
        for (int64_t j = 0; j < length; ++j) {
          for (int64_t x = 0; x < dk; ++x) {
            o[b][h][i][x] += score[static_cast<size_t>(j)] / total * v[b][h][j][x];
          }
        }
      }
    }
  }
  return out;
}

TEST(GatedAttention, MatchesNaiveLoopWithPadding) {
  const auto c = make_case(/*batch=*/2, /*heads=*/3, /*length=*/7, /*head_dim=*/4);
  for (const bool relative : {true, false}) {
    for (const bool gated : {true, false}) {
      EXPECT_TRUE(torch::allclose(run(c, relative, gated), naive(c, relative, gated), 1e-12, 1e-12))
          << "relative " << relative << " gated " << gated;
    }
  }
  // The three variants really differ.
  EXPECT_FALSE(torch::allclose(run(c, true, true), run(c, true, false)));
  EXPECT_FALSE(torch::allclose(run(c, true, false), run(c, false, false)));
}

// The formulas of docs/ARCHITECTURE.md#model with one autograd op per (b, h, i) or (b, h, i, j), so
// that autograd differentiates the naive loop itself. p: q, k, v, d, u, v_gate, w (as
// AttentionCase).
torch::Tensor naive_differentiable(const std::vector<torch::Tensor>& p,
                                   const torch::Tensor& padding, bool relative, bool gated) {
  const auto &q = p[0], &k = p[1], &v = p[2], &d = p[3], &u = p[4], &gv = p[5], &w = p[6];
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2), dk = q.size(3);
  auto pad = padding.accessor<bool, 2>();
  std::vector<torch::Tensor> rows;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < length; ++i) {
        const auto qi = q[b][h][i];
        const auto g_update = torch::sigmoid(qi.dot(u[h]));
        const auto g_reset = torch::sigmoid(qi.dot(gv[h]));
        const auto factor = 1 + g_update + (1 - g_update) * w[h] * g_reset;
        torch::Tensor numerator = torch::zeros({dk}, q.options()), total = torch::zeros({});
        for (int64_t j = 0; j < length; ++j) {
          if (pad[b][j]) continue;
          auto s = qi.dot(k[b][h][j]) / std::sqrt(static_cast<double>(dk));
          if (relative) {
            const auto dist = d[h][relative_position_bucket(i - j, 8, 16)];
            s = s + (gated ? dist * factor : dist);
          }
          const auto e = torch::exp(s);
          numerator = numerator + e * v[b][h][j];
          total = total + e;
        }
        rows.push_back(numerator / total);
      }
    }
  }
  return torch::stack(rows).view_as(q);
}

// Outputs and gradients w.r.t. q, k, v, the table d and u, v, w against autograd through the naive
// loop, in double; gated, plain and no relative bias.
TEST(GatedAttention, GradientsMatchNaiveLoop) {
  const auto c = make_case(/*batch=*/2, /*heads=*/2, /*length=*/6, /*head_dim=*/3);
  torch::manual_seed(5);
  const auto projection = torch::randn_like(c.q);  // a loss that weighs every output differently
  const char* names[] = {"q", "k", "v", "d", "u", "v_gate", "w"};
  auto leaves_of = [&] {
    std::vector<torch::Tensor> leaves;
    for (const auto& t : {c.q, c.k, c.v, c.d, c.u, c.gv, c.w}) {
      leaves.push_back(t.detach().clone().requires_grad_(true));
    }
    return leaves;
  };
  auto gradients = [&](const torch::Tensor& out, const std::vector<torch::Tensor>& leaves) {
    auto grads = torch::autograd::grad({(out * projection).sum()}, leaves, {}, false, false,
                                       /*allow_unused=*/true);
    for (size_t n = 0; n < grads.size(); ++n) {
      if (!grads[n].defined()) grads[n] = torch::zeros_like(leaves[n]);
    }
    return grads;
  };
  for (const bool relative : {true, false}) {
    for (const bool gated : {true, false}) {
      if (!relative && gated) continue;
      const auto naive_leaves = leaves_of();
      const auto expected_out = naive_differentiable(naive_leaves, c.padding, relative, gated);
      const auto expected = gradients(expected_out, naive_leaves);
      const auto leaves = leaves_of();
      PositionBias bias;
      if (relative) bias.table = toeplitz_bias(leaves[3], c.buckets);
      if (gated) {
        bias.gate_u = leaves[4];
        bias.gate_v = leaves[5];
        bias.gate_w = leaves[6];
      }
      const auto out = attention(leaves[0], leaves[1], leaves[2], c.padding, bias, 0.0, false,
                                 AttentionKernel::kMath);
      const auto grads = gradients(out, leaves);
      const std::string where = fmt::format("relative {} gated {}", relative, gated);
      EXPECT_TRUE(torch::allclose(out, expected_out, 1e-12, 1e-12)) << where;
      for (size_t n = 0; n < grads.size(); ++n) {
        EXPECT_TRUE(torch::allclose(grads[n], expected[n], 1e-10, 1e-12))
            << "d" << names[n] << ", " << where << "\n"
            << grads[n] << "\n"
            << expected[n];
      }
      // The bias parameters get gradients exactly when they are used.
      EXPECT_EQ(grads[3].abs().sum().item<double>() > 0, relative) << where;
      EXPECT_EQ(grads[4].abs().sum().item<double>() > 0, gated) << where;
    }
  }
}

// scores, factor, table, padding and an upstream gradient for add_position_bias.
struct BiasCase {
  torch::Tensor scores;    // [B, H, T, T]
  torch::Tensor factor;    // [B, H, T, 1]
  torch::Tensor table;     // [H, T, T]
  torch::Tensor padding;   // [B, T] bool
  torch::Tensor upstream;  // [B, H, T, T]: d loss / d output, 0 at padded keys
};

BiasCase make_bias_case(int64_t batch, int64_t heads, int64_t length, torch::ScalarType dtype) {
  torch::manual_seed(11);
  BiasCase c;
  const auto opts = torch::TensorOptions().dtype(dtype);
  c.scores = torch::randn({batch, heads, length, length}, opts);
  c.factor = torch::rand({batch, heads, length, 1}, opts) * 2 + 1;  // the gate's range [1, 3]
  c.table = torch::randn({heads, length, length}, opts);
  c.padding = torch::zeros({batch, length}, torch::kBool);
  c.padding[batch - 1].narrow(0, length - 3, 3).fill_(true);
  c.upstream = torch::randn({batch, heads, length, length}, opts)
                   .masked_fill(c.padding.view({batch, 1, 1, length}), 0.0);
  return c;
}

// The output and the gradients w.r.t. scores, factor and table of add_position_bias, all in
// double (the gradients are undefined for what is not differentiated).
std::vector<torch::Tensor> bias_forward_backward(const BiasCase& c, bool gated, bool write) {
  auto scores = c.scores.detach().clone().requires_grad_(true);
  auto factor = c.factor.detach().clone().requires_grad_(true);
  auto table = c.table.detach().clone().requires_grad_(true);
  // Added into a non-leaf, as the attention's matmul output; written into a new tensor that does
  // not require gradients, as the SDPA mask.
  auto out = add_position_bias(write ? torch::empty_like(c.scores) : scores * 1,
                               gated ? factor : torch::Tensor(), table, c.padding, write);
  out.backward(c.upstream);
  return {
      out.detach().to(torch::kDouble), write ? torch::Tensor() : scores.grad().to(torch::kDouble),
      gated ? factor.grad().to(torch::kDouble) : torch::Tensor(), table.grad().to(torch::kDouble)};
}

// The same by loops over every element, in double.
std::vector<torch::Tensor> bias_naive(const BiasCase& c, bool gated, bool write) {
  const auto scores = c.scores.to(torch::kDouble), factor = c.factor.to(torch::kDouble),
             table = c.table.to(torch::kDouble), upstream = c.upstream.to(torch::kDouble);
  const int64_t batch = scores.size(0), heads = scores.size(1), length = scores.size(2);
  auto out = torch::empty_like(scores), dfactor = torch::zeros_like(factor),
       dtable = torch::zeros_like(table);
  auto s = scores.accessor<double, 4>(), f = factor.accessor<double, 4>();
  auto t = table.accessor<double, 3>();
  auto g = upstream.accessor<double, 4>();
  auto o = out.accessor<double, 4>(), df = dfactor.accessor<double, 4>();
  auto dt = dtable.accessor<double, 3>();
  auto pad = c.padding.accessor<bool, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < length; ++i) {
        const double fi = gated ? f[b][h][i][0] : 1.0;
        for (int64_t j = 0; j < length; ++j) {
          o[b][h][i][j] = pad[b][j] ? -std::numeric_limits<double>::infinity()
                                    : (write ? 0.0 : s[b][h][i][j]) + fi * t[h][i][j];
          df[b][h][i][0] += g[b][h][i][j] * t[h][i][j];
          dt[h][i][j] += fi * g[b][h][i][j];
        }
      }
    }
  }
  return {out, write ? torch::Tensor() : upstream, gated ? dfactor : torch::Tensor(), dtable};
}

// Against the naive loops in double, two lengths.
TEST(PositionBias, MatchesNaiveLoopInDouble) {
  const char* names[] = {"output", "dscores", "dfactor", "dtable"};
  for (const int64_t length : {5, 19}) {
    const auto c = make_bias_case(/*batch=*/3, /*heads=*/2, length, torch::kDouble);
    for (const bool gated : {true, false}) {
      for (const bool write : {false, true}) {
        const auto expected = bias_naive(c, gated, write);
        const auto got = bias_forward_backward(c, gated, write);
        for (size_t n = 0; n < got.size(); ++n) {
          ASSERT_EQ(got[n].defined(), expected[n].defined()) << names[n];
          if (!got[n].defined()) continue;
          EXPECT_TRUE(torch::allclose(got[n], expected[n], 1e-12, 1e-12))
              << names[n] << ": T " << length << " gated " << gated << " write " << write;
        }
      }
    }
  }
}

// bf16 scores and factor (as under bf16 autocast) with an fp32 table, against the same values in
// double. Each result may be off by a few bf16 roundings (relative 2^-9 each) of the magnitudes
// it is summed from: the same formulas on absolute values (|s| + |f| |t|, sum |g| |t|, ...). The
// ATen ops round the table, the product and the sum, and a CPU bf16 bmm may round its running sum
// after each of up to T terms (LibTorch 1.13's did; oneDNN and cuBLAS sum in fp32): T + 3
// roundings are allowed.
TEST(PositionBias, Bf16IsDoubleWithinRounding) {
  constexpr int64_t kLength = 21;
  BiasCase c16 = make_bias_case(/*batch=*/4, /*heads=*/2, kLength, torch::kFloat);
  c16.scores = c16.scores.to(torch::kBFloat16);
  c16.factor = c16.factor.to(torch::kBFloat16);
  c16.upstream = c16.upstream.to(torch::kBFloat16);
  BiasCase exact = c16, magnitude = c16;
  for (auto* t : {&exact.scores, &exact.factor, &exact.table, &exact.upstream}) {
    *t = t->to(torch::kDouble);
  }
  magnitude.scores = exact.scores.abs();
  magnitude.factor = exact.factor.abs();
  magnitude.table = exact.table.abs();
  magnitude.upstream = exact.upstream.abs();
  const auto expected = bias_naive(exact, /*gated=*/true, /*write=*/false);
  const auto bound = bias_naive(magnitude, true, false);
  const char* names[] = {"output", "dscores", "dfactor", "dtable"};
  const double rounding = 1.0 / 512;  // bf16 keeps 8 significant bits
  const auto got = bias_forward_backward(c16, true, false);
  EXPECT_EQ(got[0].isinf().sum().item<int64_t>(), 3 * 2 * kLength) << "padded keys";
  const double roundings = kLength + 3;
  for (size_t n = 0; n < got.size(); ++n) {
    const auto finite = expected[n].isfinite();
    const auto error = (got[n] - expected[n]).abs().masked_fill(~finite, 0.0);
    const auto allowed = bound[n].masked_fill(~finite, 0.0) * roundings * rounding + 1e-12;
    EXPECT_TRUE((error <= allowed).all().item<bool>())
        << names[n] << ": worst excess " << (error - allowed).max().item<double>();
  }
}

TEST(PositionBias, RejectsMismatchedTable) {
  const auto c = make_bias_case(2, 2, 5, torch::kFloat);
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] {
        add_position_bias(c.scores.clone(), c.factor, c.table.narrow(1, 0, 4), c.padding);
      }),
      {"add_position_bias", "[2, 2, 5, 5]", "[2, 4, 5]", "[H, T, T]"}));
}

// The whole attention under CPU bf16 autocast against fp32: outputs and gradients within a
// tolerance of bf16 arithmetic (matmuls in bf16 with fp32 accumulation).
TEST(GatedAttention, Bf16AutocastCloseToFp32) {
  auto c = make_case(/*batch=*/2, /*heads=*/2, /*length=*/9, /*head_dim=*/8);
  torch::manual_seed(9);
  const auto projection = torch::randn_like(c.q).to(torch::kFloat);
  auto forward_backward = [&](bool bf16) {
    std::vector<torch::Tensor> leaves;
    for (const auto& t : {c.q, c.k, c.v, c.d, c.u, c.gv, c.w}) {
      leaves.push_back(t.detach().to(torch::kFloat).requires_grad_(true));
    }
    PositionBias bias;
    bias.table = toeplitz_bias(leaves[3], c.buckets);
    bias.gate_u = leaves[4];
    bias.gate_v = leaves[5];
    bias.gate_w = leaves[6];
    at::autocast::set_autocast_enabled(at::kCPU, bf16);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    auto out = attention(leaves[0], leaves[1], leaves[2], c.padding, bias, 0.0, false,
                         AttentionKernel::kMath);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    (out.to(torch::kFloat) * projection).sum().backward();
    std::vector<torch::Tensor> results{out.detach().to(torch::kFloat)};
    for (const auto& leaf : leaves) results.push_back(leaf.grad());
    return results;
  };
  const auto fp32 = forward_backward(false);
  const auto bf16 = forward_backward(true);
  EXPECT_EQ(bf16[0].scalar_type(), torch::kFloat);
  const char* names[] = {"output", "dq", "dk", "dv", "dd", "du", "dv_gate", "dw"};
  for (size_t n = 0; n < fp32.size(); ++n) {
    // Relative to the tensor's largest entry: bf16 rounding (2^-8) of inputs and products.
    const double scale = fp32[n].abs().max().item<double>();
    const double error = (bf16[n] - fp32[n]).abs().max().item<double>();
    EXPECT_LT(error, 0.05 * scale) << names[n];
    EXPECT_GT(error, 0.0) << names[n] << ": bf16 really ran";
  }
}

TEST(GatedAttention, PaddedKeysGetNoWeight) {
  auto c = make_case(2, 2, 6, 3);
  const auto before = run(c, true, true);
  c.v[1].narrow(1, 4, 2).add_(100.0);  // values at the padded keys of sequence 1
  EXPECT_TRUE(torch::allclose(run(c, true, true), before, 0, 0));
}

TEST(GatedAttention, GateFactorIsTheFormula) {
  const auto c = make_case(1, 2, 3, 4);
  PositionBias bias;
  bias.gate_u = c.u;
  bias.gate_v = c.gv;
  bias.gate_w = c.w;
  const auto factor = gate_factor(c.q, bias);  // [1, 2, 3, 1]
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 3; ++i) {
      const double gu = sigmoid(c.q[0][h][i].dot(c.u[h]).item<double>());
      const double gr = sigmoid(c.q[0][h][i].dot(c.gv[h]).item<double>());
      EXPECT_NEAR(factor[0][h][i][0].item<double>(), 1 + gu + (1 - gu) * c.w[h].item<double>() * gr,
                  1e-14);
    }
  }
}

// Autograd against central differences in float64 for every input of the gated attention.
TEST(GatedAttention, GradientsMatchCentralDifferences) {
  auto c = make_case(/*batch=*/2, /*heads=*/2, /*length=*/5, /*head_dim=*/3);
  std::vector<torch::Tensor*> inputs = {&c.q, &c.k, &c.v, &c.u, &c.gv, &c.w, &c.d};
  const std::vector<const char*> names = {"q", "k", "v", "u", "v_gate", "w", "d"};
  torch::manual_seed(3);
  const auto projection = torch::randn_like(c.q);  // a random scalar function of the output
  auto objective = [&] { return (run(c, true, true) * projection).sum(); };
  for (auto* t : inputs) t->requires_grad_(true);
  std::vector<torch::Tensor> leaves;
  for (auto* t : inputs) leaves.push_back(*t);
  const auto grads = torch::autograd::grad({objective()}, leaves);
  const double eps = 1e-6;
  torch::NoGradGuard no_grad;
  for (size_t n = 0; n < inputs.size(); ++n) {
    auto flat = inputs[n]->view(-1);
    const auto analytic = grads[n].reshape(-1);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double original = flat[e].item<double>();
      flat[e].fill_(original + eps);
      const double plus = objective().item<double>();
      flat[e].fill_(original - eps);
      const double minus = objective().item<double>();
      flat[e].fill_(original);
      EXPECT_NEAR(analytic[e].item<double>(), (plus - minus) / (2 * eps), 1e-6)
          << names[n] << "[" << e << "]";
    }
  }
}

TEST(AttentionKernel, ResolvesFromConfig) {
  using config::AttentionChoice;
  EXPECT_EQ(resolve_attention_kernel(AttentionChoice::kMath, torch::kCPU), AttentionKernel::kMath);
  EXPECT_EQ(resolve_attention_kernel(AttentionChoice::kAuto, torch::kCPU), AttentionKernel::kMath);
  EXPECT_EQ(resolve_attention_kernel(AttentionChoice::kSdpa, torch::kCPU), AttentionKernel::kSdpa);
  EXPECT_EQ(resolve_attention_kernel(AttentionChoice::kAuto, torch::Device(torch::kCUDA, 0)),
            AttentionKernel::kSdpa);
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] { config::load_config("", {"model.attention=flash"}); }),
      {"model.attention: expected one of: auto, math, sdpa, got "
       "'flash'"}));
}

TEST(AttentionKernel, SdpaMatchesMath) {
  const auto c = make_case(2, 3, 7, 4);
  const auto weights = torch::randn_like(c.q);  // a loss that weighs every output differently
  for (const bool gated : {true, false}) {
    // The outputs and the gradients w.r.t. q, k, v and every bias parameter.
    auto forward_backward = [&](AttentionKernel kernel) {
      std::vector<torch::Tensor> leaves;
      for (const auto& t : {c.q, c.k, c.v, c.d, c.u, c.gv, c.w}) {
        leaves.push_back(t.detach().clone().requires_grad_(true));
      }
      PositionBias bias;
      bias.table = toeplitz_bias(leaves[3], c.buckets);
      if (gated) {
        bias.gate_u = leaves[4];
        bias.gate_v = leaves[5];
        bias.gate_w = leaves[6];
      }
      auto out = attention(leaves[0], leaves[1], leaves[2], c.padding, bias, 0.0, false, kernel);
      (out * weights).sum().backward();
      std::vector<torch::Tensor> results{out.detach()};
      for (const auto& leaf : leaves) {
        results.push_back(leaf.grad().defined() ? leaf.grad() : torch::zeros_like(leaf));
      }
      return results;
    };
    const auto math = forward_backward(AttentionKernel::kMath);
    const auto sdpa = forward_backward(AttentionKernel::kSdpa);
    const char* names[] = {"output", "dq", "dk", "dv", "dd", "du", "dv_gate", "dw"};
    for (size_t i = 0; i < math.size(); ++i) {
      EXPECT_TRUE(torch::allclose(math[i], sdpa[i], 1e-10, 1e-10))
          << names[i] << ", gated " << gated;
    }
    // The gate parameters get gradients exactly when the gate is on.
    EXPECT_EQ(math[5].abs().sum().item<double>() > 0, gated);
  }
}

}  // namespace
}  // namespace xlme::model
