#include "xlme/model/attention.h"

#include <ATen/ATen.h>
#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/model/linear.h"
#include "xlme/model/relative_position.h"
#include "xlme/ops/attention.h"
#include "xlme/ops/dropout.h"
#include "xlme/ops/registry.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <utility>

namespace xlme::model {

AttentionKernel resolve_attention_kernel(config::AttentionChoice choice,
                                         const torch::Device& device) {
  switch (choice) {
    case config::AttentionChoice::kMath:
      return AttentionKernel::kMath;
    case config::AttentionChoice::kSdpa:
      return AttentionKernel::kSdpa;
    case config::AttentionChoice::kAuto:
      break;
  }
  return ops::sdpa_by_default(device) ? AttentionKernel::kSdpa : AttentionKernel::kMath;
}

torch::Tensor gate_factor(const torch::Tensor& q, const PositionBias& bias) {
  // Both gates with one product: [B, H, T, d_k] x [H, d_k, 2] -> [B, H, T, 2].
  const auto uv = torch::stack({bias.gate_u, bias.gate_v}, -1);  // [H, d_k, 2]
  const auto gates = torch::sigmoid(batched_matmul(q, uv.expand({q.size(0), -1, -1, -1})));
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

// LibTorch's autograd functions (1.13 and 2.11 alike) take no undefined tensor inputs: an empty
// tensor stands for "none" (no gate factor, no padding) on the way in and is turned back on the
// way out.
torch::Tensor empty_if_undefined(const torch::Tensor& t, const torch::TensorOptions& options) {
  return t.defined() ? t : torch::empty({0}, options);
}

torch::Tensor undefined_if_empty(const torch::Tensor& t) {
  return t.numel() > 0 ? t : torch::Tensor();
}

// The bias' backward: both reductions as batched products over (h, i), on the gradient
// [B, H, T, T] rearranged to [H * T, B, T] (one copy).
std::pair<torch::Tensor, torch::Tensor> bias_backward(const torch::Tensor& grad,
                                                      const torch::Tensor& factor,
                                                      const torch::Tensor& table) {
  const int64_t batch = grad.size(0), heads = grad.size(1), length = grad.size(2);
  if (!factor.defined()) return {torch::Tensor(), grad.sum(0)};
  const auto rows = grad.permute({1, 2, 0, 3}).reshape({heads * length, batch, length});
  const auto t = table.to(grad.scalar_type()).reshape({heads * length, length, 1});
  // Contiguous: the CPU bmm copies a strided operand one batch item at a time, which costs more
  // than one copy of the whole operand (docs/performance.md).
  const auto f = factor.to(grad.scalar_type())
                     .reshape({batch, heads * length})
                     .t()
                     .contiguous()
                     .unsqueeze(1);         // [H * T, 1, B]
  const auto dfactor = torch::bmm(rows, t)  // [H * T, B, 1]
                           .view({heads, length, batch})
                           .permute({2, 0, 1})
                           .unsqueeze(-1);                                // [B, H, T, 1]
  const auto dtable = torch::bmm(f, rows).view({heads, length, length});  // [H, T, T]
  return {dfactor, dtable};
}

// add_position_bias as an autograd function: the forward modifies `scores` in place (marked
// dirty) and saves only the factor and the table, not a [B, H, T, T] tensor.
class PositionBiasFunction : public torch::autograd::Function<PositionBiasFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor scores,
                               const torch::Tensor& factor_or_empty, const torch::Tensor& table,
                               const torch::Tensor& padding_or_empty, bool write) {
    ctx->save_for_backward({factor_or_empty, table});
    const auto factor = undefined_if_empty(factor_or_empty);
    const auto padding = undefined_if_empty(padding_or_empty);
    const auto dtype = scores.scalar_type();
    const auto t = table.to(dtype);  // [H, T, T]
    if (factor.defined()) {
      const auto f = factor.to(dtype);  // [B, H, T, 1]
      if (write) {
        torch::mul_out(scores, f, t);
      } else {
        scores.addcmul_(f, t);
      }
    } else if (write) {
      scores.copy_(t.unsqueeze(0));
    } else {
      scores.add_(t);
    }
    if (padding.defined()) scores.add_(padding_bias(padding, scores.options()));
    ctx->mark_dirty({scores});
    return scores;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto factor = undefined_if_empty(saved[0]);
    const auto& table = saved[1];
    auto [dfactor, dtable] = bias_backward(grads[0].contiguous(), factor, table);
    if (dfactor.defined()) dfactor = dfactor.to(factor.scalar_type());
    // The scores' gradient passes through; none for the padding and the flag.
    return {grads[0], dfactor, dtable.to(table.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& padding, const PositionBias& bias, double dropout,
                             bool training) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = batched_matmul(q, k.transpose(-2, -1), scale);  // [B, H, T, T]
  if (bias.table.defined()) {
    const auto factor = bias.gate_u.defined() ? gate_factor(q, bias) : torch::Tensor();
    scores = add_position_bias(scores, factor, bias.table, padding);
  } else if (padding.defined()) {
    scores.add_(padding_bias(padding, scores.options()));
  }
  const auto probs = ops::dropout(torch::softmax(scores, -1), dropout, training);
  return batched_matmul(probs, v);
}

torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& padding, const PositionBias& bias, double dropout,
                             bool training) {
  // The fused kernels take one additive mask of the query's dtype (bf16 under autocast): the bias
  // plus -inf at padded keys, written once.
  torch::Tensor mask;
  if (bias.table.defined()) {
    const auto factor = bias.gate_u.defined() ? gate_factor(q, bias) : torch::Tensor();
    const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2);
    mask = add_position_bias(torch::empty({batch, heads, length, length}, q.options()), factor,
                             bias.table, padding, /*write=*/true);
  } else if (padding.defined()) {
    mask = padding_bias(padding, q.options());
  }
  const auto attn_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  return at::scaled_dot_product_attention(q, k, v, attn_mask, training ? dropout : 0.0,
                                          /*is_causal=*/false);
}

}  // namespace

