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

// Runs `work` under LibTorch's (legacy, CPU-side) profiler and returns every operator's time,
// largest self time first. On a GPU the times are the host's (launch) times.
std::vector<OpTime> profile_ops(const std::function<void()>& work);

// A fixed-width table: operator, calls, self and total milliseconds per step, self share of the
// profiled wall time.
std::string format_op_table(const std::vector<OpTime>& ops, int64_t steps, double wall_ms,
                            size_t max_rows);

}  // namespace xlme::train
