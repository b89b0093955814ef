// Where a step's time goes, per LibTorch operator: `xlme-pretrain --benchmark N --profile FILE`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace xlme::train {

// One operator's time over the profiled steps. Self time excludes the operators it called (e.g.
// aten::linear's self time excludes its aten::addmm); backward nodes appear under their autograd
// names (e.g. "MmBackward0"), so that forward and backward can be told apart.
struct OpTime {
  std::string name;
  int64_t calls = 0;
  double total_ms = 0;  // inclusive
  double self_ms = 0;   // exclusive
};

// Runs `work` under LibTorch's legacy profiler and returns every operator's time, largest self
// time first. The times are the host's unless `device_time` (on CUDA): then each operator's
// range is timed by CUDA events recorded on the current stream at its start and end, the device
// time its kernels spanned (LibTorch's old `use_cuda=True`), gaps between launches included.
std::vector<OpTime> profile_ops(const std::function<void()>& work, bool device_time = false);

// A fixed-width table: operator, calls, self and total milliseconds per step, self share of the
// profiled wall time.
std::string format_op_table(const std::vector<OpTime>& ops, int64_t steps, double wall_ms,
                            size_t max_rows);

}  // namespace xlme::train
