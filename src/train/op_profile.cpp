#include "xlme/train/op_profile.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <map>
#include <utility>

namespace xlme::train {

namespace profiler = torch::autograd::profiler;

std::vector<OpTime> profile_ops(const std::function<void()>& work, bool device_time) {
  std::map<std::string, OpTime> by_name;
  {
    const auto collect = [&](const profiler::thread_event_lists& threads) {
      for (const auto& events : threads) {
        // Ranges nest on one thread: a stack of (push event, time spent in children).
        std::vector<std::pair<const profiler::LegacyEvent*, double>> open;
        for (const auto& event : events) {
          if (event.kind() == profiler::EventKind::PushRange) {
            open.emplace_back(&event, 0.0);
          } else if (event.kind() == profiler::EventKind::PopRange && !open.empty()) {
            const auto [push, children_us] = open.back();
            open.pop_back();
            // With device_time, the CUDA events recorded at the range's push and pop on the
            // current stream: the device time the operator's kernels spanned.
            const double us = device_time && push->hasCuda() && event.hasCuda()
                                  ? push->cudaElapsedUs(event)
                                  : push->cpuElapsedUs(event);
            OpTime& op = by_name[push->name()];
            op.calls += 1;
            op.total_ms += us / 1000;
            op.self_ms += (us - children_us) / 1000;
            if (!open.empty()) open.back().second += us;
          }
        }
      }
    };
    profiler::TLSLegacyProfilerGuard guard(
        torch::profiler::impl::ProfilerConfig(device_time
                                                  ? torch::profiler::impl::ProfilerState::CUDA
                                                  : torch::profiler::impl::ProfilerState::CPU),
        collect);
    work();
  }
  std::vector<OpTime> ops;
  for (auto& [name, op] : by_name) {
    op.name = name;
    ops.push_back(std::move(op));
  }
  std::sort(ops.begin(), ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return ops;
}

std::string format_op_table(const std::vector<OpTime>& ops, int64_t steps, double wall_ms,
                            size_t max_rows) {
  std::string out = fmt::format("{:<48} {:>8} {:>12} {:>12} {:>7}\n", "operator", "calls/step",
                                "self ms/step", "total ms/st", "self %");
  for (size_t i = 0; i < ops.size() && i < max_rows; ++i) {
    const OpTime& op = ops[i];
    out += fmt::format("{:<48} {:>8.1f} {:>12.2f} {:>12.2f} {:>6.1f}%\n", op.name.substr(0, 48),
                       static_cast<double>(op.calls) / steps, op.self_ms / steps,
                       op.total_ms / steps, 100 * op.self_ms / wall_ms);
  }
  return out;
}

}  // namespace xlme::train
