// A torch::nn::Linear applied through ATen's linear. LibTorch 1.13's C++ torch::nn::Linear (its
// functional::linear) multiplies an input of more than 2 dimensions and then adds the bias in a
// second pass over the output; ATen's linear, which PyTorch calls, folds the bias into the product
// (addmm) for contiguous 3-D inputs.
#pragma once

#include <torch/nn/modules/linear.h>

namespace xlme::model {

inline torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

}  // namespace xlme::model
