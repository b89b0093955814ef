// The learning-rate schedule of XLM-E (and of BERT, ELECTRA, fairseq's polynomial_decay with
// power 1): linear warm-up from 0 to the peak, then linear decay to 0 at the last step.
#pragma once

#include <cstdint>

namespace xlme::optim {

class LinearSchedule {
 public:
  // `warmup` <= `total`; throws xlme::Error otherwise.
  LinearSchedule(double peak, int64_t warmup, int64_t total);

  // Learning rate of update number `step` (0-based: the first update is step 0). No update runs
  // at lr 0: the first gets peak / warmup, the last peak / (total - warmup).
  double lr(int64_t step) const;

 private:
  double peak_;
  int64_t warmup_;
  int64_t total_;
};

}  // namespace xlme::optim
