#include "xlme/model/attention.h"

#include <ATen/ATen.h>
#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/model/attention_probs.h"
#include "xlme/model/batched_matmul.h"
#include "xlme/model/dropout.h"
#include "xlme/model/linear.h"
#include "xlme/model/own_kernels.h"
#include "xlme/model/relative_position.h"

#include "kernel_util.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>

namespace xlme::model {

using kernel::empty_if_undefined;
using kernel::rows_per_task;
using kernel::undefined_if_empty;

AttentionKernel resolve_attention_kernel(const std::string& name, const torch::Device& device) {
  if (name == "math") return AttentionKernel::kMath;
  if (name == "sdpa") return AttentionKernel::kSdpa;
  XLME_CHECK(name == "auto", "model.attention must be auto, math or sdpa, not '{}'", name);
  return device.is_cuda() ? AttentionKernel::kSdpa : AttentionKernel::kMath;
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

// The forward loop: scores [B, H, T, T] contiguous (scalar_t); factor [B * H * T] and table
// [H * T * T] in acc_t (factor nullptr = 1); padding [B * T] (nullptr = none).
template <typename scalar_t, typename acc_t>
void bias_forward_cpu(scalar_t* scores, const acc_t* factor, const acc_t* table,
                      const bool* padding, int64_t batch, int64_t heads, int64_t length,
                      bool write) {
  const int64_t rows = heads * length;  // (h, i) pairs per sequence
  at::parallel_for(0, batch * rows, rows_per_task(length), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {  // row = (b, h, i)
      const int64_t b = row / rows;
      scalar_t* s = scores + row * length;
      const acc_t* t = table + (row % rows) * length;
      const acc_t f = factor ? factor[row] : acc_t(1);
      for (int64_t j = 0; j < length; ++j) {
        s[j] = static_cast<scalar_t>((write ? acc_t(0) : static_cast<acc_t>(s[j])) + f * t[j]);
      }
      if (padding) {
        const bool* pad = padding + b * length;
        for (int64_t j = 0; j < length; ++j) {
          if (pad[j]) s[j] = -std::numeric_limits<scalar_t>::infinity();
        }
      }
    }
  });
}

// The backward loop, parallel over (h, i): each task reads its rows of grad [B, H, T, T]
// (scalar_t, contiguous) once, for every b, and produces both reductions in acc_t:
// dfactor[b, h, i] (when factor is not nullptr) and dtable[h, i, :].
template <typename scalar_t, typename acc_t>
void bias_backward_cpu(const scalar_t* grad, const acc_t* factor, const acc_t* table,
                       acc_t* dfactor, acc_t* dtable, int64_t batch, int64_t heads,
                       int64_t length) {
  const int64_t rows = heads * length;
  constexpr int64_t kLanes = 8;  // independent partial sums, so that the dot product vectorizes
  at::parallel_for(0, rows, rows_per_task(length * batch), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {  // r = (h, i)
      const acc_t* t = table + r * length;
      acc_t* dt = dtable + r * length;
      std::fill(dt, dt + length, acc_t(0));
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t row = b * rows + r;  // (b, h, i)
        const scalar_t* g = grad + row * length;
        const acc_t f = factor ? factor[row] : acc_t(1);
        acc_t partial[kLanes] = {};
        int64_t j = 0;
        for (; j + kLanes <= length; j += kLanes) {
          for (int64_t l = 0; l < kLanes; ++l) {
            const auto gj = static_cast<acc_t>(g[j + l]);
            partial[l] += gj * t[j + l];
            dt[j + l] += f * gj;
          }
        }
        for (; j < length; ++j) {
          const auto gj = static_cast<acc_t>(g[j]);
          partial[0] += gj * t[j];
          dt[j] += f * gj;
        }
        if (dfactor) dfactor[row] = std::accumulate(partial, partial + kLanes, acc_t(0));
      }
    }
  });
}

