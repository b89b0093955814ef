#include "xlme/model/encoder.h"

#include "xlme/common/error.h"
#include "xlme/model/linear.h"
#include "xlme/ops/dropout.h"
#include "xlme/ops/embedding.h"
#include "xlme/ops/feed_forward.h"
#include "xlme/ops/residual_layernorm.h"

#include <torch/torch.h>

namespace xlme::model {

LayerSharing parse_layer_sharing(const std::string& name) {
  if (name == "none") return LayerSharing::kNone;
  if (name == "all") return LayerSharing::kAll;
  if (name == "attention") return LayerSharing::kAttention;
  XLME_CHECK(name == "ffn", "model.share_layers must be none, all, attention or ffn, not '{}'",
             name);
  return LayerSharing::kFfn;
}

EncoderOptions EncoderOptions::discriminator(const config::ModelConfig& model) {
  EncoderOptions o;
  o.vocab_size = model.vocab_size;
  o.max_positions = model.max_positions;
  o.absolute_positions = model.absolute_positions;
  o.embedding_size = model.embedding_size > 0 ? model.embedding_size : model.hidden_size;
  o.hidden_size = model.hidden_size;
  o.layers = model.layers;
  o.heads = model.heads;
  o.ffn_size = model.ffn_size;
  o.dropout = model.dropout;
  o.attention_dropout = model.attention_dropout;
  o.layer_norm_eps = model.layer_norm_eps;
  o.pre_norm = model.norm == "pre";
  o.init_std = model.init_std;
  o.relative_bias = model.relative_position.enabled;
  o.gated = model.relative_position.gated;
  o.shared_table = model.relative_position.shared_across_layers;
  o.num_buckets = model.relative_position.num_buckets;
  o.max_distance = model.relative_position.max_distance;
  o.embedding_delta = model.embedding_sharing == "gdes";
  o.attention = model.attention;
  o.sharing = parse_layer_sharing(model.share_layers);
  o.cross_attention = model.cross_attention;
  return o;
}

EncoderOptions EncoderOptions::generator(const config::ModelConfig& model) {
  EncoderOptions o = discriminator(model);
  const auto& g = model.generator;
  o.layers = g.layers;
  if (g.hidden_size > 0) o.hidden_size = g.hidden_size;
  if (g.heads > 0) o.heads = g.heads;
  if (g.ffn_size > 0) o.ffn_size = g.ffn_size;
  o.embedding_delta = false;  // the generator trains the shared tables themselves
  o.cross_attention = false;  // VECO has no generator
  return o;
}

SharedEmbeddingsImpl::SharedEmbeddingsImpl(const EncoderOptions& options) {
  XLME_CHECK(options.vocab_size > 0,
             "the model needs a vocabulary size, got {}; set model.vocab_size or data.tokenizer",
             options.vocab_size);
  token =
      register_module("token", torch::nn::Embedding(options.vocab_size, options.embedding_size));
  torch::NoGradGuard no_grad;
  token->weight.normal_(0.0, options.init_std);
  if (options.absolute_positions) {
    position = register_module("position",
                               torch::nn::Embedding(options.max_positions, options.embedding_size));
    position->weight.normal_(0.0, options.init_std);
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

EncoderLayerImpl::EncoderLayerImpl(const EncoderOptions& options, const EncoderLayerImpl* first)
    : dropout_(options.dropout), pre_norm_(options.pre_norm) {
  if (first != nullptr && options.shares_attention()) {
    attention = first->attention;
    attention_norm = first->attention_norm;
  } else {
    SelfAttentionOptions a;
    a.hidden_size = options.hidden_size;
    a.heads = options.heads;
    a.attention_dropout = options.attention_dropout;
    a.relative_bias = options.relative_bias;
    a.own_table = !options.shared_table;
    a.gated = options.gated;
    a.num_buckets = options.num_buckets;
    a.max_distance = options.max_distance;
    a.init_std = options.init_std;
    a.kernel = options.attention;
    attention = register_module("attention", SelfAttention(a));
    attention_norm =
        register_module("attention_norm", layer_norm(options.hidden_size, options.layer_norm_eps));
  }
  if (options.cross_attention && first != nullptr && options.shares_attention()) {
    cross_attention = first->cross_attention;
    cross_attention_norm = first->cross_attention_norm;
  } else if (options.cross_attention) {
    CrossAttentionOptions c;
    c.hidden_size = options.hidden_size;
    c.heads = options.heads;
    c.attention_dropout = options.attention_dropout;
    c.init_std = options.init_std;
    c.kernel = options.attention;
    cross_attention = register_module("cross_attention", CrossAttention(c));
    cross_attention_norm = register_module("cross_attention_norm",
                                           layer_norm(options.hidden_size, options.layer_norm_eps));
  }
  if (first != nullptr && options.shares_ffn()) {
    ffn = first->ffn;
    ffn_norm = first->ffn_norm;
  } else {
    ffn = register_module("ffn",
                          FeedForward(options.hidden_size, options.ffn_size, options.init_std));
    ffn_norm = register_module("ffn_norm", layer_norm(options.hidden_size, options.layer_norm_eps));
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

EncoderImpl::EncoderImpl(const EncoderOptions& options, SharedEmbeddings embeddings,
                         std::shared_ptr<BucketCache> buckets)
    : options_(options), embeddings_(std::move(embeddings)), buckets_(std::move(buckets)) {
  embedding_norm =
      register_module("embedding_norm", layer_norm(options.embedding_size, options.layer_norm_eps));
  // Factorized embeddings (embedding_size < hidden_size), or a generator narrower than the
  // shared tables (ELECTRA's smaller generators).
  if (options.embedding_size != options.hidden_size) {
    embedding_projection = register_module(
        "embedding_projection",
        normal_linear(options.embedding_size, options.hidden_size, options.init_std));
  }
  if (options.embedding_delta) {
    token_delta = register_parameter("token_delta",
                                     torch::zeros({options.vocab_size, options.embedding_size}));
    if (options.absolute_positions) {
      position_delta = register_parameter(
          "position_delta", torch::zeros({options.max_positions, options.embedding_size}));
    }
  }
  if (options.relative_bias && options.shared_table) {
    relative_bias = register_parameter(
        "relative_bias",
        torch::empty({options.heads, options.num_buckets}).normal_(0.0, options.init_std));
  }
  layers = register_module("layers", torch::nn::ModuleList());
  // share_layers=all: one layer serves every depth.
  const int64_t distinct = options.sharing == LayerSharing::kAll ? 1 : options.layers;
  for (int64_t i = 0; i < distinct; ++i) {
    layers->push_back(EncoderLayer(options, i == 0 ? nullptr : &layer(0)));
  }
  if (options.pre_norm) {
    final_norm =
        register_module("final_norm", layer_norm(options.hidden_size, options.layer_norm_eps));
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
  if (options_.absolute_positions) {
    XLME_CHECK(input_ids.size(1) <= options_.max_positions,
               "a batch of length {} exceeds model.max_positions ({}); lower data.*.max_len",
               input_ids.size(1), options_.max_positions);
    x = x + lookup(embeddings_->position->weight, position_delta, positions);
  }
  return x;
}

torch::Tensor EncoderImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& positions,
                                   const torch::Tensor& padding) {
  return run(input_ids, positions, padding, options_.layers, nullptr);
}

torch::Tensor EncoderImpl::forward_with_context(const torch::Tensor& input_ids,
                                                const torch::Tensor& positions,
                                                const torch::Tensor& padding,
                                                const torch::Tensor& context,
                                                const torch::Tensor& context_padding) {
  XLME_CHECK(context.defined(), "forward_with_context needs the other side's hidden states");
  return run(input_ids, positions, padding, options_.layers, nullptr, context, context_padding);
}

std::vector<torch::Tensor> EncoderImpl::hidden_states(const torch::Tensor& input_ids,
                                                      const torch::Tensor& positions,
                                                      const torch::Tensor& padding,
                                                      int64_t up_to_layer) {
  if (up_to_layer < 0) up_to_layer = options_.layers;
  XLME_CHECK(up_to_layer <= options_.layers,
             "layer {} requested, but the encoder has {} layers (0 = embeddings, 1..{} = layers)",
             up_to_layer, options_.layers, options_.layers);
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
  auto x =
      ops::dropout(embedding_norm(embed(input_ids, positions)), options_.dropout, is_training());
  if (embedding_projection) x = linear(embedding_projection, x);  // [B, T, E] -> [B, T, hidden]
  if (states) states->push_back(x);
  torch::Tensor buckets, shared_table;  // [T, T], [H, T, T]
  if (options_.relative_bias && up_to_layer > 0) {
    buckets = buckets_->get(length, input_ids.device());
    if (options_.shared_table) shared_table = toeplitz_bias(relative_bias, buckets);
  }
  torch::Tensor table = shared_table;  // [H, T, T]
  for (int64_t i = 0; i < up_to_layer; ++i) {
    auto& current = layer(i);
    // Each layer slices its own table; a shared attention's table is sliced once for every depth.
    if (options_.relative_bias && !options_.shared_table &&
        (i == 0 || !options_.shares_attention())) {
      table = current.bias_table(buckets);
    }
    x = current.forward(x, padding, table, context, context_padding);
    if (states) states->push_back(x);
  }
  // The final LayerNorm of pre-LN belongs to the last layer's output only.
  return final_norm && up_to_layer == options_.layers ? final_norm(x) : x;
}

}  // namespace xlme::model
