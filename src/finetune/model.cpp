#include "xlme/finetune/model.h"

#include "xlme/common/error.h"
#include "xlme/data/pair_sides.h"
#include "xlme/model/linear.h"
#include "xlme/optim/optimizer.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <utility>

namespace xlme::finetune {

ClassificationHeadImpl::ClassificationHeadImpl(int64_t hidden_size, int64_t classes,
                                               double dropout_p, double init_std) {
  dropout = register_module("dropout", torch::nn::Dropout(dropout_p));
  dense = register_module("dense", model::normal_linear(hidden_size, hidden_size, init_std));
  output = register_module("output", model::normal_linear(hidden_size, classes, init_std));
}

torch::Tensor ClassificationHeadImpl::forward(const torch::Tensor& hidden) {
  auto first = hidden.select(1, 0);  // [B, hidden]: the <s> token
  return output(dropout(torch::tanh(dense(dropout(first)))));
}

TokenHeadImpl::TokenHeadImpl(int64_t hidden_size, int64_t classes, double dropout_p,
                             double init_std) {
  dropout = register_module("dropout", torch::nn::Dropout(dropout_p));
  output = register_module("output", model::normal_linear(hidden_size, classes, init_std));
}

torch::Tensor TokenHeadImpl::forward(const torch::Tensor& hidden) {
  return output(dropout(hidden));
}

FinetuneModelImpl::FinetuneModelImpl(model::SharedEmbeddings embeddings_, model::Encoder encoder_,
                                     HeadKind kind, int64_t classes, double dropout) {
  XLME_CHECK(classes >= 1, "a task head needs at least one class, got {}", classes);
  embeddings = register_module("embeddings", std::move(embeddings_));
  encoder = register_module("discriminator", std::move(encoder_));
  const auto& o = encoder->args();
  if (kind == HeadKind::kSequence) {
    sequence_head =
        register_module("head", ClassificationHead(o.hidden_size, classes, dropout, o.init_std));
  } else {
    token_head = register_module("head", TokenHead(o.hidden_size, classes, dropout, o.init_std));
  }
}

torch::Tensor FinetuneModelImpl::forward(const torch::Tensor& input_ids,
                                         const torch::Tensor& positions,
                                         const torch::Tensor& padding) {
  if (plugs_in()) {
    return plugged_in(input_ids.cpu(), positions.cpu(), padding.cpu(), input_ids.device());
  }
  auto hidden = encoder->forward(input_ids, positions, padding);  // [B, T, hidden]
  return sequence_head ? sequence_head->forward(hidden) : token_head->forward(hidden);
}

torch::Tensor FinetuneModelImpl::forward_host(const torch::Tensor& input_ids,
                                              const torch::Tensor& positions,
                                              const torch::Tensor& padding,
                                              const torch::Device& device) {
  if (plugs_in()) return plugged_in(input_ids, positions, padding, device);
  return forward(input_ids.to(device), positions.to(device), padding.to(device));
}

torch::Tensor FinetuneModelImpl::plugged_in(const torch::Tensor& input_ids,
                                            const torch::Tensor& positions,
                                            const torch::Tensor& padding,
                                            const torch::Device& device) {
  data::Batch pair;
  pair.task = data::Task::kPara;
  pair.input_ids = pair.labels = input_ids;
  pair.padding = padding;
  pair.positions = positions;
  pair.masked = torch::zeros_like(padding);
  // The layout's <s>, <pad> and </s> (the only ids the split reads) are fixed.
  const auto sides = data::split_pair(pair, data::SpecialIds{});
  auto side = [&](const torch::Tensor& t) { return t.to(device, /*non_blocking=*/true); };
  const auto &a = sides.x, &b = sides.y;
  const auto a_ids = side(a.input_ids), a_positions = side(a.positions);
  const auto b_ids = side(b.input_ids), b_positions = side(b.positions);
  const auto a_padding = side(a.padding), b_padding = side(b.padding);
  const auto ha = encoder->forward(a_ids, a_positions, a_padding);
  const auto hb = encoder->forward(b_ids, b_positions, b_padding);
  const auto ca = encoder->forward_with_context(a_ids, a_positions, a_padding, hb, b_padding);
  const auto cb = encoder->forward_with_context(b_ids, b_positions, b_padding, ha, a_padding);
  return sequence_head->forward(((ca.select(1, 0) + cb.select(1, 0)) / 2).unsqueeze(1));
}

int64_t parameter_depth(const std::string& name, int64_t layers, model::LayerSharing sharing) {
  if (name.rfind("embeddings.", 0) == 0) return 0;
  const std::string layer_prefix = "discriminator.layers.";
  if (name.rfind(layer_prefix, 0) == 0) {
    const auto rest = name.substr(layer_prefix.size());
    const auto sub_layer = rest.substr(rest.find('.') + 1);  // e.g. "attention.query.weight"
    const bool attention =
        sub_layer.rfind("attention", 0) == 0 || sub_layer.rfind("cross_attention", 0) == 0;
    if (sharing == model::LayerSharing::kAll ||
        (sharing == model::LayerSharing::kAttention && attention) ||
        (sharing == model::LayerSharing::kFfn && !attention)) {
      return layers + 1;
    }
    return std::stoll(rest.substr(0, rest.find('.'))) + 1;
  }
  for (const char* early : {"discriminator.embedding_norm.", "discriminator.embedding_projection.",
                            "discriminator.token_delta", "discriminator.position_delta"}) {
    if (name.rfind(early, 0) == 0) return 0;
  }
  return layers + 1;
}

std::unique_ptr<torch::optim::AdamW> make_finetune_adamw(const torch::nn::Module& model,
                                                         int64_t layers,
                                                         model::LayerSharing sharing, double lr,
                                                         double layer_decay, double weight_decay,
                                                         std::vector<double>& scales) {
  // (depth, decays) -> parameters, in a deterministic order.
  std::map<std::pair<int64_t, bool>, std::vector<torch::Tensor>> grouped;
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    grouped[{parameter_depth(item.key(), layers, sharing), optim::takes_weight_decay(item.value())}]
        .push_back(item.value());
  }
  XLME_CHECK(!grouped.empty(), "the fine-tuning optimizer got no trainable parameters");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  scales.clear();
  for (auto& [key, parameters] : grouped) {
    const double scale = std::pow(layer_decay, static_cast<double>(layers + 1 - key.first));
    auto options = std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr * scale)
            .eps(1e-8)
            .weight_decay(key.second ? weight_decay : 0.0));
    groups.emplace_back(std::move(parameters), std::move(options));
    scales.push_back(scale);
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(lr));
}

void set_group_learning_rates(torch::optim::Optimizer& optimizer, double lr,
                              const std::vector<double>& scales) {
  auto& groups = optimizer.param_groups();
  XLME_CHECK(groups.size() == scales.size(), "{} optimizer groups but {} learning-rate scales",
             groups.size(), scales.size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lr * scales[g]);
}

}  // namespace xlme::finetune
