#include "xlme/ops/linear.h"

#include "xlme/ops/registry.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

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

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (emulate_bf16_products(x)) return bf16_emulated_linear(x, weight, bias);
  return torch::linear(x, weight, bias);
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
