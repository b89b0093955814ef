// The switch over xlme's own CPU kernels: each hand-written CPU path can be turned off at run
// time, falling back to LibTorch's own operations, so that one binary can time both
// (docs/performance.md#own-cpu-kernels). XLME_OWN_CPU_KERNELS, read once per process:
//   all (the default) | none | -name,-name (all but these) | name,name (only these)
// An unknown name is an error that lists the valid ones.
#pragma once

#include <string>
#include <vector>

namespace xlme::model {

enum class OwnKernel {
  kAttentionProbs,   // attention_probs.h: bias, softmax and dropout in one autograd function
  kPositionBias,     // add_position_bias' CPU loops (else its ATen operations)
  kBatchedMatmul,    // batched_matmul.h: the batch over LibTorch's threads, one BLAS call each
  kLinearGelu,       // linear.h: mm, then bias + GELU in one pass
  kResidualDropout,  // dropout.h: x + dropout(y) in one pass, the mask as bytes
  kDropout,          // dropout.h: the counter-based mask (else torch::dropout)
  kCrossEntropy,     // objectives.h: the generator's cross-entropy and accuracy in one pass
  kSampler,          // electra.h: the inverse-CDF draw (else Gumbel-max)
  kForeachAdamW,     // optimizer.h: the _foreach_ AdamW on the CPU (else at::_fused_adamw_)
};

// Every kernel's name as XLME_OWN_CPU_KERNELS spells it, in OwnKernel's order.
const std::vector<std::string>& own_kernel_names();

// Whether `kernel` is on (XLME_OWN_CPU_KERNELS, or the last set_own_cpu_kernels).
bool own_cpu_kernel(OwnKernel kernel);

// Sets the switch from a value as XLME_OWN_CPU_KERNELS takes it (tests and benchmarks).
void set_own_cpu_kernels(const std::string& spec);

// The kernels that are off, comma-separated ("" when all are on).
std::string own_cpu_kernels_off();

}  // namespace xlme::model
