// The global batch of a step: how many micro-batches of train.micro_batch_tokens each rank runs so
// that a step holds train.tokens_per_task tokens of each task over all ranks, and the error that
// says what to change when the world size does not divide it.
#pragma once

#include "xlme/config/config.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace xlme::train {

// A step's global batch for each task: micro-batches of train.micro_batch_tokens per rank, and the
// tokens they make over all ranks.
struct GlobalBatch {
  int64_t micro_batches = 1;
  int64_t tokens_per_step = 0;
};

// The global batch on `world_size` ranks: train.tokens_per_task when it is a whole number of
// micro-batches over the ranks, else rounded as train.batch_rounding says (up / down to whole
// micro-batches per rank); nullopt where batch_rounding=error refuses or rounding down leaves none.
std::optional<GlobalBatch> try_global_batch(const config::TrainConfig& train, int world_size);
// try_global_batch, or an error that says why and lists the nearest world sizes that divide
// train.tokens_per_task evenly and what up and down would give.
GlobalBatch global_batch(const config::TrainConfig& train, int world_size);
// The world sizes (1..4096) on which try_global_batch gives `tokens_per_step` tokens, the
// `count` nearest to `world_size` first, returned in increasing order.
std::vector<int> world_sizes_with(const config::TrainConfig& train, int64_t tokens_per_step,
                                  int world_size, std::size_t count = 4);
// Rank 0's start-up line: the tokens per step of `batch`, and a warning with the change in percent
// when train.batch_rounding rounded train.tokens_per_task.
void log_global_batch(const GlobalBatch& batch, const config::TrainConfig& train, int world_size);

}  // namespace xlme::train
