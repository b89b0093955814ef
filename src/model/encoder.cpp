#include "xlme/model/encoder.h"

#include "xlme/common/error.h"
#include "xlme/model/linear.h"
#include "xlme/ops/dropout.h"
#include "xlme/ops/embedding.h"
#include "xlme/ops/feed_forward.h"
#include "xlme/ops/residual_layernorm.h"

#include <torch/torch.h>

namespace xlme::model {

SharedEmbeddingsImpl::SharedEmbeddingsImpl(const config::ModelArgs& args) {
  XLME_CHECK(args.vocab_size > 0,
             "the model needs a vocabulary size, got {}; set model.vocab_size or data.tokenizer",
             args.vocab_size);
  token = register_module("token", torch::nn::Embedding(args.vocab_size, args.embedding_size));
  torch::NoGradGuard no_grad;
  token->weight.normal_(0.0, args.init_std);
  if (args.absolute_positions) {
    position =
        register_module("position", torch::nn::Embedding(args.max_positions, args.embedding_size));
    position->weight.normal_(0.0, args.init_std);
  }
}

namespace {

torch::nn::LayerNorm layer_norm(int64_t width, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}).eps(eps));
}

}  // namespace

FeedForwardImpl::FeedForwardImpl(int64_t hidden_size, int64_t ffn_size, double init_std) {
  intermediate = register_module("intermediate", normal_linear(hidden_size, ffn_size, init_std));
  output = register_module("output", normal_linear(ffn_size, hidden_size, init_std));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  if (ops::fused_feed_forward_applies(x, intermediate, output)) {
    return ops::fused_feed_forward(x, intermediate, output);
  }
  return linear(output, torch::gelu(linear(intermediate, x)));
}

EncoderLayerImpl::EncoderLayerImpl(const config::ModelArgs& args, const EncoderLayerImpl* first)
    : dropout_(args.dropout), pre_norm_(args.norm == config::Norm::kPre) {
  if (first != nullptr && args.shares_attention()) {
    attention = first->attention;
    attention_norm = first->attention_norm;
  } else {
    attention = register_module("attention", SelfAttention(args));
    attention_norm =
        register_module("attention_norm", layer_norm(args.hidden_size, args.layer_norm_eps));
  }
  if (args.cross_attention && first != nullptr && args.shares_attention()) {
    cross_attention = first->cross_attention;
    cross_attention_norm = first->cross_attention_norm;
  } else if (args.cross_attention) {
    cross_attention = register_module("cross_attention", CrossAttention(args));
    cross_attention_norm =
        register_module("cross_attention_norm", layer_norm(args.hidden_size, args.layer_norm_eps));
  }
  if (first != nullptr && args.shares_ffn()) {
    ffn = first->ffn;
    ffn_norm = first->ffn_norm;
  } else {
    ffn = register_module("ffn", FeedForward(args.hidden_size, args.ffn_size, args.init_std));
    ffn_norm = register_module("ffn_norm", layer_norm(args.hidden_size, args.layer_norm_eps));
  }
}

torch::Tensor EncoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& padding,
                                        const torch::Tensor& table, const torch::Tensor& context,
                                        const torch::Tensor& context_padding) {
  const bool train = is_training();
  XLME_CHECK(!context.defined() || cross_attention,
             "this encoder has no cross-attention to plug in (model.cross_attention=false)");
  // The residual connections: x + dropout(sub-layer(x)).
  const auto residual = [&](const torch::Tensor& stream, const torch::Tensor& sublayer) {
    return stream + ops::dropout(sublayer, dropout_, train);
  };
  if (pre_norm_) {
    auto h = residual(x, attention(attention_norm(x), padding, table));
    if (context.defined()) {
      h = residual(h, cross_attention(cross_attention_norm(h), context, context_padding));
    }
    return residual(h, ffn(ffn_norm(h)));
  }
  // Post-norm: LayerNorm(x + dropout(sub-layer(x))), one op (fused on CUDA when chosen).
  auto h = ops::residual_dropout_layernorm(x, attention(x, padding, table), dropout_, train,
                                           attention_norm);
  if (context.defined()) {
    h = ops::residual_dropout_layernorm(h, cross_attention(h, context, context_padding), dropout_,
                                        train, cross_attention_norm);
  }
  return ops::residual_dropout_layernorm(h, ffn(h), dropout_, train, ffn_norm);
}

AttentionProjections EncoderLayerImpl::projections(const torch::Tensor& x) {
  const auto input = pre_norm_ ? attention_norm(x) : x;
  return {linear(attention->query, input), linear(attention->key, input),
          linear(attention->value, input)};
}

torch::Tensor EncoderLayerImpl::bias_table(const torch::Tensor& buckets) const {
  return attention->bias_table(buckets);
}

