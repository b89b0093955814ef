// A weight's gradient added into its main gradient by the matrix product itself (docs/ops.md,
// `weight_grad`).
//
// A linear layer's weight gradient is dy^T x over the micro-batch's rows. Under bf16 autocast,
// LibTorch's path makes three passes for it: the product writes dW in bf16 (rounded), the cast's
// backward reads it and writes it again in fp32, and AccumulateGrad reads that and the fp32 .grad
// and writes the sum. Where the weight's .grad is already a dense buffer (the trainer's gradient
// buckets attach it before the step's first backward), the fused form has the product add into it
// (C += A B, beta 1), with fp32 accumulation and no bf16 rounding of dW:
// - CUDA, bf16 or fp16 operands, fp32 buffer: cuBLAS's bf16 x bf16 -> fp32 product
//   (at::addmm_out with out_dtype float32, LibTorch 2.11);
// - same dtype as the buffer (fp32 training, any device): addmm_ into the buffer;
// - CPU, bf16 operands: the fp32 product of their fp32 values (a product of two bf16 values is
//   exact in fp32), the sum CUDA's form computes, up to the order of its terms.
// The backward then hands autograd an empty sparse gradient, which AccumulateGrad adds at no cost,
// so that the weight's post-accumulate hooks (the buckets' readiness counts) still run once per
// backward. The fused form serves backward() into .grad: torch::autograd::grad() through a layer
// whose weight has a .grad buffer would add into that buffer instead of returning the gradient,
// and a tensor hook on such a weight (register_hook) sees the empty gradient, not the weight's:
// read or change the gradient in .grad after the backward (as the trainer's clipping does), or set
// XLME_OPS=weight_grad=reference.
#pragma once

#include <torch/types.h>

namespace xlme::ops {

// Whether a backward will give `weight` (a leaf) its gradient in place, asked by a forward: the
// registry's weight_grad op is fused on its device, autograd is recording, and
// adds_into_buffer(weight).
bool weight_gradient_in_place(const torch::Tensor& weight);

// The same asked by a backward (which runs with autograd not recording): the registry's
// weight_grad op is fused on its device, the weight takes a gradient and is a leaf, and its .grad
// is a dense buffer of its shape, dtype and device already.
bool adds_into_buffer(const torch::Tensor& weight);

// The gradient of `weight` [out, in] from dy [rows, out] and x [rows, in] (dy^T x), in a
// backward: added into weight.grad by the product where adds_into_buffer(weight) (the result is
// then an empty sparse tensor for autograd to add), otherwise dy^T x in the weight's dtype,
// accumulated in fp32 (for autograd to add). Undefined where the weight takes no gradient.
torch::Tensor weight_gradient(const torch::Tensor& weight, const torch::Tensor& dy,
                              const torch::Tensor& x);

// `t` (dy or x) as the product into `weight`'s buffer reads it: on the CPU in the weight's dtype
// (fp32: the bf16 values exactly), elsewhere as it is. For an operand that several weights'
// products read (attention's stacked query, key and value), convert it once.
torch::Tensor gradient_operand(const torch::Tensor& t, const torch::Tensor& weight);

// main_grad [out, in] += dy^T x, in main_grad's dtype, by one product (the forms above).
void accumulate_weight_gradient(torch::Tensor& main_grad, const torch::Tensor& dy,
                                const torch::Tensor& x);

// What a backward that added `weight`'s gradient into its .grad itself hands autograd: an empty
// sparse tensor of the weight's shape (one sparse dimension), which AccumulateGrad adds at no cost
// and whose arrival runs the weight's hooks. Empty ones add up to an empty one; no copy, no kernel.
torch::Tensor gradient_added_in_place(const torch::Tensor& weight);

}  // namespace xlme::ops
