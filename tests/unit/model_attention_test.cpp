// Gated-bias attention against a naive loop over (i, j), its gradients against central
// differences, and the SDPA kernel against the math kernel (LibTorch >= 2.0 only).
#include "xlme/model/attention.h"

#include "xlme/common/torch_compat.h"
#include "xlme/model/relative_position.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

namespace xlme::model {
namespace {

struct AttentionCase {
  torch::Tensor q, k, v;       // [B, H, T, d_k]
  torch::Tensor padding;       // [B, T] bool
  torch::Tensor d;             // [H, buckets]
  torch::Tensor u, gv, w;      // [H, d_k], [H, d_k], [H]
  torch::Tensor flat_buckets;  // [T * T]
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
  c.flat_buckets = relative_position_buckets(length, 8, 16, torch::kCPU).view(-1);
  return c;
}

torch::Tensor run(const AttentionCase& c, bool relative, bool gated) {
  PositionBias bias;
  if (relative) bias.table = toeplitz_bias(c.d, c.flat_buckets, c.length);
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

// The formulas of DESIGN section 5, one (b, h, i, j) at a time.
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
      const auto expected = naive(c, relative, gated);
      EXPECT_TRUE(torch::allclose(run(c, relative, gated), expected, 1e-12, 1e-12))
          << "relative " << relative << " gated " << gated;
    }
  }
  // The three variants really differ.
  EXPECT_FALSE(torch::allclose(run(c, true, true), run(c, true, false)));
  EXPECT_FALSE(torch::allclose(run(c, true, false), run(c, false, false)));
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
  EXPECT_EQ(resolve_attention_kernel("math", torch::kCPU), AttentionKernel::kMath);
  EXPECT_EQ(resolve_attention_kernel("auto", torch::kCPU), AttentionKernel::kMath);
  if (!compat::kHasScaledDotProductAttention) {
    EXPECT_TRUE(testing::contains_all(
        testing::error_message([] { resolve_attention_kernel("sdpa", torch::kCPU); }),
        {"model.attention=sdpa", "LibTorch >= 2.0", "model.attention=math"}));
  }
}

TEST(AttentionKernel, SdpaMatchesMath) {
  if (!compat::kHasScaledDotProductAttention) {
    GTEST_SKIP() << "scaled_dot_product_attention needs LibTorch >= 2.0; this is "
                 << compat::kTorchVersion;
  }
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
      bias.table = toeplitz_bias(leaves[3], c.flat_buckets, c.length);
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
