#include "xlme/ops/weight_gradient.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/ops/registry.h"

#include <torch/torch.h>

namespace xlme::ops {

bool adds_into_buffer(const torch::Tensor& weight) {
  if (implementation(Op::kWeightGradient, weight.device()) != Impl::kFused) return false;
  if (!weight.requires_grad() || !weight.is_leaf()) return false;
  const auto& grad = weight.grad();
  return grad.defined() && grad.layout() == torch::kStrided && grad.sizes() == weight.sizes() &&
         grad.scalar_type() == weight.scalar_type() && grad.device() == weight.device();
}

bool weight_gradient_in_place(const torch::Tensor& weight) {
  return torch::GradMode::is_enabled() && adds_into_buffer(weight);
}

namespace {

// out [out, in] = beta out + dy^T x in out's dtype, by one product; beta 0 ignores out's values.
void product_into(torch::Tensor& out, const torch::Tensor& dy, const torch::Tensor& x,
                  double beta) {
  XLME_CHECK(dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0) && out.dim() == 2 &&
                 out.size(0) == dy.size(1) && out.size(1) == x.size(1),
             "weight gradient: dy {} and x {} do not give a gradient of {}", shape_text(dy.sizes()),
             shape_text(x.sizes()), shape_text(out.sizes()));
  const auto type = out.scalar_type();
  if (dy.scalar_type() == type && x.scalar_type() == type) {
    out.addmm_(dy.t(), x, beta);
    return;
  }
  const bool half = dy.scalar_type() == torch::kBFloat16 || dy.scalar_type() == torch::kFloat16;
  if (out.is_cuda() && half && x.scalar_type() == dy.scalar_type() && type == torch::kFloat32) {
    // cuBLAS: half-precision operands, fp32 accumulation and output, C = A B + beta C.
    at::addmm_out(out, out, dy.t(), x, torch::kFloat32, beta);
    return;
  }
  // Elsewhere in out's dtype: the products of bf16 or fp16 values are exact in fp32.
  out.addmm_(dy.t().to(type), x.to(type), beta);
}

}  // namespace

torch::Tensor gradient_operand(const torch::Tensor& t, const torch::Tensor& weight) {
  return t.is_cuda() ? t : t.to(weight.scalar_type());
}

void accumulate_weight_gradient(torch::Tensor& main_grad, const torch::Tensor& dy,
                                const torch::Tensor& x) {
  product_into(main_grad, dy, x, 1.0);
}

torch::Tensor weight_gradient(const torch::Tensor& weight, const torch::Tensor& dy,
                              const torch::Tensor& x) {
  if (!weight.requires_grad()) return {};
  if (adds_into_buffer(weight)) {
    auto grad = weight.grad();
    product_into(grad, dy, x, 1.0);
    return gradient_added_in_place(weight);
  }
  auto grad = torch::empty(weight.sizes(), weight.options().requires_grad(false));
  product_into(grad, dy, x, 0.0);
  return grad;
}

torch::Tensor gradient_added_in_place(const torch::Tensor& weight) {
  auto values_shape = weight.sizes().vec();
  values_shape[0] = 0;
  return at::_sparse_coo_tensor_unsafe(
             torch::empty({1, 0}, weight.options().dtype(torch::kInt64).requires_grad(false)),
             torch::empty(values_shape, weight.options().requires_grad(false)), weight.sizes())
      ._coalesced_(true);
}

}  // namespace xlme::ops
