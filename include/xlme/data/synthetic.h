// Synthetic micro-batches for --benchmark, the trainer's dry run and tests.
#pragma once

#include "xlme/data/batch.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::data {

// Random pieces at a fixed shape, framed (<s> x </s>, or <s> e </s> f </s> with e the first half)
// and masked with mask_ratio (every selected piece shown as <mask>) by the one framing and masking
// of the pipeline (framing.h, masking.h). Each sequence is a function of (seed, task, its index
// in the stream). Rank r of R takes sequences [c + rB, c + rB + B) of the stream at cursor c,
// then all advance by RB: one process with batch RB reads what R ranks with batch B read
// together, and a batch of 2B equals two consecutive batches of B.
class SyntheticBatches : public BatchSource {
 public:
  SyntheticBatches(const SpecialIds& special, int64_t batch_size, int64_t length, double mask_ratio,
                   uint64_t seed, int rank = 0, int world_size = 1);

  // Monolingual sequences framed as two sentences <s> a </s> b </s>, a the first half, like
  // translation pairs (TaskBatchOptions::sentence_pairs, VECO); off: <s> x </s>.
  void set_sentence_pairs(bool on) { sentence_pairs_ = on; }

  Batch next(Task task) override;
  std::string state() const override;  // "<mono index> <para index>"
  // The cursors are global, equal on every rank: any saved rank's state will do.
  void restore(const std::vector<std::string>& saved) override;

 private:
  SpecialIds special_;
  int64_t batch_size_;
  int64_t length_;
  double mask_ratio_;
  uint64_t seed_;
  int rank_;
  int world_size_;
  bool sentence_pairs_ = false;
  int64_t cursor_[2] = {0, 0};  // per task: the stream position of the next micro-batch
};

}  // namespace xlme::data
