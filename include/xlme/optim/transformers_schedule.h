// The learning-rate schedule of fine-tuning as XTREME's scripts run it (transformers'
// get_linear_schedule_with_warmup), beside pre-training's LinearSchedule (schedule.h).
#pragma once

#include <cstdint>

namespace xlme::optim {

// Fine-tuning's schedule as XTREME's scripts run it: transformers'
// get_linear_schedule_with_warmup, stepped after each update, so update k (0-based) runs at
// peak * k / warmup during warm-up (the first at 0) and at peak * (total - k) / (total - warmup)
// after it. A warm-up longer than the run is not cut: the rate then never reaches the peak.
class TransformersLinearSchedule {
 public:
  // `total` > 0 and `warmup` >= 0 (any length); throws xlme::Error otherwise.
  TransformersLinearSchedule(double peak, int64_t warmup, int64_t total);

  // Learning rate of update number `step` (0-based; a run's are 0 .. total - 1).
  double lr(int64_t step) const;

 private:
  double peak_;
  int64_t warmup_;
  int64_t total_;
};

}  // namespace xlme::optim
