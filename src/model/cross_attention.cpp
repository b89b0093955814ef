#include "xlme/model/cross_attention.h"

#include "xlme/common/error.h"
#include "xlme/model/attention.h"
#include "xlme/model/linear.h"

#include <torch/torch.h>

namespace xlme::model {

CrossAttentionImpl::CrossAttentionImpl(const config::ModelArgs& args) : args_(args) {
  XLME_CHECK(args.hidden_size % args.heads == 0,
             "cross-attention width {} must be a multiple of the number of heads {}",
             args.hidden_size, args.heads);
  const int64_t h = args.hidden_size;
  query = register_module("query", torch::nn::Linear(h, h));
  key = register_module("key", torch::nn::Linear(h, h));
  value = register_module("value", torch::nn::Linear(h, h));
  output = register_module("output", torch::nn::Linear(h, h));
  init_normal({&query, &key, &value, &output}, args.init_std);
}

torch::Tensor CrossAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& context,
                                          const torch::Tensor& context_padding) {
  XLME_CHECK(x.dim() == 3 && context.dim() == 3 && x.size(0) == context.size(0) &&
                 x.size(2) == args_.hidden_size && context.size(2) == args_.hidden_size,
             "cross-attention needs [B, T, {}] queries and [B, S, {}] context of one batch size",
             args_.hidden_size, args_.hidden_size);
  const int64_t batch = x.size(0), heads = args_.heads;
  const int64_t head_dim = args_.hidden_size / heads;
  auto split = [&](const torch::Tensor& t) {  // [B, L, hidden] -> [B, H, L, d_k]
    return t.view({batch, t.size(1), heads, head_dim}).transpose(1, 2);
  };
  const auto q = split(linear(query, x));
  // Keys and values as one product whose halves the heads read through strides.
  const auto kv =
      linear(context, {key->weight, value->weight}, {key->bias, value->bias}).chunk(2, -1);
  const auto kernel = resolve_attention_kernel(args_.attention, x.device());
  const auto attended = attention(q, split(kv[0]), split(kv[1]), context_padding, PositionBias{},
                                  args_.attention_dropout, is_training(), kernel);
  return linear(output, attended.transpose(1, 2).reshape({batch, x.size(1), args_.hidden_size}));
}

}  // namespace xlme::model
