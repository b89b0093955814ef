#include "xlme/ops/dropout.h"

#include "xlme/common/error.h"
#include "xlme/ops/registry.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>

namespace xlme::ops {

namespace {

// SplitMix64 (Steele, Lea & Flood 2014): a 64-bit mix of a counter; consecutive counters give
// independent-looking 64-bit draws, two 32-bit draws each.
uint64_t split_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// LibTorch's default CPU generator draws the seed (what dropout() does for each call).
uint64_t next_seed() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CPUGeneratorImpl>()->random64();
}

// out[i] = keep where element i is kept, else 0: pairs of elements per draw; grain: ~32k
// elements per task.
template <typename T>
void fill_mask(T* out, int64_t n, uint64_t seed, uint64_t threshold, T keep) {
  at::parallel_for(0, (n + 1) / 2, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const uint64_t draw = split_mix64(seed ^ split_mix64(static_cast<uint64_t>(pair)));
      const int64_t i = 2 * pair;
      out[i] = (draw & 0xFFFFFFFFULL) >= threshold ? keep : T(0);
      if (i + 1 < n) out[i + 1] = (draw >> 32) >= threshold ? keep : T(0);
    }
  });
}

}  // namespace

torch::Tensor dropout_mask(torch::IntArrayRef sizes, double p, uint64_t seed,
                           const torch::TensorOptions& options) {
  XLME_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got {}", p);
  XLME_CHECK(options.device().is_cpu(), "dropout_mask fills CPU tensors, not {}",
             options.device().str());
  const auto threshold = static_cast<uint64_t>(std::llround(std::ldexp(p, 32)));
  auto mask = torch::empty(sizes, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, mask.scalar_type(), "dropout_mask", [&] {
        fill_mask<scalar_t>(mask.data_ptr<scalar_t>(), mask.numel(), seed, threshold,
                            static_cast<scalar_t>(1.0 / (1.0 - p)));
      });
  return mask;
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  if (implementation(Op::kDropout, x.device()) == Impl::kReference) {
    return torch::dropout(x, p, /*train=*/true);
  }
  return x * dropout_mask(x.sizes(), p, next_seed(), x.options());
}

}  // namespace xlme::ops
