#include "xlme/optim/schedule.h"

#include "xlme/common/error.h"

#include <algorithm>

namespace xlme::optim {

LinearSchedule::LinearSchedule(double peak, int64_t warmup, int64_t total)
    : peak_(peak), warmup_(warmup), total_(total) {
  XLME_CHECK(total > 0 && warmup >= 0 && warmup <= total,
             "learning-rate schedule: warm-up {} must be in [0, total steps {}]", warmup, total);
}

double LinearSchedule::lr(int64_t step) const {
  if (step < warmup_) return peak_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (warmup_ == total_) return peak_;
  const int64_t remaining = std::max<int64_t>(total_ - step, 0);
  return peak_ * static_cast<double>(remaining) / static_cast<double>(total_ - warmup_);
}

}  // namespace xlme::optim
