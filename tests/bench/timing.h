// Timing for the benchmark commands in tests/bench/.
#pragma once

#include <chrono>
#include <functional>

namespace xlme::bench {

// Mean milliseconds of `fn` over `steps` runs, after one warm-up run.
inline double time_ms(int steps, const std::function<void()>& fn) {
  fn();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
             .count() /
         steps;
}

}  // namespace xlme::bench
