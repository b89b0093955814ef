#include "xlme/train/optimizer.h"

#include "xlme/common/error.h"

namespace xlme::train {

bool takes_weight_decay(const torch::Tensor& parameter) {
  return parameter.dim() >= 2;
}

std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& parameters,
                                                const config::TrainConfig& train) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : parameters) {
    if (!p.requires_grad()) continue;
    (takes_weight_decay(p) ? decay : no_decay).push_back(p);
  }
  XLME_CHECK(!decay.empty() || !no_decay.empty(), "the optimizer got no trainable parameters");
  auto options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(train.lr)
            .betas({train.adam_beta1, train.adam_beta2})
            .eps(train.adam_eps)
            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(train.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<torch::optim::AdamW>(std::move(groups),
                                               torch::optim::AdamWOptions(train.lr));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
  }
}

}  // namespace xlme::train
