// VECO's cross-attention (Luo et al., 2021; docs/pretraining.md#veco-cross-attention-mlm): the
// queries come from one side of a pair, the keys and values from the last hidden states of the
// other side. No position bias: the two sides' positions are unrelated.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace xlme::model {

struct CrossAttentionOptions {
  int64_t hidden_size = 768;
  int64_t heads = 12;
  double attention_dropout = 0.1;
  double init_std = 0.02;
  std::string kernel = "auto";  // model.attention
};

// Parameter names (export keys): query, key, value, output (Linear).
class CrossAttentionImpl : public torch::nn::Module {
 public:
  explicit CrossAttentionImpl(const CrossAttentionOptions& options);

  // x: [B, T, hidden] (the queries' side); context: [B, S, hidden] (the other side);
  // context_padding: [B, S] bool, true at <pad> (undefined = none) -> [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context,
                        const torch::Tensor& context_padding);

  const CrossAttentionOptions& options() const { return options_; }

  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr}, output{nullptr};

 private:
  CrossAttentionOptions options_;
};
TORCH_MODULE(CrossAttention);

}  // namespace xlme::model
