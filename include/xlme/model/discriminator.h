// The part of XLM-E that is kept after pre-training (docs/ARCHITECTURE.md#model): the shared
// embeddings, the discriminator encoder and, optionally, its replaced-token-detection head. Its
// parameter names are ElectraModel's (embeddings.*, discriminator.*, discriminator_head.*), so a
// state dict moves between the two by name; checkpoint::load_pretrained fills it from a checkpoint
// or an export folder.
#pragma once

#include "xlme/config/config.h"
#include "xlme/model/electra.h"
#include "xlme/model/encoder.h"

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace xlme::model {

class DiscriminatorModelImpl : public torch::nn::Module {
 public:
  // model.vocab_size must be resolved (non-zero). `with_head`: register discriminator_head (the
  // RTD head of the ELECTRA architecture; the mlm baselines have none).
  DiscriminatorModelImpl(const config::ModelConfig& config, bool with_head);

  // input_ids: [B, T] int64; positions: [B, T] int64 (undefined =
  // default_positions(input_ids, padding));
  // padding: [B, T] bool, true at <pad> (undefined = none) -> [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& positions = {},
                        const torch::Tensor& padding = {});

  // [embedding output, layer 1, ..., layer up_to_layer] as Encoder::hidden_states.
  std::vector<torch::Tensor> hidden_states(const torch::Tensor& input_ids,
                                           const torch::Tensor& positions = {},
                                           const torch::Tensor& padding = {},
                                           int64_t up_to_layer = -1);

  // hidden: [B, T, hidden] -> [B, T] replaced-token logits; needs the head.
  torch::Tensor rtd_logits(const torch::Tensor& hidden);

  const config::ModelConfig& config() const { return config_; }
  int64_t hidden_size() const { return discriminator->args().hidden_size; }

  SharedEmbeddings embeddings{nullptr};
  Encoder discriminator{nullptr};
  DiscriminatorHead discriminator_head{nullptr};  // null without the head

 private:
  config::ModelConfig config_;
};
TORCH_MODULE(DiscriminatorModel);

// input_ids: [B, T] -> [B, T] int64: 0..T-1 in every row, on input_ids' device.
torch::Tensor default_positions(const torch::Tensor& input_ids);
// The same less each row's leading padding (padding: [B, T] bool, true at <pad>; undefined =
// none): a left-padded row's first real token is 0 (the padding before it too), so that left and
// right padding give the same outputs; right-padded rows keep 0..T-1.
torch::Tensor default_positions(const torch::Tensor& input_ids, const torch::Tensor& padding);

}  // namespace xlme::model
