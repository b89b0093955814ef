#include "xlme/data/masking.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace xlme::data {

void mask_row(int64_t* input, bool* masked, int64_t length, const SpecialIds& ids,
              const MaskOptions& options, Rng& rng) {
  // Scratch reused across rows and batches: no allocation per row on a loader thread.
  thread_local std::vector<int64_t> candidates;
  candidates.clear();
  for (int64_t i = 0; i < length; ++i) {
    if (!ids.is_special(input[i])) candidates.push_back(i);
  }
  const auto n = static_cast<int64_t>(candidates.size());
  const int64_t k = std::min<int64_t>(
      n, static_cast<int64_t>(options.ratio * static_cast<double>(n) + rng.uniform()));
  for (int64_t q = 0; q < k; ++q) {
    std::swap(candidates[q], candidates[q + static_cast<int64_t>(rng.below(n - q))]);
    const int64_t i = candidates[q];
    masked[i] = true;
    if (rng.uniform() < options.token_ratio) input[i] = ids.mask;
  }
}

}  // namespace xlme::data
