// VECO's cross-attention (Luo et al., 2021; docs/pretraining.md#veco-cross-attention-mlm): the
// queries come from one side of a pair, the keys and values from the last hidden states of the
// other side. No position bias: the two sides' positions are unrelated.
#pragma once

#include "xlme/config/config.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace xlme::model {

// Parameter names (export keys): query, key, value, output (Linear).
class CrossAttentionImpl : public torch::nn::Module {
 public:
  // `args`: hidden_size, heads, attention_dropout, init_std and the attention kernel.
  explicit CrossAttentionImpl(const config::ModelArgs& args);

  // x: [B, T, hidden] (the queries' side); context: [B, S, hidden] (the other side);
  // context_padding: [B, S] bool, true at <pad> (undefined = none) -> [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context,
                        const torch::Tensor& context_padding);

  const config::ModelArgs& args() const { return args_; }

  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr}, output{nullptr};

 private:
  config::ModelArgs args_;
};
TORCH_MODULE(CrossAttention);

}  // namespace xlme::model
