#include "xlme/model/attention.h"

#include "xlme/common/error.h"
#include "xlme/common/torch_compat.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace xlme::model {

AttentionKernel resolve_attention_kernel(const std::string& name, const torch::Device& device) {
  if (name == "math") return AttentionKernel::kMath;
  if (name == "sdpa") {
    XLME_CHECK(compat::kHasScaledDotProductAttention,
               "model.attention=sdpa needs LibTorch >= 2.0 (this build has {}); use "
               "model.attention=math or auto",
               compat::kTorchVersion);
    return AttentionKernel::kSdpa;
  }
  XLME_CHECK(name == "auto", "model.attention must be auto, math or sdpa, not '{}'", name);
  return compat::kHasScaledDotProductAttention && device.is_cuda() ? AttentionKernel::kSdpa
                                                                   : AttentionKernel::kMath;
}

torch::Tensor gate_factor(const torch::Tensor& q, const PositionBias& bias) {
  // Both gates with one product: [B, H, T, d_k] x [H, d_k, 2] -> [B, H, T, 2].
  const auto gates = torch::sigmoid(torch::matmul(q, torch::stack({bias.gate_u, bias.gate_v}, -1)));
  const auto update = gates.narrow(-1, 0, 1);  // [B, H, T, 1]
  const auto reset = gates.narrow(-1, 1, 1);   // [B, H, T, 1]
  const auto w = bias.gate_w.view({1, -1, 1, 1});
  // The update gate interpolates between doubling the bias (g_update = 1) and a reset-gated,
  // learned rescaling w_h (g_update = 0): r = d * (1 + g_u + (1 - g_u) * w * g_r).
  return 1.0 + update + (1.0 - update) * w * reset;
}

namespace {

// padding: [B, T] bool -> [B, 1, 1, T]: -inf at padded keys, else 0. Adding it (a broadcast add)
// is ~10x cheaper on the CPU than masked_fill_ with a broadcast boolean mask.
torch::Tensor padding_bias(const torch::Tensor& padding, const torch::TensorOptions& options) {
  return torch::zeros({padding.size(0), 1, 1, padding.size(1)}, options)
      .masked_fill_(padding.view({padding.size(0), 1, 1, padding.size(1)}),
                    -std::numeric_limits<double>::infinity());
}

torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& padding, const PositionBias& bias, double dropout,
                             bool training) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q * scale, k.transpose(-2, -1));  // [B, H, T, T]
  if (bias.table.defined()) {
    // Under bf16 autocast the scores are bf16 and the fp32 bias must match them: in-place CPU
    // kernels do not mix dtypes (a no-op in fp32).
    const auto dtype = scores.scalar_type();
    if (bias.gate_u.defined()) {
      scores.addcmul_(gate_factor(q, bias).to(dtype), bias.table.to(dtype));  // [B,H,T,1] x [H,T,T]
    } else {
      scores.add_(bias.table.to(dtype));
    }
  }
  if (padding.defined()) scores.add_(padding_bias(padding, scores.options()));
  auto probs = torch::dropout(torch::softmax(scores, -1), dropout, training);
  return torch::matmul(probs, v);
}

torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& padding, const PositionBias& bias, double dropout,
                             bool training) {
  // The fused kernels take one additive mask: the bias plus -inf at padded keys.
  torch::Tensor mask;
  if (bias.table.defined()) {
    mask = bias.gate_u.defined() ? gate_factor(q, bias) * bias.table : bias.table.unsqueeze(0);
  }
  if (padding.defined()) {
    const auto pad = padding_bias(padding, q.options());
    mask = mask.defined() ? mask + pad : pad;
  }
  // The fused kernels want a float mask of the query's dtype (bf16 under autocast).
  if (mask.defined()) mask = mask.to(q.scalar_type());
  return compat::scaled_dot_product_attention(q, k, v, mask, training ? dropout : 0.0);
}

}  // namespace

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& padding, const PositionBias& bias, double dropout,
                        bool training, AttentionKernel kernel) {
  if (kernel == AttentionKernel::kSdpa) {
    return sdpa_attention(q, k, v, padding, bias, dropout, training);
  }
  return math_attention(q, k, v, padding, bias, dropout, training);
}

SelfAttentionImpl::SelfAttentionImpl(const SelfAttentionOptions& options) : options_(options) {
  XLME_CHECK(options.hidden_size % options.heads == 0,
             "attention width {} must be a multiple of the number of heads {}", options.hidden_size,
             options.heads);
  const int64_t h = options.hidden_size;
  const int64_t head_dim = h / options.heads;
  query = register_module("query", torch::nn::Linear(h, h));
  key = register_module("key", torch::nn::Linear(h, h));
  value = register_module("value", torch::nn::Linear(h, h));
  output = register_module("output", torch::nn::Linear(h, h));
  torch::NoGradGuard no_grad;
  for (auto* linear : {&query, &key, &value, &output}) {
    (*linear)->weight.normal_(0.0, options.init_std);
    (*linear)->bias.zero_();
  }
  if (options.relative_bias && options.own_table) {
    relative_bias = register_parameter(
        "relative_bias",
        torch::empty({options.heads, options.num_buckets}).normal_(0.0, options.init_std));
  }
  if (options.relative_bias && options.gated) {
    // Small u, v: both gates start near 1/2 whatever the query; w = 1 (as in the gated relative
    // position bias of WavLM / XLM-E), so the initial bias is 1.75 d_{h, b}.
    gate_u = register_parameter(
        "gate_u", torch::empty({options.heads, head_dim}).normal_(0.0, options.init_std));
    gate_v = register_parameter(
        "gate_v", torch::empty({options.heads, head_dim}).normal_(0.0, options.init_std));
    gate_w = register_parameter("gate_w", torch::ones({options.heads}));
  }
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& padding,
                                         const torch::Tensor& table) {
  const int64_t batch = x.size(0), length = x.size(1);
  const int64_t heads = options_.heads, head_dim = options_.hidden_size / heads;
  auto split = [&](const torch::Tensor& t) {  // [B, T, hidden] -> [B, H, T, d_k]
    return t.view({batch, length, heads, head_dim}).transpose(1, 2);
  };
  const auto q = split(query(x)), k = split(key(x)), v = split(value(x));
  PositionBias bias;
  bias.table = table;
  bias.gate_u = gate_u;
  bias.gate_v = gate_v;
  bias.gate_w = gate_w;
  const auto kernel = resolve_attention_kernel(options_.kernel, x.device());
  const auto context = attention(q, k, v, padding, bias, options_.attention_dropout, is_training(),
                                 kernel);  // [B, H, T, d_k]
  return output(context.transpose(1, 2).reshape({batch, length, options_.hidden_size}));
}

}  // namespace xlme::model
