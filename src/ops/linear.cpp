#include "xlme/ops/linear.h"

#include "xlme/ops/registry.h"
#include "xlme/ops/weight_gradient.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>

namespace xlme::ops {

bool cpu_has_fast_bf16_products() {
  static const bool fast = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  }();
  return fast;
}

bool emulate_bf16_products(const torch::Tensor& x) {
  const auto type = x.device().type();
  return implementation(Op::kLinear, x.device()) == Impl::kFused &&
         at::autocast::is_autocast_enabled(type) &&
         at::autocast::get_autocast_dtype(type) == at::kBFloat16 && !cpu_has_fast_bf16_products();
}

torch::Tensor bf16_rounded(const torch::Tensor& t) {
  return t.to(torch::kBFloat16).to(torch::kFloat32);
}

torch::Tensor bf16_emulated_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return torch::linear(bf16_rounded(x), bf16_rounded(weight),
                       bias.defined() ? bf16_rounded(bias) : bias)
      .to(torch::kBFloat16);
}

namespace {

// x W^T + b as LibTorch computes it under the current autocast state, or emulated.
torch::Tensor product(const torch::Tensor& x, const torch::Tensor& weight,
                      const torch::Tensor& bias) {
  if (emulate_bf16_products(x)) return bf16_emulated_linear(x, weight, bias);
  return torch::linear(x, weight, bias);
}

torch::Tensor stacked(const std::vector<torch::Tensor>& parts) {
  if (parts.empty()) return {};
  return parts.size() == 1 ? parts.front() : torch::cat(parts);
}

// A linear product whose backward adds the weights' gradients into their .grad buffers where
// weight_gradient_in_place() holds (ops/weight_gradient.h). x: the input as the product reads it
// (autocast's dtype); w [rows, in] and b [rows]: the weights and biases stacked as it reads them
// (autocast's cached copies, detached); weights and biases: the leaves they stack. The biases'
// gradients are the column sums of dy in fp32 (or wider), for autograd to add. row_multiple > 1
// (x 2-D, not emulated): the result's rows padded as linear(x, weight, bias, row_multiple) says.
struct AccumulatingLinear : torch::autograd::Function<AccumulatingLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, const std::optional<torch::Tensor>& b,
                               torch::TensorList weights, torch::TensorList biases, bool emulate,
                               int64_t row_multiple) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["weights"] = weights.vec();
    ctx->saved_data["biases"] = biases.vec();
    ctx->saved_data["emulate"] = emulate;
    const auto bias = b.value_or(torch::Tensor());
    if (row_multiple > 1) {
      // addmm (what torch::linear runs for a 2-D x with a bias) into the padded buffer's view.
      const int64_t out = w.size(0);
      const int64_t padded = (out + row_multiple - 1) / row_multiple * row_multiple;
      auto result = at::empty({x.size(0), padded}, x.options()).narrow(1, 0, out);
      if (bias.defined()) {
        at::addmm_out(result, bias, x, w.t());
      } else {
        at::mm_out(result, x, w.t());
      }
      return result;
    }
    return emulate ? bf16_emulated_linear(x, w, bias) : torch::linear(x, w, bias);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const auto weights = ctx->saved_data["weights"].toTensorVector();
    const auto biases = ctx->saved_data["biases"].toTensorVector();
    const bool emulate = ctx->saved_data["emulate"].toBool();
    const auto dy = grads[0].reshape({-1, w.size(0)});
    const auto x2 = x.reshape({-1, x.size(-1)});
    // x, w, b, then one per weight and bias, then `emulate` and `row_multiple`.
    torch::autograd::tensor_list out(3 + weights.size() + biases.size() + 2);
    if (ctx->needs_input_grad(0)) {
      out[0] = (emulate ? bf16_emulated_matmul(dy, w) : dy.mm(w)).view(x.sizes());
    }
    // In fp32 at least (bf16's sums), in float64 for float64.
    const auto sum_type = at::promote_types(dy.scalar_type(), torch::kFloat32);
    const auto db = biases.empty() ? torch::Tensor() : dy.sum({0}, false, sum_type);
    // Converted once for all the stacked weights (on the CPU: to fp32).
    const auto dy_operand = gradient_operand(dy, weights.front());
    const auto x_operand = gradient_operand(x2, weights.front());
    int64_t row = 0;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const int64_t rows = weights[i].size(0);
      out[3 + i] = weight_gradient(weights[i], dy_operand.narrow(1, row, rows), x_operand);
      if (!biases.empty() && biases[i].requires_grad()) {
        out[3 + weights.size() + i] = db.narrow(0, row, rows).to(biases[i].scalar_type());
      }
      row += rows;
    }
    return out;
  }
};

