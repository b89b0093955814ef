// The model's matrix products as one op (docs/ops.md): linear layers and attention's batched
// products. The reference is LibTorch's own product under the current autocast state, through
// ATen's linear (LibTorch's C++ torch::nn::Linear multiplies an input of more than 2 dimensions
// and then adds the bias in a second pass; ATen's linear, which PyTorch calls, folds the bias into
// the product for contiguous 3-D inputs).
//
// The fused CPU form, "bf16 emulation": LibTorch hands bf16 products to oneDNN only on CPUs with
// AVX512 (BW, VL, DQ); elsewhere LibTorch 1.13 falls back to a scalar loop, many times slower
// than its float32 product, and whether LibTorch 2.11's fallback is faster is not known
// (docs/performance.md). There, under bf16 CPU autocast, the products run in float32 on
// operands rounded to bf16 and the result is rounded to bf16: what a bf16 product with float32
// accumulation computes (the products of bf16 values are exact in float32), up to the order of the
// sums. Gradients take the same path. No CUDA form: CUDA's bf16 products are cuBLAS's.
//
// Where weight_gradient_in_place() holds for a weight (the weight_grad op, ops/weight_gradient.h),
// the product's backward adds that weight's gradient into its .grad buffer itself (one product,
// fp32 accumulation, no bf16 dW, no cast and no add after it); the biases' gradients are then
// summed in fp32.
#pragma once

#include <torch/types.h>

#include <vector>

namespace xlme::ops {

// Whether this CPU runs LibTorch's bf16 products fast (AVX512 BW, VL and DQ).
bool cpu_has_fast_bf16_products();

// Whether products of `x` run emulated as above: the registry's linear op is fused on x's device
// (the CPU form), bf16 autocast is on there, and this CPU has no fast bf16 products.
bool emulate_bf16_products(const torch::Tensor& x);

// x w^T + b (b may be undefined), as torch::linear under the current autocast state, or emulated
// where emulate_bf16_products(x).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias);

// The same for x [rows, in], with the result's rows padded to a multiple of `row_multiple`
// columns: a [rows, out] view of a [rows, round_up(out, row_multiple)] buffer, whose rows start
// 16-byte aligned for the kernels and products that read them (the generator's logits over a
// 250,002-id vocabulary: ops::logits_row_multiple). The product writes into the view (cuBLAS's
// leading dimension), so no copy is made; its backward is weight_grad's (the weight's gradient
// added into its .grad buffer where weight_gradient_in_place() holds, else returned dense,
// accumulated in fp32; the bias's summed in fp32). Where row_multiple is 1 or divides `out`,
// where x is not 2-D, or where the products are emulated: linear(x, weight, bias).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     int64_t row_multiple);

// The same for several layers reading x, as one product: their weights stacked along the output
// rows (and their biases, one per weight or none), e.g. attention's query, key and value. Each
// weight keeps its own gradient (in place where weight_gradient_in_place() holds for it).
torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                     const std::vector<torch::Tensor>& biases);

// alpha a [..., M, K] x b [..., K, N] -> [..., M, N]: torch::matmul(a * alpha, b) under the
// current autocast state, or emulated where emulate_bf16_products(a).
torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b, double alpha = 1.0);

// The emulated products themselves, whatever the CPU (tests): float32 products of the
// bf16-rounded operands outside autocast, rounded to bf16.
torch::Tensor bf16_emulated_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias);
torch::Tensor bf16_emulated_matmul(const torch::Tensor& a, const torch::Tensor& b);

// t rounded to bf16 and held in float32 (differentiable).
torch::Tensor bf16_rounded(const torch::Tensor& t);

}  // namespace xlme::ops
