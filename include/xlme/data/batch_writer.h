// Writes framed sequences (framing.h) as the rows of one micro-batch and masks them (masking.h):
// the one assembly of training, held-out and synthetic micro-batches.
#pragma once

#include "xlme/data/batch.h"
#include "xlme/data/masking.h"
#include "xlme/data/sampler.h"

#include <cstdint>
#include <vector>

namespace xlme::data {

class BatchWriter {
 public:
  // A [rows, width] micro-batch of `task` (host tensors, pinned when `pinned`); every row must be
  // written.
  BatchWriter(Task task, int64_t rows, int64_t width, const SpecialIds& ids, bool pinned);

  // Row `row`: `tokens` (at most width), then <pad>; positions count from 0, or restart at 1 from
  // `second` (where f starts, 0 for none) when `reset_positions` (data.reset_positions); then
  // masked with mask_row and `rng`.
  void write(int64_t row, const std::vector<int32_t>& tokens, size_t second, bool reset_positions,
             const MaskOptions& mask, Rng& rng);

  Batch& batch() { return batch_; }

 private:
  SpecialIds ids_;
  int64_t width_;
  Batch batch_;
};

}  // namespace xlme::data
