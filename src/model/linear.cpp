#include "xlme/model/linear.h"

#include "xlme/common/cpu_math.h"
#include "xlme/model/own_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>

namespace xlme::model {

void init_normal(std::initializer_list<torch::nn::Linear*> layers, double std) {
  torch::NoGradGuard no_grad;
  for (auto* layer : layers) {
    (*layer)->weight.normal_(0.0, std);
    (*layer)->bias.zero_();
  }
}

torch::nn::Linear normal_linear(int64_t in, int64_t out, double std) {
  torch::nn::Linear layer(in, out);
  init_normal({&layer}, std);
  return layer;
}

bool cpu_has_fast_bf16_products() {
  static const bool fast = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  }();
  return fast;
}

bool emulate_bf16_products(const torch::Tensor& x) {
  return x.device().is_cpu() && at::autocast::is_autocast_enabled(at::kCPU) &&
         at::autocast::get_autocast_dtype(at::kCPU) == at::kBFloat16 &&
         !cpu_has_fast_bf16_products();
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

namespace {

// gelu(c + b) over the rows of c [N, F] with b [F]; backward: the gradients of c and b.
class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& c,
                               const torch::Tensor& b) {
    const auto cc = c.contiguous(), bc = b.contiguous();
    auto out = torch::empty_like(cc);
    const int64_t rows = cc.size(0), width = cc.size(1);
    AT_DISPATCH_FLOATING_TYPES(cc.scalar_type(), "bias_gelu", [&] {
      const scalar_t* cs = cc.data_ptr<scalar_t>();
      const scalar_t* bs = bc.data_ptr<scalar_t>();
      scalar_t* o = out.data_ptr<scalar_t>();
      at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / width),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t r = begin; r < end; ++r) {
                           cpu::bias_gelu_row(cs + r * width, bs, o + r * width, width);
                         }
                       });
    });
    ctx->save_for_backward({cc, bc});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& c = saved[0];
    const auto& b = saved[1];
    const auto g = grads[0].contiguous();
    auto dc = torch::empty_like(c);
    const int64_t rows = c.size(0), width = c.size(1);
    // Each thread sums its rows' bias gradients into a row of its own; the rows are added at the
    // end.
    const int threads = at::get_num_threads();
    auto partial = torch::zeros({threads, width}, c.options());
    AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "bias_gelu_backward", [&] {
      const scalar_t* gs = g.data_ptr<scalar_t>();
      const scalar_t* cs = c.data_ptr<scalar_t>();
      const scalar_t* bs = b.data_ptr<scalar_t>();
      scalar_t* d = dc.data_ptr<scalar_t>();
      scalar_t* sums = partial.data_ptr<scalar_t>();
      at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / width),
                       [&](int64_t begin, int64_t end) {
                         scalar_t* own = sums + at::get_thread_num() * width;
                         for (int64_t r = begin; r < end; ++r) {
                           cpu::bias_gelu_backward_row(gs + r * width, cs + r * width, bs,
                                                       d + r * width, own, width);
                         }
                       });
    });
    return {dc, partial.sum(0)};
  }
};

bool bias_gelu_fits(const torch::Tensor& x, const torch::Tensor& weight,
                    const torch::Tensor& bias) {
  const auto dtype = x.scalar_type();
  return own_cpu_kernel(OwnKernel::kLinearGelu) && bias.defined() && x.device().is_cpu() &&
         !at::autocast::is_autocast_enabled(at::kCPU) &&
         (dtype == torch::kFloat32 || dtype == torch::kFloat64) && weight.scalar_type() == dtype &&
         bias.scalar_type() == dtype && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
         x.numel() > 0;
}

}  // namespace

torch::Tensor linear_gelu(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias) {
  if (!bias_gelu_fits(x, weight, bias)) return torch::gelu(linear(x, weight, bias));
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  const auto product = torch::mm(x.reshape({-1, x.size(-1)}), weight.t());  // [N, F]
  return BiasGeluFunction::apply(product, bias).view(sizes);
}

}  // namespace xlme::model
