// Dropout with an own CPU mask. LibTorch's CPU bernoulli_ draws the mask slowly enough that a
// step's dropouts take a large share of a bf16 CPU step (docs/performance.md). On the CPU the
// keep mask here comes from a counter-based generator instead (SplitMix64 of a seed and the
// element's index), filled in parallel; the seed is drawn from LibTorch's default CPU
// generator, so torch::manual_seed and checkpointed generator state decide the masks as they
// decide torch::dropout's, and the masks do not depend on the number of threads. With
// XLME_OPS=dropout=reference (ops/registry.h), and on other devices, it is torch::dropout.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace xlme::ops {

// x * keep / (1 - p) with keep ~ Bernoulli(1 - p) per element when `training`; x unchanged
// otherwise (or when p = 0). Gradient: the same mask times 1 / (1 - p).
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// The CPU mask itself ({0, 1 / (1 - p)} in `options`' dtype, shape `sizes`), from an explicit
// seed: elements 2k and 2k + 1 take the low and high halves of SplitMix64(seed ^ SplitMix64(k)),
// and an element is dropped when its 32-bit half is below p * 2^32. p in [0, 1).
torch::Tensor dropout_mask(torch::IntArrayRef sizes, double p, uint64_t seed,
                           const torch::TensorOptions& options);

}  // namespace xlme::ops
