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

// The counter-based draws behind dropout_mask, for kernels that apply a mask without building it.
class DropoutDraws {
 public:
  // `seed` as dropout_mask takes it; p in [0, 1).
  DropoutDraws(double p, uint64_t seed);
  // LibTorch's default CPU generator draws the seed (what dropout() does for each call).
  static uint64_t next_seed();

  // The 64-bit draw of elements 2 * pair (low half) and 2 * pair + 1 (high half): element i is
  // kept when its 32-bit half is at least p * 2^32.
  uint64_t pair_draw(int64_t pair) const {
    return split_mix64(seed_ ^ split_mix64(static_cast<uint64_t>(pair)));
  }
  // Whether a 32-bit draw keeps its element.
  bool keeps_draw(uint64_t draw32) const { return draw32 >= threshold_; }

  // SplitMix64 (Steele, Lea & Flood 2014): a 64-bit mix of a counter; consecutive counters give
  // independent-looking 64-bit draws, two 32-bit draws each.
  static uint64_t split_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  }

 private:
  uint64_t seed_;
  uint64_t threshold_;  // p * 2^32, rounded
};

// x * keep / (1 - p) with keep ~ Bernoulli(1 - p) per element when `training`; x unchanged
// otherwise (or when p = 0). Gradient: the same mask times 1 / (1 - p).
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// x + dropout(y, p, training), the residual connection after a sub-layer. On the CPU for float32
// and float64 when training with p > 0: one autograd function that writes the sum in one pass and
// keeps the mask as bytes (the same mask dropout draws for y), where the unfused form writes the
// mask, the dropped-out y and the sum as three float tensors; the gradient passes to x as it is
// and to y through the mask.
torch::Tensor residual_dropout(const torch::Tensor& x, const torch::Tensor& y, double p,
                               bool training);

// The mask itself ({0, 1 / (1 - p)} in `options`' dtype, shape `sizes`), from an explicit seed: the
// element at flat index i is dropped when the i-th 32-bit draw is below p * 2^32.
torch::Tensor dropout_mask(torch::IntArrayRef sizes, double p, uint64_t seed,
                           const torch::TensorOptions& options);

}  // namespace xlme::model
