// The switch over xlme's own CPU kernels: each can be turned off at run time, falling back to
// LibTorch's own operations, so that one binary can time both (docs/performance.md, "Own CPU
// kernels"). Only the kernels that make the `cpu_small` step at least 10% faster or 10% leaner
// are kept; today that is dropout's mask alone. XLME_OWN_CPU_KERNELS, read once per process:
//   all (the default) | none | -name,-name (all but these) | name,name (only these)
// An unknown name is an error that lists the valid ones.
#pragma once

#include <string>

namespace xlme::model {

enum class OwnKernel {
  kDropout,  // dropout.h: the counter-based CPU mask (else torch::dropout)
};

// Whether `kernel` is on (XLME_OWN_CPU_KERNELS, or the last set_own_cpu_kernels).
bool own_cpu_kernel(OwnKernel kernel);

// Sets the switch from a value as XLME_OWN_CPU_KERNELS takes it (tests and benchmarks).
void set_own_cpu_kernels(const std::string& spec);

}  // namespace xlme::model
