#include "xlme/model/dropout.h"

#include "xlme/common/error.h"

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

torch::Tensor dropout_mask(torch::IntArrayRef sizes, double p, uint64_t seed,
                           const torch::TensorOptions& options) {
  XLME_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got {}", p);
  XLME_CHECK(options.device().is_cpu(), "dropout_mask fills CPU tensors, not {}",
             options.device().str());
  auto mask = torch::empty(sizes, options);
  const DropoutDraws draws(p, seed);
  const int64_t n = mask.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, mask.scalar_type(), "dropout_mask", [&] {
        scalar_t* out = mask.data_ptr<scalar_t>();
        const auto keep = static_cast<scalar_t>(1.0 / (1.0 - p));
        const auto drop = static_cast<scalar_t>(0);
        // Pairs of elements per draw; grain: ~32k elements per task.
        at::parallel_for(0, (n + 1) / 2, 16384, [&](int64_t begin, int64_t end) {
          for (int64_t pair = begin; pair < end; ++pair) {
            const uint64_t draw = draws.pair_draw(pair);
            const int64_t i = 2 * pair;
            out[i] = draws.keeps_draw(draw & 0xFFFFFFFFULL) ? keep : drop;
            if (i + 1 < n) out[i + 1] = draws.keeps_draw(draw >> 32) ? keep : drop;
          }
        });
      });
  return mask;
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  if (!x.device().is_cpu()) return torch::dropout(x, p, /*train=*/true);
  return x * dropout_mask(x.sizes(), p, DropoutDraws::next_seed(), x.options());
}

}  // namespace xlme::model
