#include "xlme/model/dropout.h"

#include "xlme/common/error.h"
#include "xlme/model/own_kernels.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>

namespace xlme::model {

DropoutDraws::DropoutDraws(double p, uint64_t seed)
    : seed_(seed), threshold_(static_cast<uint64_t>(std::llround(std::ldexp(p, 32)))) {
  XLME_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got {}", p);
}

uint64_t DropoutDraws::next_seed() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CPUGeneratorImpl>()->random64();
}

namespace {

// out[i] = keep where DropoutDraws keeps element i, else 0: pairs of elements per draw; grain:
// ~32k elements per task.
template <typename T>
void fill_mask(T* out, int64_t n, const DropoutDraws& draws, T keep) {
  at::parallel_for(0, (n + 1) / 2, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const uint64_t draw = draws.pair_draw(pair);
      const int64_t i = 2 * pair;
      out[i] = draws.keeps_draw(draw & 0xFFFFFFFFULL) ? keep : T(0);
      if (i + 1 < n) out[i + 1] = draws.keeps_draw(draw >> 32) ? keep : T(0);
    }
  });
}

}  // namespace

torch::Tensor dropout_mask(torch::IntArrayRef sizes, double p, uint64_t seed,
                           const torch::TensorOptions& options) {
  XLME_CHECK(options.device().is_cpu(), "dropout_mask fills CPU tensors, not {}",
             options.device().str());
  const DropoutDraws draws(p, seed);  // checks p
  auto mask = torch::empty(sizes, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, mask.scalar_type(), "dropout_mask", [&] {
        fill_mask<scalar_t>(mask.data_ptr<scalar_t>(), mask.numel(), draws,
                            static_cast<scalar_t>(1.0 / (1.0 - p)));
      });
  return mask;
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  if (!x.device().is_cpu() || !own_cpu_kernel(OwnKernel::kDropout)) {
    return torch::dropout(x, p, /*train=*/true);
  }
  return x * dropout_mask(x.sizes(), p, DropoutDraws::next_seed(), x.options());
}

namespace {

// The keep mask of dropout_mask as bytes (1 kept, 0 dropped).
torch::Tensor keep_bytes(int64_t n, const DropoutDraws& draws) {
  auto keep = torch::empty({n}, torch::kUInt8);
  fill_mask<uint8_t>(keep.data_ptr<uint8_t>(), n, draws, 1);
  return keep;
}

class ResidualDropoutFunction : public torch::autograd::Function<ResidualDropoutFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& y, double p) {
    const auto xc = x.contiguous(), yc = y.contiguous();
    const int64_t n = yc.numel();
    const auto keep = keep_bytes(n, DropoutDraws(p, DropoutDraws::next_seed()));
    auto out = torch::empty_like(yc);
    AT_DISPATCH_FLOATING_TYPES(yc.scalar_type(), "residual_dropout", [&] {
      const scalar_t* xs = xc.data_ptr<scalar_t>();
      const scalar_t* ys = yc.data_ptr<scalar_t>();
      const uint8_t* k = keep.data_ptr<uint8_t>();
      scalar_t* o = out.data_ptr<scalar_t>();
      const auto scale = static_cast<scalar_t>(1.0 / (1.0 - p));
      at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
        // Branch-free (a random 10% of branches mispredicted cost more than the pass): the mask
        // value scale * keep is scale or 0 exactly, so y * mask is dropout's product.
        for (int64_t i = begin; i < end; ++i) {
          o[i] = xs[i] + ys[i] * (scale * static_cast<scalar_t>(k[i]));
        }
      });
    });
    ctx->save_for_backward({keep});
    ctx->saved_data["p"] = p;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto keep = ctx->get_saved_variables()[0];
    const double p = ctx->saved_data["p"].toDouble();
    const auto grad = grads[0].contiguous();
    auto dy = torch::empty_like(grad);
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "residual_dropout_backward", [&] {
      const scalar_t* g = grad.data_ptr<scalar_t>();
      const uint8_t* k = keep.data_ptr<uint8_t>();
      scalar_t* d = dy.data_ptr<scalar_t>();
      const auto scale = static_cast<scalar_t>(1.0 / (1.0 - p));
      at::parallel_for(0, grad.numel(), 32768, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) d[i] = g[i] * (scale * static_cast<scalar_t>(k[i]));
      });
    });
    return {grads[0], dy, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor residual_dropout(const torch::Tensor& x, const torch::Tensor& y, double p,
                               bool training) {
  const auto dtype = y.scalar_type();
  const bool fused = own_cpu_kernel(OwnKernel::kResidualDropout) && training && p > 0.0 &&
                     y.device().is_cpu() && x.device().is_cpu() && x.sizes() == y.sizes() &&
                     x.scalar_type() == dtype &&
                     (dtype == torch::kFloat32 || dtype == torch::kFloat64);
  if (!fused) return x + model::dropout(y, p, training);
  return ResidualDropoutFunction::apply(x, y, p);
}

}  // namespace xlme::model
