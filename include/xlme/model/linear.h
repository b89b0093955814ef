// The model's linear layers: BERT's initialization, and their products through the ops layer's
// linear op (ops/linear.h: LibTorch's product, or float32 products of bf16-rounded operands under
// bf16 CPU autocast on CPUs without fast bf16 products).
#pragma once

#include "xlme/ops/linear.h"

#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <initializer_list>

namespace xlme::model {

using ops::batched_matmul;
using ops::linear;

// BERT's initialization of linear layers: weights N(0, std), biases 0; the layers in the order
// given (their random draws follow it).
void init_normal(std::initializer_list<torch::nn::Linear*> layers, double std);

// A new in -> out linear layer with init_normal's initialization.
torch::nn::Linear normal_linear(int64_t in, int64_t out, double std);

inline torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return ops::linear(x, layer->weight, layer->bias);
}

}  // namespace xlme::model