// The ATen version of the backward (CUDA): both reductions as batched products over (h, i), on a
// view of the contiguous gradient [B, H, T, T] -> [H * T, B, T].
std::pair<torch::Tensor, torch::Tensor> bias_backward_aten(const torch::Tensor& grad,
                                                           const torch::Tensor& factor,
                                                           const torch::Tensor& table) {
  const int64_t batch = grad.size(0), heads = grad.size(1), length = grad.size(2);
  if (!factor.defined()) return {torch::Tensor(), grad.sum(0)};
  const auto rows = grad.permute({1, 2, 0, 3}).reshape({heads * length, batch, length});
  const auto t = table.to(grad.scalar_type()).reshape({heads * length, length, 1});
  const auto f = factor.to(grad.scalar_type()).reshape({batch, heads * length}).t().unsqueeze(1);
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
                               const torch::Tensor& padding_or_empty, bool write, bool aten) {
    ctx->save_for_backward({factor_or_empty, table});
    const auto factor = undefined_if_empty(factor_or_empty);
    const auto padding = undefined_if_empty(padding_or_empty);
    ctx->saved_data["aten"] = aten;
    if (aten) {
      forward_aten(scores, factor, table, padding, write);
    } else {
      forward_cpu(scores, factor, table, padding, write);
    }
    ctx->mark_dirty({scores});
    return scores;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto factor = undefined_if_empty(saved[0]);
    const auto& table = saved[1];
    const auto grad = grads[0].contiguous();  // [B, H, T, T]
    torch::Tensor dfactor, dtable;
    if (ctx->saved_data["aten"].toBool()) {
      std::tie(dfactor, dtable) = bias_backward_aten(grad, factor, table);
    } else {
      std::tie(dfactor, dtable) = backward_cpu(grad, factor, table);
    }
    if (dfactor.defined()) dfactor = dfactor.to(factor.scalar_type());
    // The scores' gradient passes through; none for the padding and the two flags.
    return {grads[0],        dfactor,         dtable.to(table.scalar_type()),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

 private:
  static void forward_aten(torch::Tensor& scores, const torch::Tensor& factor,
                           const torch::Tensor& table, const torch::Tensor& padding, bool write) {
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
  }

  static void forward_cpu(torch::Tensor& scores, const torch::Tensor& factor,
                          const torch::Tensor& table, const torch::Tensor& padding, bool write) {
    XLME_CHECK(scores.is_contiguous(), "add_position_bias needs contiguous scores");
    const int64_t batch = scores.size(0), heads = scores.size(1), length = scores.size(2);
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, scores.scalar_type(), "add_position_bias", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const auto acc = c10::CppTypeToScalarType<acc_t>::value;
          const auto f = factor.defined() ? factor.to(acc).contiguous() : torch::Tensor();
          const auto t = table.to(acc).contiguous();
          const auto pad = padding.defined() ? padding.contiguous() : torch::Tensor();
          bias_forward_cpu<scalar_t, acc_t>(
              scores.data_ptr<scalar_t>(), f.defined() ? f.data_ptr<acc_t>() : nullptr,
              t.data_ptr<acc_t>(), pad.defined() ? pad.data_ptr<bool>() : nullptr, batch, heads,
              length, write);
        });
  }

  static std::pair<torch::Tensor, torch::Tensor> backward_cpu(const torch::Tensor& grad,
                                                              const torch::Tensor& factor,
                                                              const torch::Tensor& table) {
    const int64_t batch = grad.size(0), heads = grad.size(1), length = grad.size(2);
    torch::Tensor dfactor, dtable;
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, grad.scalar_type(), "add_position_bias_backward", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const auto options = grad.options().dtype(c10::CppTypeToScalarType<acc_t>::value);
          const auto f = factor.defined() ? factor.to(options).contiguous() : torch::Tensor();
          const auto t = table.to(options).contiguous();
          if (f.defined()) dfactor = torch::empty({batch, heads, length, 1}, options);
          dtable = torch::empty({heads, length, length}, options);
          bias_backward_cpu<scalar_t, acc_t>(
              grad.data_ptr<scalar_t>(), f.defined() ? f.data_ptr<acc_t>() : nullptr,
              t.data_ptr<acc_t>(), f.defined() ? dfactor.data_ptr<acc_t>() : nullptr,
              dtable.data_ptr<acc_t>(), batch, heads, length);
        });
    return {dfactor, dtable};
  }
};

torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& padding, const PositionBias& bias, double dropout,
                             bool training, BiasImpl impl) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = batched_matmul(q, k.transpose(-2, -1), scale);  // [B, H, T, T]
  const auto factor =
      bias.table.defined() && bias.gate_u.defined() ? gate_factor(q, bias) : torch::Tensor();
  if (impl == BiasImpl::kAuto && own_cpu_kernel(OwnKernel::kAttentionProbs) &&
      attention_probs_fused(scores, factor, bias.table)) {
    return batched_matmul(attention_probs(scores, factor, bias.table, padding, dropout, training),
                          v);
  }
  if (bias.table.defined()) {
    scores = add_position_bias(scores, factor, bias.table, padding, /*write=*/false, impl);
  } else if (padding.defined()) {
    scores.add_(padding_bias(padding, scores.options()));
  }
  auto probs = model::dropout(torch::softmax(scores, -1), dropout, training);
  return batched_matmul(probs, v);
}

torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& padding, const PositionBias& bias, double dropout,
                             bool training, BiasImpl impl) {
  // The fused kernels take one additive mask of the query's dtype (bf16 under autocast): the bias
  // plus -inf at padded keys, written once.
  torch::Tensor mask;
  if (bias.table.defined()) {
    const auto factor = bias.gate_u.defined() ? gate_factor(q, bias) : torch::Tensor();
    const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2);
    mask = add_position_bias(torch::empty({batch, heads, length, length}, q.options()), factor,
                             bias.table, padding, /*write=*/true, impl);
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
                                bool write, BiasImpl impl) {
  XLME_CHECK(scores.dim() == 4 && scores.size(2) == scores.size(3) && table.dim() == 3 &&
                 table.size(0) == scores.size(1) && table.size(1) == scores.size(2) &&
                 table.size(2) == scores.size(3),
             "add_position_bias: scores {} and table {} must be [B, H, T, T] and [H, T, T]",
             shape_text(scores.sizes()), shape_text(table.sizes()));
  const bool aten = impl == BiasImpl::kAten || !scores.device().is_cpu() ||
                    !own_cpu_kernel(OwnKernel::kPositionBias);
  return PositionBiasFunction::apply(std::move(scores), empty_if_undefined(factor, table.options()),
                                     table, empty_if_undefined(padding, torch::kBool), write, aten);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& padding, const PositionBias& bias, double dropout,
                        bool training, AttentionKernel kernel, BiasImpl impl) {
  if (kernel == AttentionKernel::kSdpa) {
    return sdpa_attention(q, k, v, padding, bias, dropout, training, impl);
  }
  return math_attention(q, k, v, padding, bias, dropout, training, impl);
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
  init_normal({&query, &key, &value, &output}, options.init_std);
  torch::NoGradGuard no_grad;
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

torch::Tensor SelfAttentionImpl::bias_table(const torch::Tensor& buckets) const {
  XLME_CHECK(relative_bias.defined(),
             "this attention layer has no bias table of its own (model.relative_position)");
  return toeplitz_bias(relative_bias, buckets);
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& padding,
                                         const torch::Tensor& table) {
  const int64_t batch = x.size(0), length = x.size(1);
  const int64_t heads = options_.heads, head_dim = options_.hidden_size / heads;
  auto split = [&](const torch::Tensor& t) {  // [B, T, hidden] -> [B, H, T, d_k]
    return t.view({batch, length, heads, head_dim}).transpose(1, 2);
  };
  // The three projections as one product, [B, T, hidden] -> [B, T, 3 * hidden], whose thirds the
  // heads read through strides: one larger matrix product instead of three.
  const auto qkv = linear(x, torch::cat({query->weight, key->weight, value->weight}),
                          torch::cat({query->bias, key->bias, value->bias}))
                       .chunk(3, -1);
  const auto q = split(qkv[0]), k = split(qkv[1]), v = split(qkv[2]);
  PositionBias bias;
  bias.table = table;
  bias.gate_u = gate_u;
  bias.gate_v = gate_v;
  bias.gate_w = gate_w;
  const auto kernel = resolve_attention_kernel(options_.kernel, x.device());
  const auto context = attention(q, k, v, padding, bias, options_.attention_dropout, is_training(),
                                 kernel);  // [B, H, T, d_k]
  return linear(output, context.transpose(1, 2).reshape({batch, length, options_.hidden_size}));
}

}  // namespace xlme::model
