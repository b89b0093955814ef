// The Transformer encoder of the generator and the discriminator (docs/ARCHITECTURE.md#model):
// shared token (+ absolute position) embeddings, embedding LayerNorm and dropout, an optional
// projection of factorized embeddings, then L layers of self-attention with the gated relative
// position bias and a GELU feed-forward block, post-LN by default (pre-LN: with a final LayerNorm).
#pragma once

#include "xlme/config/config.h"
#include "xlme/model/attention.h"
#include "xlme/model/cross_attention.h"
#include "xlme/model/relative_position.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xlme::model {

// model.share_layers' values, named where the model code uses them.
using config::LayerSharing;

// Token and absolute position tables shared by the generator and the discriminator (registered
// once, in the ELECTRA model, as "embeddings"): token.weight [V, E], position.weight [P, E].
class SharedEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit SharedEmbeddingsImpl(const config::ModelArgs& args);

  torch::nn::Embedding token{nullptr};
  torch::nn::Embedding position{nullptr};  // null when absolute positions are off
};
TORCH_MODULE(SharedEmbeddings);

// GELU feed-forward block: intermediate [hidden -> ffn], output [ffn -> hidden].
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t hidden_size, int64_t ffn_size, double init_std);
  torch::Tensor forward(const torch::Tensor& x);  // [..., hidden] -> [..., hidden]

  torch::nn::Linear intermediate{nullptr}, output{nullptr};
};
TORCH_MODULE(FeedForward);

// The query, key and value projections of one self-attention layer, heads concatenated (head h
// is columns h*d_k .. (h+1)*d_k - 1), before any position bias: what MiniLMv2's relations read.
struct AttentionProjections {
  torch::Tensor query;  // [B, T, hidden]
  torch::Tensor key;    // [B, T, hidden]
  torch::Tensor value;  // [B, T, hidden]
};

// One layer: attention, attention_norm, (VECO: cross_attention, cross_attention_norm), ffn,
// ffn_norm. With `first` (the encoder's layer at depth 1) and sharing, the shared sub-layers are
// first's modules (the cross-attention shares with the attention), used but not registered here,
// so that every parameter is registered (saved, exported, optimized) once.
class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const config::ModelArgs& args, const EncoderLayerImpl* first = nullptr);

  // x: [B, T, hidden]; padding: [B, T] bool; table: [H, T, T] or undefined -> [B, T, hidden].
  // With `context` ([B, S, hidden], the other side's last hidden states; context_padding [B, S])
  // the cross-attention runs between the self-attention and the FFN (plugged in); without it the
  // layer is the plain self-attention layer (plugged out).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& padding,
                        const torch::Tensor& table, const torch::Tensor& context = {},
                        const torch::Tensor& context_padding = {});

  // buckets: [T, T] -> [H, T, T]: the bias table of this layer's attention, when it has its own.
  torch::Tensor bias_table(const torch::Tensor& buckets) const;

  // x: the layer's input [B, T, hidden] -> the projections its attention computes from it (pre-LN:
  // of attention_norm(x)).
  AttentionProjections projections(const torch::Tensor& x);

  SelfAttention attention{nullptr};
  torch::nn::LayerNorm attention_norm{nullptr};
  CrossAttention cross_attention{nullptr};             // model.cross_attention only
  torch::nn::LayerNorm cross_attention_norm{nullptr};  // model.cross_attention only
  FeedForward ffn{nullptr};
  torch::nn::LayerNorm ffn_norm{nullptr};

 private:
  double dropout_;
  bool pre_norm_;
};
TORCH_MODULE(EncoderLayer);

// Parameter names (export keys) below the encoder's own prefix: embedding_norm,
// embedding_projection (factorized embeddings), token_delta / position_delta (gdes),
// relative_bias (table shared across layers), layers.<i>.*, final_norm (pre-LN). With
// model.share_layers=all only layers.0 exists; with attention / ffn sharing the shared sub-layer
// exists only under layers.0 (e.g. layers.0.attention.*, layers.<i>.ffn.* for every i).
class EncoderImpl : public torch::nn::Module {
 public:
  // `embeddings` is owned (and registered) by the caller; `buckets` is shared with the other
  // encoder so that both slice one [T, T] bucket index.
  // `args` resolved (config::discriminator_args, generator_args).
  EncoderImpl(const config::ModelArgs& args, SharedEmbeddings embeddings,
              std::shared_ptr<BucketCache> buckets);

  // input_ids, positions: [B, T] int64; padding: [B, T] bool -> hidden states [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& positions,
                        const torch::Tensor& padding);

  // VECO's plugged-in pass: every layer's cross-attention attends to `context` [B, S, hidden]
  // (the other side's last hidden states; context_padding [B, S] bool) -> [B, T, hidden].
  torch::Tensor forward_with_context(const torch::Tensor& input_ids, const torch::Tensor& positions,
                                     const torch::Tensor& padding, const torch::Tensor& context,
                                     const torch::Tensor& context_padding);

  // Hidden states after the embeddings (index 0, after the projection of factorized embeddings)
  // and after each layer 1..up_to_layer (-1: all); layers above up_to_layer are not run. The
  // last entry of a full pre-LN run includes the final LayerNorm, as forward() returns it.
  std::vector<torch::Tensor> hidden_states(const torch::Tensor& input_ids,
                                           const torch::Tensor& positions,
                                           const torch::Tensor& padding, int64_t up_to_layer = -1);

  // [B, T, E]: token (+ position) embeddings; with gdes the shared tables are detached and this
  // encoder's delta is added, so its loss reaches only the delta.
  torch::Tensor embed(const torch::Tensor& input_ids, const torch::Tensor& positions);

  const config::ModelArgs& args() const { return args_; }

  // The layer at depth `index` + 1 (with share_layers=all, the one layer for every depth).
  EncoderLayerImpl& layer(int64_t index);

  torch::nn::LayerNorm embedding_norm{nullptr};
  torch::nn::Linear embedding_projection{nullptr};  // null when embedding_size == hidden_size
  torch::Tensor token_delta;                        // [V, E], gdes only
  torch::Tensor position_delta;                     // [P, E], gdes with absolute positions only
  torch::Tensor relative_bias;                      // [H, num_buckets], shared table only
  torch::nn::ModuleList layers{nullptr};
  torch::nn::LayerNorm final_norm{nullptr};  // pre-LN only

 private:
  torch::Tensor run(const torch::Tensor& input_ids, const torch::Tensor& positions,
                    const torch::Tensor& padding, int64_t up_to_layer,
                    std::vector<torch::Tensor>* states, const torch::Tensor& context = {},
                    const torch::Tensor& context_padding = {});

  config::ModelArgs args_;
  SharedEmbeddings embeddings_;  // not registered here: the ELECTRA model owns it
  std::shared_ptr<BucketCache> buckets_;
};
TORCH_MODULE(Encoder);

}  // namespace xlme::model
