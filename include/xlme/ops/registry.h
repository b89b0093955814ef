// The ops layer's one switch (docs/ops.md): for every fused operation, which implementation runs
// on which device. Model and objective code call the ops (ops/*.h) and never test the device
// themselves; each op asks implementation() here.
//
// Every op has a reference (composite LibTorch operations, the semantics) and fused forms: an own
// CPU kernel, a Triton kernel for CUDA (ops/triton.h), or both. XLME_OPS, read once per process,
// chooses per op:
//   auto (the default) | reference | fused          (every op)
//   op=auto|reference|fused,op=...                  (e.g. masked_lm=fused,dropout=reference)
// `auto` runs a fused form where it has been shown correct and faster on that device
// (kAutoFused below); `fused` runs the fused form wherever one exists, else the reference. An
// unknown name or value is an error that lists the valid ones.
#pragma once

#include "xlme/common/torch_fwd.h"

#include <string>
#include <vector>

namespace xlme::ops {

// Every op, once: its enumerator, its name as XLME_OPS spells it, and where its fused forms live.
// The enum, op_names() and the table of forms and `auto` choices (src/ops/registry.cpp, checked
// at compile time to hold one row per op in this order) all come from this list.
#define XLME_OP_LIST(X)                                                                           \
  /* ops/dropout.h: CPU: the counter-based mask; CUDA: none (torch::dropout) */                   \
  X(kDropout, "dropout")                                                                          \
  /* ops/masked_lm.h: CUDA: Triton loss + sampling; CPU: none (the reference) */                  \
  X(kMaskedLm, "masked_lm")                                                                       \
  /* ops/residual_layernorm.h: CUDA: Triton; CPU: none (the reference) */                         \
  X(kResidualLayerNorm, "residual_layernorm")                                                     \
  /* ops/attention.h: CUDA: Triton flash-style with the gated bias */                             \
  X(kAttention, "attention")                                                                      \
  /* model/relative_position.h: CUDA: the table's backward as a one-hot product (the */           \
  /* reference's index_select backward adds atomically) */                                        \
  X(kToeplitzBias, "toeplitz_bias")                                                               \
  /* ops/feed_forward.h: CUDA: Triton products with GELU epilogues */                             \
  X(kFeedForward, "feed_forward")                                                                 \
  /* ops/linear.h: CPU: bf16 products emulated in float32 (CPUs without AVX512, under bf16 */     \
  /* autocast); CUDA: none (cuBLAS) */                                                            \
  X(kLinear, "linear")                                                                            \
  /* ops/weight_gradient.h: linear layers and the feed-forward block add weight gradients */      \
  /* into the fp32 .grad buffers (beta 1); CPU: fp32 product; CUDA: cuBLAS bf16 x bf16 -> fp32 */ \
  X(kWeightGradient, "weight_grad")

enum class Op {
#define XLME_OP_ENUMERATOR(op, name) op,
  XLME_OP_LIST(XLME_OP_ENUMERATOR)
#undef XLME_OP_ENUMERATOR
};

// How many ops XLME_OP_LIST holds.
inline constexpr int kOpCount = 0
#define XLME_OP_COUNT(op, name) +1
    XLME_OP_LIST(XLME_OP_COUNT)
#undef XLME_OP_COUNT
    ;

enum class Impl { kReference, kFused };

// What runs for `op` on `device` under the current XLME_OPS (or the last set_ops).
Impl implementation(Op op, const c10::Device& device);

// Whether model.attention=auto runs LibTorch's scaled-dot-product attention (SDPA) rather than
// the math path on `device`: on CUDA, where SDPA's kernels are faster; on the CPU the math path
// is (docs/performance.md). Decided here, with the ops, so that model code never tests devices.
bool sdpa_by_default(const c10::Device& device);

// While at least one GraphSafeOps lives, `auto` picks the reference for the ops whose fused CUDA
// form draws random numbers and has not been checked inside a CUDA graph on a GPU (masked_lm,
// residual_layernorm, attention: they read the generator's seed and offset on the device under a
// capture, as LibTorch's own kernels do); train.cuda_graphs holds one. An explicit `fused` keeps
// the fused form, captured with the graph.
class GraphSafeOps {
 public:
  GraphSafeOps();
  ~GraphSafeOps();
  GraphSafeOps(const GraphSafeOps&) = delete;
  GraphSafeOps& operator=(const GraphSafeOps&) = delete;
};

// The ops' names as XLME_OPS spells them, in Op's order.
const std::vector<std::string>& op_names();

// Sets the switch from a value as XLME_OPS takes it (tests, benchmarks); "" means auto.
void set_ops(const std::string& spec);

// One line for the logs: each op's implementation on `device`, e.g.
// "dropout=fused (cpu kernel), masked_lm=reference".
std::string describe(const c10::Device& device);

}  // namespace xlme::ops