EncoderImpl::EncoderImpl(const config::ModelArgs& args, SharedEmbeddings embeddings,
                         std::shared_ptr<BucketCache> buckets)
    : args_(args), embeddings_(std::move(embeddings)), buckets_(std::move(buckets)) {
  embedding_norm =
      register_module("embedding_norm", layer_norm(args.embedding_size, args.layer_norm_eps));
  // Factorized embeddings (embedding_size < hidden_size), or a generator narrower than the
  // shared tables (ELECTRA's smaller generators).
  if (args.embedding_size != args.hidden_size) {
    embedding_projection =
        register_module("embedding_projection",
                        normal_linear(args.embedding_size, args.hidden_size, args.init_std));
  }
  if (args.embedding_sharing == config::EmbeddingSharing::kGdes) {
    token_delta =
        register_parameter("token_delta", torch::zeros({args.vocab_size, args.embedding_size}));
    if (args.absolute_positions) {
      position_delta = register_parameter("position_delta",
                                          torch::zeros({args.max_positions, args.embedding_size}));
    }
  }
  if (args.relative_position.enabled && args.relative_position.shared_across_layers) {
    relative_bias = register_parameter(
        "relative_bias",
        torch::empty({args.heads, args.relative_position.num_buckets}).normal_(0.0, args.init_std));
  }
  layers = register_module("layers", torch::nn::ModuleList());
  // share_layers=all: one layer serves every depth.
  const int64_t distinct = args.share_layers == LayerSharing::kAll ? 1 : args.layers;
  for (int64_t i = 0; i < distinct; ++i) {
    layers->push_back(EncoderLayer(args, i == 0 ? nullptr : &layer(0)));
  }
  if (args.norm == config::Norm::kPre) {
    final_norm = register_module("final_norm", layer_norm(args.hidden_size, args.layer_norm_eps));
  }
}

EncoderLayerImpl& EncoderImpl::layer(int64_t index) {
  const auto distinct = static_cast<int64_t>(layers->size());
  return *layers->ptr<EncoderLayerImpl>(static_cast<size_t>(std::min(index, distinct - 1)));
}

torch::Tensor EncoderImpl::embed(const torch::Tensor& input_ids, const torch::Tensor& positions) {
  // ops::embedding_lookup: the tables' gradients are the rows read, added into their gradient
  // buffers.
  auto lookup = [](const torch::Tensor& shared, const torch::Tensor& delta,
                   const torch::Tensor& ids) {
    if (!delta.defined()) return ops::embedding_lookup(shared, ids);
    // gdes (DeBERTa-v3): E_D = sg(E_G) + E_delta, gathered row by row.
    return ops::embedding_lookup(shared.detach(), ids) + ops::embedding_lookup(delta, ids);
  };
  auto x = lookup(embeddings_->token->weight, token_delta, input_ids);  // [B, T, E]
  if (args_.absolute_positions) {
    XLME_CHECK(input_ids.size(1) <= args_.max_positions,
               "a batch of length {} exceeds model.max_positions ({}); lower data.*.max_len",
               input_ids.size(1), args_.max_positions);
    x = x + lookup(embeddings_->position->weight, position_delta, positions);
  }
  return x;
}

torch::Tensor EncoderImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& positions,
                                   const torch::Tensor& padding) {
  return run(input_ids, positions, padding, args_.layers, nullptr);
}

torch::Tensor EncoderImpl::forward_with_context(const torch::Tensor& input_ids,
                                                const torch::Tensor& positions,
                                                const torch::Tensor& padding,
                                                const torch::Tensor& context,
                                                const torch::Tensor& context_padding) {
  XLME_CHECK(context.defined(), "forward_with_context needs the other side's hidden states");
  return run(input_ids, positions, padding, args_.layers, nullptr, context, context_padding);
}

std::vector<torch::Tensor> EncoderImpl::hidden_states(const torch::Tensor& input_ids,
                                                      const torch::Tensor& positions,
                                                      const torch::Tensor& padding,
                                                      int64_t up_to_layer) {
  if (up_to_layer < 0) up_to_layer = args_.layers;
  XLME_CHECK(up_to_layer <= args_.layers,
             "layer {} requested, but the encoder has {} layers (0 = embeddings, 1..{} = layers)",
             up_to_layer, args_.layers, args_.layers);
  std::vector<torch::Tensor> states;
  states.reserve(static_cast<size_t>(up_to_layer) + 1);
  auto last = run(input_ids, positions, padding, up_to_layer, &states);
  states.back() = last;
  return states;
}

torch::Tensor EncoderImpl::run(const torch::Tensor& input_ids, const torch::Tensor& positions,
                               const torch::Tensor& padding, int64_t up_to_layer,
                               std::vector<torch::Tensor>* states, const torch::Tensor& context,
                               const torch::Tensor& context_padding) {
  const int64_t length = input_ids.size(1);
  auto x = ops::dropout(embedding_norm(embed(input_ids, positions)), args_.dropout, is_training());
  if (embedding_projection) x = linear(embedding_projection, x);  // [B, T, E] -> [B, T, hidden]
  if (states) states->push_back(x);
  torch::Tensor buckets, shared_table;  // [T, T], [H, T, T]
  if (args_.relative_position.enabled && up_to_layer > 0) {
    buckets = buckets_->get(length, input_ids.device());
    if (args_.relative_position.shared_across_layers)
      shared_table = toeplitz_bias(relative_bias, buckets);
  }
  torch::Tensor table = shared_table;  // [H, T, T]
  for (int64_t i = 0; i < up_to_layer; ++i) {
    auto& current = layer(i);
    // Each layer slices its own table; a shared attention's table is sliced once for every depth.
    if (args_.relative_position.enabled && !args_.relative_position.shared_across_layers &&
        (i == 0 || !args_.shares_attention())) {
      table = current.bias_table(buckets);
    }
    x = current.forward(x, padding, table, context, context_padding);
    if (states) states->push_back(x);
  }
  // The final LayerNorm of pre-LN belongs to the last layer's output only.
  return final_norm && up_to_layer == args_.layers ? final_norm(x) : x;
}

}  // namespace xlme::model
