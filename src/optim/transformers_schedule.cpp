#include "xlme/optim/transformers_schedule.h"

#include "xlme/common/error.h"

#include <algorithm>

namespace xlme::optim {

TransformersLinearSchedule::TransformersLinearSchedule(double peak, int64_t warmup, int64_t total)
    : peak_(peak), warmup_(warmup), total_(total) {
  XLME_CHECK(total > 0 && warmup >= 0,
             "learning-rate schedule: warm-up {} must be >= 0 and total steps {} > 0", warmup,
             total);
}

double TransformersLinearSchedule::lr(int64_t step) const {
  if (step < warmup_) return peak_ * static_cast<double>(step) / static_cast<double>(warmup_);
  const int64_t remaining = std::max<int64_t>(total_ - step, 0);
  return peak_ * static_cast<double>(remaining) /
         static_cast<double>(std::max<int64_t>(total_ - warmup_, 1));
}

}  // namespace xlme::optim
