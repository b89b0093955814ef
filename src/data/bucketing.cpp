#include "xlme/data/bucketing.h"

#include <algorithm>
#include <numeric>

namespace xlme::data {

Buckets bucket_by_length(const std::vector<int64_t>& lengths, int64_t budget) {
  Buckets buckets;
  const auto count = static_cast<int64_t>(lengths.size());
  buckets.order.resize(lengths.size());
  std::iota(buckets.order.begin(), buckets.order.end(), int64_t{0});
  std::stable_sort(buckets.order.begin(), buckets.order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] < lengths[b]; });
  // Ascending lengths: the row just added is the batch's longest, so rows x it is its size.
  int64_t first = 0;
  for (int64_t s = 0; s < count; ++s) {
    if (s > first && (s - first + 1) * lengths[buckets.order[s]] > budget) {
      buckets.batches.emplace_back(first, s);
      first = s;
    }
  }
  if (count > first) buckets.batches.emplace_back(first, count);
  return buckets;
}

}  // namespace xlme::data
