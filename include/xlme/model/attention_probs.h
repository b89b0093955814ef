// Attention's probabilities in one pass on the CPU: the position bias (factor x table, -inf at
// padded keys), the softmax and the attention dropout of math attention, for float32 and float64
// scores outside autocast, as one autograd function. Unfused, these were five passes over the
// [B, H, T, T] scores forward (bias, softmax, mask, product) and five backward, each through a
// tensor of its own; fused, the forward reads the scores once and writes the probabilities (kept
// for the backward) and their dropped-out copy, and the backward reads the incoming gradient and
// the probabilities once, writes the scores' gradient and reduces the bias gradients in the same
// loop. The dropout mask is the one model::dropout draws (DropoutDraws, seeded from the default
// generator once per call); the backward reads it back from the output's zeros rather than
// storing it.
#pragma once

#include <torch/types.h>

namespace xlme::model {

// Whether attention_probs takes the fused path for these scores: a contiguous float32 or float64
// CPU tensor [B, H, T, T], CPU autocast off, and the factor and table (where defined) of the same
// dtype.
bool attention_probs_fused(const torch::Tensor& scores, const torch::Tensor& factor,
                           const torch::Tensor& table);

// dropout(softmax(scores + factor * table + padding bias, -1), p, training): scores [B, H, T, T];
// factor [B, H, T, 1] or undefined (factor 1); table [H, T, T] or undefined (no bias); padding
// [B, T] bool or undefined. Only where attention_probs_fused says so (math attention keeps the
// unfused operations elsewhere). A row whose keys are all padded gives NaN, as torch::softmax.
torch::Tensor attention_probs(const torch::Tensor& scores, const torch::Tensor& factor,
                              const torch::Tensor& table, const torch::Tensor& padding, double p,
                              bool training);

}  // namespace xlme::model
