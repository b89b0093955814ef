// Multi-head self-attention with XLM-E's gated relative position bias (docs/ARCHITECTURE.md#model):
//   g_update = sigmoid(q_i . u_h), g_reset = sigmoid(q_i . v_h)
//   r_{i-j}  = d_{h,b(i-j)} * (1 + g_update + (1 - g_update) * w_h * g_reset)
//   a_ij     ~ exp(q_i . k_j / sqrt(d_k) + r_{i-j})
#pragma once

#include "xlme/config/config.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace xlme::model {

// How the attention probabilities are computed. kMath: explicit softmax, any LibTorch;
// kSdpa: at::scaled_dot_product_attention with the bias as an additive mask (LibTorch >= 2.0).
enum class AttentionKernel { kMath, kSdpa };

// The kernel model.attention chooses for tensors on `device`: auto = sdpa where ops'
// sdpa_by_default says so (CUDA), else math.
AttentionKernel resolve_attention_kernel(config::AttentionChoice choice,
                                         const torch::Device& device);

// One layer's relative position bias, as the kernel consumes it.
struct PositionBias {
  torch::Tensor table;   // [H, T, T]: d_{h, b(i-j)}; undefined = no relative bias
  torch::Tensor gate_u;  // [H, d_k]: u_h; undefined = plain (ungated) relative bias
  torch::Tensor gate_v;  // [H, d_k]: v_h
  torch::Tensor gate_w;  // [H]: w_h
  // The distance from which `table` is constant on each side (relative_position_far_distance),
  // so that the fused kernel's far tiles read one value; 0 = not known, no shortcut.
  int64_t far = 0;
};

// q: [B, H, T, d_k] -> [B, H, T, 1]: 1 + g_update + (1 - g_update) * w_h * g_reset, the factor
// that scales the head's Toeplitz table for query i.
torch::Tensor gate_factor(const torch::Tensor& q, const PositionBias& bias);

// Adds the relative position bias into `scores` in place and returns `scores`:
//   scores[b, h, i, j] += factor[b, h, i] * table[h, i, j], and -inf at padded keys j,
// with the factor and table rounded to the scores' dtype and ATen's addcmul_ (under bf16 autocast:
// in bf16); `write` = true overwrites `scores` instead of adding to it (the SDPA mask). No
// [B, H, T, T] tensor is saved for the backward. Differentiable w.r.t. scores, factor and table;
// the backward reduces the scores' gradient with two batched products:
//   d factor[b, h, i] = sum_j grad[b, h, i, j] * table[h, i, j]
//   d table[h, i, j]  = sum_b factor[b, h, i] * grad[b, h, i, j].
// scores: [B, H, T, T] floating; factor: [B, H, T, 1] (undefined = ungated, a factor of 1);
// table: [H, T, T]; padding: [B, T] bool (undefined = none).
torch::Tensor add_position_bias(torch::Tensor scores, const torch::Tensor& factor,
                                const torch::Tensor& table, const torch::Tensor& padding,
                                bool write = false);

// q, k, v: [B, H, T, d_k]; padding: [B, T] bool, true at <pad> (keys there get no attention;
// undefined = no padding) -> context [B, H, T, d_k]. Every sequence needs at least one real token.
// The bias is (per batch, head, query factor) x (per-head [T, T] table); the math kernel adds it
// into the score tensor in place (add_position_bias), so it never exists as a separate
// [B, H, T, T] tensor; the SDPA kernel builds it once, in q's dtype, as its additive mask.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& padding, const PositionBias& bias, double dropout,
                        bool training, AttentionKernel kernel);

// Projections, the layer's bias parameters and the kernel. Parameter names (export keys):
// query, key, value, output (Linear), relative_bias [H, num_buckets] (d), gate_u, gate_v
// [H, d_k] and gate_w [H].
class SelfAttentionImpl : public torch::nn::Module {
 public:
  // `args`: hidden_size, heads, attention_dropout, init_std, relative_position (the layer has its
  // own table unless relative_position.shared_across_layers) and the attention kernel.
  explicit SelfAttentionImpl(const config::ModelArgs& args);

  // x: [B, T, hidden]; padding: [B, T] bool; table: [H, T, T] d_{h, b(i-j)} for this layer
  // (undefined when the relative bias is off) -> [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& padding,
                        const torch::Tensor& table);

  // buckets: [T, T] bucket ids -> [H, T, T] d_{h, b(i-j)} from this layer's own table.
  torch::Tensor bias_table(const torch::Tensor& buckets) const;

  const config::ModelArgs& args() const { return args_; }

  // The distance from which the bias table is constant on each side (PositionBias::far), from
  // num_buckets and max_distance; 0 without a relative bias.
  int64_t far() const { return far_; }

  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr}, output{nullptr};
  torch::Tensor relative_bias;  // [H, num_buckets]: d_{h, b}, when the layer has its own table
  torch::Tensor gate_u;         // [H, d_k]
  torch::Tensor gate_v;         // [H, d_k]
  torch::Tensor gate_w;         // [H]

 private:
  config::ModelArgs args_;
  int64_t far_ = 0;  // where the bias table turns constant (PositionBias::far)
};
TORCH_MODULE(SelfAttention);

}  // namespace xlme::model
