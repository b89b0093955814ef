// Multi-head self-attention with XLM-E's gated relative position bias (docs/ARCHITECTURE.md#model):
//   g_update = sigmoid(q_i . u_h), g_reset = sigmoid(q_i . v_h)
//   r_{i-j}  = d_{h,b(i-j)} * (1 + g_update + (1 - g_update) * w_h * g_reset)
//   a_ij     ~ exp(q_i . k_j / sqrt(d_k) + r_{i-j})
#pragma once

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

// model.attention ("auto", "math", "sdpa") for tensors on `device`: auto = sdpa on CUDA when the
// LibTorch has it, else math. Throws when sdpa is asked for and this LibTorch lacks it.
AttentionKernel resolve_attention_kernel(const std::string& name, const torch::Device& device);

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

struct SelfAttentionOptions {
  int64_t hidden_size = 768;
  int64_t heads = 12;
  double attention_dropout = 0.1;
  bool relative_bias = true;  // this layer has a relative bias (its own table or a shared one)
  bool own_table = true;      // the table d is this layer's (false: shared across layers)
  bool gated = true;          // gate the bias by the query
  int64_t num_buckets = 32;
  int64_t max_distance = 128;
  double init_std = 0.02;
  std::string kernel = "auto";  // model.attention
};

// Projections, the layer's bias parameters and the kernel. Parameter names (export keys):
// query, key, value, output (Linear), relative_bias [H, num_buckets] (d), gate_u, gate_v
// [H, d_k] and gate_w [H].
class SelfAttentionImpl : public torch::nn::Module {
 public:
  explicit SelfAttentionImpl(const SelfAttentionOptions& options);

  // x: [B, T, hidden]; padding: [B, T] bool; table: [H, T, T] d_{h, b(i-j)} for this layer
  // (undefined when the relative bias is off) -> [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& padding,
                        const torch::Tensor& table);

  // buckets: [T, T] bucket ids -> [H, T, T] d_{h, b(i-j)} from this layer's own table (own_table).
  torch::Tensor bias_table(const torch::Tensor& buckets) const;

  const SelfAttentionOptions& options() const { return options_; }

  // The distance from which the bias table is constant on each side (PositionBias::far), from
  // num_buckets and max_distance; 0 without a relative bias.
  int64_t far() const { return far_; }

  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr}, output{nullptr};
  torch::Tensor relative_bias;  // [H, num_buckets]: d_{h, b}, when own_table
  torch::Tensor gate_u;         // [H, d_k]
  torch::Tensor gate_v;         // [H, d_k]
  torch::Tensor gate_w;         // [H]

 private:
  SelfAttentionOptions options_;
  int64_t far_ = 0;  // where the bias table turns constant (PositionBias::far)
};
TORCH_MODULE(SelfAttention);

}  // namespace xlme::model
