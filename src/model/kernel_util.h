// Small pieces the model's hand-written CPU autograd functions share (attention.cpp,
// attention_probs.cpp). Private to src/model.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cstdint>

namespace xlme::model::kernel {

// Rows of `length` elements per parallel task: enough work to amortize the task (~32k elements).
inline int64_t rows_per_task(int64_t length) {
  return std::max<int64_t>(1, 32768 / length);
}

// LibTorch 1.13's autograd functions take no undefined tensor inputs: an empty tensor stands for
// "none" (no gate factor, no table, no padding) on the way in and is turned back on the way out.
inline torch::Tensor empty_if_undefined(const torch::Tensor& t,
                                        const torch::TensorOptions& options) {
  return t.defined() ? t : torch::empty({0}, options);
}

inline torch::Tensor undefined_if_empty(const torch::Tensor& t) {
  return t.numel() > 0 ? t : torch::Tensor();
}

}  // namespace xlme::model::kernel