torch::Tensor add_position_bias(torch::Tensor scores, const torch::Tensor& factor,
                                const torch::Tensor& table, const torch::Tensor& padding,
                                bool write) {
  XLME_CHECK(scores.dim() == 4 && scores.size(2) == scores.size(3) && table.dim() == 3 &&
                 table.size(0) == scores.size(1) && table.size(1) == scores.size(2) &&
                 table.size(2) == scores.size(3),
             "add_position_bias: scores {} and table {} must be [B, H, T, T] and [H, T, T]",
             shape_text(scores.sizes()), shape_text(table.sizes()));
  return PositionBiasFunction::apply(std::move(scores), empty_if_undefined(factor, table.options()),
                                     table, empty_if_undefined(padding, torch::kBool), write);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& padding, const PositionBias& bias, double dropout,
                        bool training, AttentionKernel kernel) {
  if (ops::fused_attention_applies(q, k, v)) {
    const auto factor =
        bias.table.defined() && bias.gate_u.defined() ? gate_factor(q, bias) : torch::Tensor();
    return ops::fused_attention(q, k, v, padding, bias.table, factor, dropout, training,
                                bias.table.defined() ? bias.far : 0);
  }
  if (kernel == AttentionKernel::kSdpa) {
    return sdpa_attention(q, k, v, padding, bias, dropout, training);
  }
  return math_attention(q, k, v, padding, bias, dropout, training);
}

SelfAttentionImpl::SelfAttentionImpl(const config::ModelArgs& args) : args_(args) {
  const auto& rp = args.relative_position;
  XLME_CHECK(args.hidden_size % args.heads == 0,
             "attention width {} must be a multiple of the number of heads {}", args.hidden_size,
             args.heads);
  const int64_t h = args.hidden_size;
  const int64_t head_dim = h / args.heads;
  query = register_module("query", torch::nn::Linear(h, h));
  key = register_module("key", torch::nn::Linear(h, h));
  value = register_module("value", torch::nn::Linear(h, h));
  output = register_module("output", torch::nn::Linear(h, h));
  init_normal({&query, &key, &value, &output}, args.init_std);
  torch::NoGradGuard no_grad;
  if (rp.enabled && !rp.shared_across_layers) {
    relative_bias = register_parameter(
        "relative_bias", torch::empty({args.heads, rp.num_buckets}).normal_(0.0, args.init_std));
  }
  if (rp.enabled) {
    far_ = relative_position_far_distance(rp.num_buckets, rp.max_distance);
  }
  if (rp.enabled && rp.gated) {
    // Small u, v: both gates start near 1/2 whatever the query; w = 1 (as in the gated relative
    // position bias of WavLM / XLM-E), so the initial bias is 1.75 d_{h, b}.
    gate_u = register_parameter("gate_u",
                                torch::empty({args.heads, head_dim}).normal_(0.0, args.init_std));
    gate_v = register_parameter("gate_v",
                                torch::empty({args.heads, head_dim}).normal_(0.0, args.init_std));
    gate_w = register_parameter("gate_w", torch::ones({args.heads}));
  }
}

torch::Tensor SelfAttentionImpl::bias_table(const torch::Tensor& buckets) const {
  XLME_CHECK(relative_bias.defined(),
             "this attention layer has no bias table of its own (model.relative_position)");
  return toeplitz_bias(relative_bias, buckets);
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& padding,
                                         const torch::Tensor& table) {
  const int64_t batch = x.size(0), length = x.size(1);
  const int64_t heads = args_.heads, head_dim = args_.hidden_size / heads;
  auto split = [&](const torch::Tensor& t) {  // [B, T, hidden] -> [B, H, T, d_k]
    return t.view({batch, length, heads, head_dim}).transpose(1, 2);
  };
  // The three projections as one product, [B, T, hidden] -> [B, T, 3 * hidden], whose thirds the
  // heads read through strides: one larger matrix product instead of three.
  const auto qkv =
      linear(x, {query->weight, key->weight, value->weight}, {query->bias, key->bias, value->bias})
          .chunk(3, -1);
  const auto q = split(qkv[0]), k = split(qkv[1]), v = split(qkv[2]);
  PositionBias bias;
  bias.table = table;
  bias.gate_u = gate_u;
  bias.gate_v = gate_v;
  bias.gate_w = gate_w;
  bias.far = far_;
  const auto kernel = resolve_attention_kernel(args_.attention, x.device());
  const auto context = attention(q, k, v, padding, bias, args_.attention_dropout, is_training(),
                                 kernel);  // [B, H, T, d_k]
  return linear(output, context.transpose(1, 2).reshape({batch, length, args_.hidden_size}));
}

}  // namespace xlme::model
