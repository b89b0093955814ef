// The model's matrix products: linear layers and attention's batched products.
// - Through ATen's linear: LibTorch's C++ torch::nn::Linear (its functional::linear, in 2.11 as in
//   1.13) multiplies an input of more than 2 dimensions and then adds the bias in a second pass
//   over the output; ATen's linear, which PyTorch calls, folds the bias into the product (addmm)
//   for contiguous 3-D inputs.
// - bf16 autocast on a CPU without a fast bf16 product: LibTorch hands bf16 products to oneDNN
//   only on CPUs with AVX512 (BW, VL, DQ); elsewhere LibTorch 1.13 ran a scalar loop, ~20x slower
//   than its float32 product (measured on a 2-core AMD EPYC with AVX2; LibTorch 2.11's fallback
//   has not been measured on such a CPU). There the products run in float32 on operands rounded
//   to bf16, and the result is rounded to bf16: what a bf16 product with float32 accumulation
//   computes (the products of bf16 values are exact in float32), up to the order of the sums.
//   Gradients take the same path.
#pragma once

#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <initializer_list>

namespace xlme::model {

// BERT's initialization of linear layers: weights N(0, std), biases 0; the layers in the order
// given (their random draws follow it).
void init_normal(std::initializer_list<torch::nn::Linear*> layers, double std);

// A new in -> out linear layer with init_normal's initialization.
torch::nn::Linear normal_linear(int64_t in, int64_t out, double std);

// Whether this CPU runs LibTorch's bf16 products fast (AVX512 BW, VL and DQ).
bool cpu_has_fast_bf16_products();

// Whether products of `x` run as float32 products of bf16-rounded operands: `x` on the CPU, bf16
// CPU autocast enabled, and no fast bf16 products on this CPU.
bool emulate_bf16_products(const torch::Tensor& x);

// x w^T + b (b may be undefined), as torch::linear under the current autocast state, or emulated
// as above where emulate_bf16_products(x).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias);

inline torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return linear(x, layer->weight, layer->bias);
}

// alpha a [..., M, K] x b [..., K, N] -> [..., M, N]: torch::matmul(a * alpha, b) under the
// current autocast state, or emulated as above where emulate_bf16_products(a).
torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b, double alpha = 1.0);

// The emulated products themselves, whatever the CPU (tests): float32 products of the
// bf16-rounded operands outside autocast, rounded to bf16.
torch::Tensor bf16_emulated_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias);
torch::Tensor bf16_emulated_matmul(const torch::Tensor& a, const torch::Tensor& b);

// t rounded to bf16 and held in float32 (differentiable).
torch::Tensor bf16_rounded(const torch::Tensor& t);

}  // namespace xlme::model
