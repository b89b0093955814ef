// What fine-tuning trains: the pre-trained discriminator encoder with a task head on top
// (docs/ARCHITECTURE.md#fine-tuning), and the optimizer groups of layer-wise learning-rate decay.
#pragma once

#include "xlme/config/task_registry.h"
#include "xlme/model/encoder.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xlme::finetune {

// Sequence classification on the first token (<s>), as XLM-R's (RoBERTa's) head:
// dropout -> dense [hidden -> hidden] -> tanh -> dropout -> output [hidden -> classes].
class ClassificationHeadImpl : public torch::nn::Module {
 public:
  ClassificationHeadImpl(int64_t hidden_size, int64_t classes, double dropout, double init_std);

  torch::Tensor forward(const torch::Tensor& hidden);  // [B, T, hidden] -> [B, classes]

  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear dense{nullptr}, output{nullptr};
};
TORCH_MODULE(ClassificationHead);

// One score vector per token: dropout -> output [hidden -> classes]. Tagging uses a class per
// tag; extractive QA uses 2 (start, end).
class TokenHeadImpl : public torch::nn::Module {
 public:
  TokenHeadImpl(int64_t hidden_size, int64_t classes, double dropout, double init_std);

  torch::Tensor forward(const torch::Tensor& hidden);  // [B, T, hidden] -> [B, T, classes]

  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear output{nullptr};
};
TORCH_MODULE(TokenHead);

// The encoder being fine-tuned plus one head. Parameter names: embeddings.*, discriminator.*
// (the pre-training keys, so that layer-wise decay and loading read them alike) and head.*.
class FinetuneModelImpl : public torch::nn::Module {
 public:
  FinetuneModelImpl(model::SharedEmbeddings embeddings, model::Encoder encoder, HeadKind kind,
                    int64_t classes, double dropout);

  // input_ids, positions: [B, T] int64; padding: [B, T] bool -> [B, classes] or [B, T, classes].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& positions,
                        const torch::Tensor& padding);
  // The same for a batch on the host, computed on `device`; a plug-in model splits the pairs
  // before the copy (forward() on device tensors must bring them back to the host first).
  torch::Tensor forward_host(const torch::Tensor& input_ids, const torch::Tensor& positions,
                             const torch::Tensor& padding, const torch::Device& device);

  int64_t layers() const { return encoder->args().layers; }

  // VECO plug-in (finetune.cross_attention=plug-in): the encoder has cross-attention and the head
  // classifies sequences. forward() then splits each input <s> a </s></s> b </s> into a and b
  // (data::split_pair), runs each with self-attention only, then each with cross-attention to the
  // other's last hidden states, and classifies the mean of the two <s> states.
  bool plugs_in() const { return sequence_head && encoder->args().cross_attention; }

  model::SharedEmbeddings embeddings{nullptr};
  model::Encoder encoder{nullptr};
  ClassificationHead sequence_head{nullptr};  // kSequence
  TokenHead token_head{nullptr};              // kToken

 private:
  // plugs_in(): host tensors split into a and b, then computed on `device`.
  torch::Tensor plugged_in(const torch::Tensor& input_ids, const torch::Tensor& positions,
                           const torch::Tensor& padding, const torch::Device& device);
};
TORCH_MODULE(FinetuneModel);

// Depth of a parameter for layer-wise learning-rate decay (as ELECTRA): 0 for the embeddings and
// everything before the first layer, i for discriminator.layers.<i-1>.*, layers + 1 for the rest
// (final LayerNorm, a table shared by all layers, sub-layers shared by all layers under
// model.share_layers, the head).
int64_t parameter_depth(const std::string& name, int64_t layers,
                        model::LayerSharing sharing = model::LayerSharing::kNone);

// AdamW over `model`'s parameters in groups of equal (depth, weight decay); `scales` receives
// each group's learning-rate factor decay^(layers + 1 - depth), for set_group_learning_rates.
std::unique_ptr<torch::optim::AdamW> make_finetune_adamw(const torch::nn::Module& model,
                                                         int64_t layers,
                                                         model::LayerSharing sharing, double lr,
                                                         double layer_decay, double weight_decay,
                                                         std::vector<double>& scales);

// Group g gets lr * scales[g].
void set_group_learning_rates(torch::optim::Optimizer& optimizer, double lr,
                              const std::vector<double>& scales);

}  // namespace xlme::finetune
