// The feed-forward block gelu(x W1^T + b1) W2^T + b2 with its element-wise passes folded into the
// matrix products around them, on CUDA (src/ops/triton/gemm_gelu.py; docs/ops.md, `feed_forward`):
// - forward: one Triton product writes h = x W1^T + b1 and gelu(h) from its tile in registers
//   (erf-GELU, the model's); the second product is cuBLAS's (bias in its epilogue);
// - backward: one Triton product computes dA = dOut W2 and writes dh = dA * gelu'(h) with each
//   row-block's column sums of dh (the bias gradient, summed in a fixed order); the weight and
//   input gradients are cuBLAS products.
// Without it the block makes four more passes over [tokens, ffn] per layer: the bias and GELU in
// the forward, the GELU's backward and the bias gradient's reduction in the backward.
//
// The reference is model/encoder.h's FeedForward (two linear layers around torch::gelu);
// FeedForward::forward asks fused_feed_forward_applies() first. XLME_OPS feed_forward=fused turns
// it on; `auto` keeps the reference until a GPU run has verified the kernels.
#pragma once

#include <torch/nn/modules/linear.h>
#include <torch/types.h>

namespace xlme::ops {

// Whether the fused block runs for x [..., K] through `intermediate` [K -> F] and `output`
// [F -> H]: chosen in the registry, a CUDA device with the compiled kernels, products in bf16 (bf16
// autocast on x's device, or x and the weights bf16), K and F multiples of 16, both biases.
bool fused_feed_forward_applies(const torch::Tensor& x, const torch::nn::Linear& intermediate,
                                const torch::nn::Linear& output);

// output(gelu(intermediate(x))) in bf16, differentiable with respect to x and both layers'
// parameters (through autocast's cached bf16 copies of the weights, as linear layers are).
torch::Tensor fused_feed_forward(const torch::Tensor& x, const torch::nn::Linear& intermediate,
                                 const torch::nn::Linear& output);

}  // namespace xlme::ops
