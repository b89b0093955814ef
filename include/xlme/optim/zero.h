// ZeRO-1 (train.zero=1): each rank keeps AdamW's moments for its shard of the parameters' elements
// only (2 x 4 bytes per parameter / world instead of 8), and steps that shard. The checkpoint keeps
// MultiTensorAdamW's format (whole moments per parameter): the state is gathered when saved and
// each rank takes its shard when loaded, so that a checkpoint resumes on any number of ranks, with
// or without ZeRO (docs/pretraining.md#scaling-to-64-gpus).
#pragma once

#include "xlme/config/config.h"

#include <torch/optim/adamw.h>

#include <cstdint>
#include <vector>

namespace xlme::optim {

// Elements [param_offset, param_offset + size) of parameter `param` (flattened) are this rank's,
// at [shard_offset, shard_offset + size) of the shard's flat buffers.
struct ShardSegment {
  std::size_t param = 0;
  int64_t param_offset = 0;
  int64_t shard_offset = 0;
  int64_t size = 0;
};

class ShardedAdamW {
 public:
  // `parameters`: the trainer's parameters (those without requires_grad are never stepped);
  // `segments`: this rank's pieces of them; `shard_size`: elements of the shard's buffers.
  ShardedAdamW(std::vector<torch::Tensor> parameters, std::vector<ShardSegment> segments,
               int64_t shard_size, const config::TrainConfig& train);

  // One AdamW step with learning rate `lr` of this rank's elements of every parameter marked in
  // `present` (a gradient on some rank; the others are left alone, as MultiTensorAdamW leaves a
  // parameter without a gradient), from `gradients` [shard_size], the shard of the summed
  // gradients. Each parameter counts its own steps, on every rank, as MultiTensorAdamW does, with
  // the same fused kernel: the elements equal MultiTensorAdamW's up to the kernel's rounding.
  void step(const torch::Tensor& gradients, const std::vector<char>& present, double lr);

  // [shard_size] first and second moments of this rank's elements.
  const torch::Tensor& exp_avg() const { return exp_avg_; }
  const torch::Tensor& exp_avg_sq() const { return exp_avg_sq_; }

  // Takes this rank's shard of `full`'s state (a MultiTensorAdamW over the same parameters, as
  // loaded from a checkpoint) and empties that state, so that no rank keeps the whole of it.
  void take_shard_of(torch::optim::AdamW& full);
  // Puts the whole state into `full`'s (empty) state for a checkpoint: `exp_avg` and `exp_avg_sq`
  // per parameter (every rank's shards gathered; undefined for parameters never stepped).
  void put_whole_into(torch::optim::AdamW& full, const std::vector<torch::Tensor>& exp_avg,
                      const std::vector<torch::Tensor>& exp_avg_sq) const;

 private:
  std::vector<torch::Tensor> parameters_;
  std::vector<ShardSegment> segments_;
  config::TrainConfig train_;
  torch::Tensor exp_avg_, exp_avg_sq_;  // [shard_size], float32
  std::vector<int64_t> steps_;          // per parameter, as MultiTensorAdamW's state counts them
};

}  // namespace xlme::optim
