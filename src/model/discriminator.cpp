#include "xlme/model/discriminator.h"

#include "xlme/common/error.h"

#include <torch/torch.h>

#include <memory>

namespace xlme::model {

torch::Tensor default_positions(const torch::Tensor& input_ids) {
  return torch::arange(input_ids.size(1), input_ids.options().dtype(torch::kInt64))
      .unsqueeze(0)
      .expand({input_ids.size(0), input_ids.size(1)});
}

torch::Tensor default_positions(const torch::Tensor& input_ids, const torch::Tensor& padding) {
  const auto positions = default_positions(input_ids);
  if (!padding.defined()) return positions;
  const auto leading = padding.to(torch::kInt64).cumprod(1).sum(1, /*keepdim=*/true);  // [B, 1]
  return (positions - leading).clamp_min(0);
}

DiscriminatorModelImpl::DiscriminatorModelImpl(const config::ModelConfig& config, bool with_head)
    : config_(config) {
  XLME_CHECK(config.vocab_size > 0,
             "model.vocab_size is {} and must be resolved before the discriminator is built; set "
             "model.vocab_size or load it with checkpoint::load_pretrained",
             config.vocab_size);
  // Built as ElectraModel builds it, so that the names and shapes are the same.
  const auto args = config::discriminator_args(config);
  auto buckets = std::make_shared<BucketCache>(args.relative_position.num_buckets,
                                               args.relative_position.max_distance);
  embeddings = register_module("embeddings", SharedEmbeddings(args));
  discriminator = register_module("discriminator", Encoder(args, embeddings, buckets));
  if (with_head) {
    discriminator_head =
        register_module("discriminator_head", DiscriminatorHead(args.hidden_size, args.init_std));
  }
}

torch::Tensor DiscriminatorModelImpl::forward(const torch::Tensor& input_ids,
                                              const torch::Tensor& positions,
                                              const torch::Tensor& padding) {
  return discriminator(
      input_ids, positions.defined() ? positions : default_positions(input_ids, padding), padding);
}

std::vector<torch::Tensor> DiscriminatorModelImpl::hidden_states(const torch::Tensor& input_ids,
                                                                 const torch::Tensor& positions,
                                                                 const torch::Tensor& padding,
                                                                 int64_t up_to_layer) {
  return discriminator->hidden_states(
      input_ids, positions.defined() ? positions : default_positions(input_ids, padding), padding,
      up_to_layer);
}

torch::Tensor DiscriminatorModelImpl::rtd_logits(const torch::Tensor& hidden) {
  XLME_CHECK(!discriminator_head.is_empty(),
             "this discriminator was built without the replaced-token-detection head (models "
             "pre-trained with objectives.set mlm or mlm+tlm have none)");
  return discriminator_head(hidden);
}

}  // namespace xlme::model
