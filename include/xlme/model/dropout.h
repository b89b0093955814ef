// Dropout with a fast CPU path. LibTorch 1.13's CPU bernoulli_ (without MKL, as Debian builds it)
// draws every element from one Mersenne Twister on one thread: on `cpu_small` the 20 dropouts of a
// step took ~8% of it. On the CPU the keep mask here comes from a counter-based generator instead
// (SplitMix64 of a seed and the element's index), filled in parallel; the seed is drawn from
// LibTorch's default CPU generator, so torch::manual_seed and checkpointed generator state decide
// the masks as before, and the masks do not depend on the number of threads. On other devices it
// is torch::dropout.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace xlme::model {

// x * keep / (1 - p) with keep ~ Bernoulli(1 - p) per element when `training`; x unchanged
// otherwise (or when p = 0). Gradient: the same mask times 1 / (1 - p).
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// The mask itself ({0, 1 / (1 - p)} in `options`' dtype, shape `sizes`), from an explicit seed: the
// element at flat index i is dropped when the i-th 32-bit draw is below p * 2^32.
torch::Tensor dropout_mask(torch::IntArrayRef sizes, double p, uint64_t seed,
                           const torch::TensorOptions& options);

}  // namespace xlme::model