// What the product reads: autocast's cast of t (its cached copy of a weight), as torch::linear
// would get it.
torch::Tensor product_operand(const torch::Tensor& t, c10::DeviceType type) {
  return at::autocast::is_autocast_enabled(type)
             ? at::autocast::cached_cast(at::autocast::get_autocast_dtype(type), t, type)
             : t;
}

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                     const std::vector<torch::Tensor>& biases) {
  const auto type = x.device().type();
  // What the product reads: autocast's casts (its cached copies of the weights), as torch::linear
  // would get them.
  const auto operand = [&](const torch::Tensor& t) { return product_operand(t, type); };
  // The leaves' casts stacked (detached: outside autograd). Stacked after autocast's cast of each
  // (cached once per step), not cast after stacking (a new tensor every micro-batch, which
  // autocast's cache does not keep): the same values.
  const auto operands = [&](const std::vector<torch::Tensor>& leaves, bool detach) {
    std::vector<torch::Tensor> copies;
    copies.reserve(leaves.size());
    for (const auto& leaf : leaves) {
      copies.push_back(detach ? operand(leaf).detach() : operand(leaf));
    }
    return stacked(copies);
  };
  const bool in_place = std::any_of(weights.begin(), weights.end(), weight_gradient_in_place);
  if (!in_place) {
    if (weights.size() == 1) return product(x, weights.front(), stacked(biases));
    return product(x, operands(weights, false), operands(biases, false));
  }
  std::optional<torch::Tensor> b;
  if (!biases.empty()) b = operands(biases, true);
  // As TensorLists, so that autograd takes them as inputs (a std::vector would not be).
  return AccumulatingLinear::apply(operand(x), operands(weights, true), b,
                                   torch::TensorList(weights), torch::TensorList(biases),
                                   emulate_bf16_products(x), int64_t{1});
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     int64_t row_multiple) {
  if (row_multiple <= 1 || weight.size(0) % row_multiple == 0 || x.dim() != 2 ||
      emulate_bf16_products(x)) {
    return linear(x, weight, bias);
  }
  const auto type = x.device().type();
  const std::vector<torch::Tensor> weights{weight};
  std::optional<torch::Tensor> b;
  std::vector<torch::Tensor> biases;
  if (bias.defined()) {
    b = product_operand(bias, type).detach();
    biases.push_back(bias);
  }
  return AccumulatingLinear::apply(product_operand(x, type), product_operand(weight, type).detach(),
                                   b, torch::TensorList(weights), torch::TensorList(biases), false,
                                   row_multiple);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (!bias.defined()) return linear(x, std::vector<torch::Tensor>{weight}, {});
  return linear(x, std::vector<torch::Tensor>{weight}, std::vector<torch::Tensor>{bias});
}

torch::Tensor bf16_emulated_matmul(const torch::Tensor& a, const torch::Tensor& b) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return torch::matmul(bf16_rounded(a), bf16_rounded(b)).to(torch::kBFloat16);
}

torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b, double alpha) {
  const auto scaled = alpha == 1.0 ? a : a * alpha;
  if (emulate_bf16_products(a)) return bf16_emulated_matmul(scaled, b);
  return torch::matmul(scaled, b);
}

}  // namespace xlme::ops
