// The one token-budget bucketing (docs/ARCHITECTURE.md#data), for training's pools and the held-out
// batches: sequences of similar length share a micro-batch, so padding stays small.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace xlme::data {

struct Buckets {
  std::vector<int64_t> order;  // the sequences by ascending length (stable: ties keep their order)
  std::vector<std::pair<int64_t, int64_t>> batches;  // [begin, end) into `order`, in order
};

// Sorts sequences of `lengths` tokens by length and cuts them greedily so that rows x longest row
// <= `budget` tokens (a longer sequence makes a micro-batch alone).
Buckets bucket_by_length(const std::vector<int64_t>& lengths, int64_t budget);

}  // namespace xlme::data
