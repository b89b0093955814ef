// What the data pipeline hands a training step.
// The data pipeline fills these; the model, the objectives and the trainer only read them.
#pragma once

#include "xlme/data/special_ids.h"

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::data {

// One micro-batch of one task, masked and ready for the generator.
struct Batch {
  Task task = Task::kMono;
  torch::Tensor input_ids;  // [B, T] int64: tokens, selected positions replaced by <mask>
  torch::Tensor labels;     // [B, T] int64: the original tokens
  torch::Tensor masked;     // [B, T] bool: positions selected for prediction (never special)
  torch::Tensor padding;    // [B, T] bool: true at <pad>
  torch::Tensor positions;  // [B, T] int64: absolute position ids (TRTD may restart them at f)
  int64_t real_tokens = 0;  // non-padding tokens in the batch
};

// Where the trainer gets micro-batches: the data pipeline, or synthetic batches (--benchmark,
// tests). Each rank owns one source reading its own deterministic stream. The state is small and
// restores in O(1): never by replaying batches.
class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // The next micro-batch of `task` (host tensors).
  virtual Batch next(Task task) = 0;

  // This rank's reader state, saved into checkpoints.
  virtual std::string state() const = 0;

  // Continues from a checkpoint: `saved` holds the state() of every rank of the run that wrote
  // it, in rank order. Their number may differ from the current number of ranks: the source
  // re-splits the streams so that no data is repeated or skipped beyond one micro-batch per rank.
  virtual void restore(const std::vector<std::string>& saved) = 0;

  // A table of what was read per language for the log ("" when the source has no languages).
  virtual std::string language_report() const { return {}; }
};

}  // namespace xlme::data
