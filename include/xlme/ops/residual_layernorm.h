// A post-norm sub-layer's end: LayerNorm(x + dropout(y)) (docs/ops.md, `residual_layernorm`), where
// x is the residual stream and y the sub-layer's output.
//
// Reference: x + ops::dropout(y) through the LayerNorm module. Fused (CUDA, XLME_OPS
// residual_layernorm=fused): one Triton kernel reads x and y once and writes the output and each
// row's mean and 1/std (fp32 statistics); the backward recomputes x + dropout(y) and gives dx, dy,
// dweight and dbias in one pass plus a sum of per-block partials. The dropout mask is never stored:
// both passes draw it from Philox counters of LibTorch's CUDA generator
// (src/ops/triton/residual_layernorm.py). Under bf16 autocast x is fp32 (autocast's LayerNorm
// output) and y bf16; the output has x's dtype, as the reference's.
#pragma once

#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

namespace xlme::ops {

// x, y: [..., H]; `norm` normalizes over the last dimension with its weight, bias and eps.
torch::Tensor residual_dropout_layernorm(const torch::Tensor& x, const torch::Tensor& y, double p,
                                         bool training, torch::nn::LayerNorm& norm);

namespace reference {
torch::Tensor residual_dropout_layernorm(const torch::Tensor& x, const torch::Tensor& y, double p,
                                         bool training, torch::nn::LayerNorm& norm);
}  // namespace reference

}  // namespace xlme::ops
