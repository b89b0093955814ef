#include "xlme/model/own_kernels.h"

#include "xlme/common/error.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace xlme::model {

namespace {

// Every kernel's name as XLME_OWN_CPU_KERNELS spells it, in OwnKernel's order.
const std::vector<std::string>& kernel_names() {
  static const std::vector<std::string> names{"dropout"};
  return names;
}

uint32_t bit(size_t index) {
  return uint32_t{1} << index;
}

uint32_t all_bits() {
  return bit(kernel_names().size()) - 1;
}

uint32_t parse(const std::string& spec) {
  const auto& names = kernel_names();
  std::vector<std::string> tokens;
  std::stringstream stream(spec);
  for (std::string token; std::getline(stream, token, ',');) {
    if (!token.empty()) tokens.push_back(token);
  }
  // "-name" turns a kernel off (starting from all), "name" on (starting from none).
  uint32_t on =
      tokens.empty() || tokens.front() == "all" || tokens.front().front() == '-' ? all_bits() : 0;
  for (const auto& token : tokens) {
    if (token == "all" || token == "none") {
      on = token == "all" ? all_bits() : 0;
      continue;
    }
    const bool off = token.front() == '-';
    const auto name = off ? token.substr(1) : token;
    const auto it = std::find(names.begin(), names.end(), name);
    XLME_CHECK(it != names.end(),
               "XLME_OWN_CPU_KERNELS: unknown kernel '{}' in '{}'; the kernels are {} (or all, "
               "none; -name turns one off)",
               name, spec, fmt::join(names, ", "));
    const auto b = bit(static_cast<size_t>(it - names.begin()));
    on = off ? on & ~b : on | b;
  }
  return on;
}

std::atomic<uint32_t>& state() {
  static std::atomic<uint32_t> on{[] {
    const char* env = std::getenv("XLME_OWN_CPU_KERNELS");
    return parse(env ? env : "all");
  }()};
  return on;
}

}  // namespace

bool own_cpu_kernel(OwnKernel kernel) {
  return (state().load(std::memory_order_relaxed) & bit(static_cast<size_t>(kernel))) != 0;
}

void set_own_cpu_kernels(const std::string& spec) {
  state().store(parse(spec));
}

}  // namespace xlme::model
