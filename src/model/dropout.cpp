#include "xlme/model/dropout.h"

#include "xlme/common/error.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>

namespace xlme::model {

namespace {

// SplitMix64 (Steele, Lea & Flood 2014): a 64-bit mix of a counter; consecutive counters give
// independent-looking 64-bit draws, two 32-bit draws each.
inline uint64_t split_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t seed_from_default_generator() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CPUGeneratorImpl>()->random64();
}

}  // namespace

torch::Tensor dropout_mask(torch::IntArrayRef sizes, double p, uint64_t seed,
                           const torch::TensorOptions& options) {
  XLME_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got {}", p);
  XLME_CHECK(options.device().is_cpu(), "dropout_mask fills CPU tensors, not {}",
             options.device().str());
  auto mask = torch::empty(sizes, options);
  // Dropped when the 32-bit draw is below p * 2^32 (rounded): P(drop) = p within 2^-33.
  const auto threshold = static_cast<uint64_t>(std::llround(std::ldexp(p, 32)));
  const int64_t n = mask.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, mask.scalar_type(), "dropout_mask", [&] {
        scalar_t* out = mask.data_ptr<scalar_t>();
        const auto keep = static_cast<scalar_t>(1.0 / (1.0 - p));
        const auto drop = static_cast<scalar_t>(0);
        // Pairs of elements per draw; grain: ~32k elements per task.
        at::parallel_for(0, (n + 1) / 2, 16384, [&](int64_t begin, int64_t end) {
          for (int64_t pair = begin; pair < end; ++pair) {
            const uint64_t draw = split_mix64(seed ^ split_mix64(static_cast<uint64_t>(pair)));
            const int64_t i = 2 * pair;
            out[i] = (draw & 0xFFFFFFFFULL) < threshold ? drop : keep;
            if (i + 1 < n) out[i + 1] = (draw >> 32) < threshold ? drop : keep;
          }
        });
      });
  return mask;
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  if (!x.device().is_cpu()) return torch::dropout(x, p, /*train=*/true);
  return x * dropout_mask(x.sizes(), p, seed_from_default_generator(), x.options());
}

}  // namespace xlme::model
