#include "xlme/checkpoint/weights.h"

#include "xlme/common/error.h"

#include <torch/torch.h>

namespace xlme::checkpoint {

void check_finite_weights(const std::map<std::string, torch::Tensor>& weights,
                          const std::string& file) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : weights) {
    if (!tensor.defined() || !tensor.is_floating_point()) continue;
    const int64_t bad = tensor.numel() - torch::isfinite(tensor).sum().item<int64_t>();
    XLME_CHECK(bad == 0,
               "'{}': tensor '{}' holds {} NaN or infinite values of {}: the run diverged before "
               "these weights were saved; use an earlier checkpoint (a run keeps its last good "
               "one: train.keep_last), or lower train.lr and train again",
               file, name, bad, tensor.numel());
  }
}

std::map<std::string, torch::Tensor> named_weights(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out.emplace(item.key(), item.value());
  for (const auto& item : module.named_buffers()) out.emplace(item.key(), item.value());
  return out;
}

WeightMatch match_weights(const torch::nn::Module& module,
                          const std::map<std::string, torch::Tensor>& weights,
                          const std::function<bool(const std::string&)>& selected) {
  const auto targets = named_weights(module);
  WeightMatch match;
  for (const auto& [name, target] : targets) {
    if (selected && !selected(name)) {
      match.not_selected.push_back(name);
      continue;
    }
    const auto it = weights.find(name);
    if (it == weights.end()) {
      match.missing.push_back(name);
    } else if (it->second.sizes() != target.sizes()) {
      match.mismatched.push_back({name, it->second.sizes().vec(), target.sizes().vec()});
    } else {
      match.matched.push_back(name);
    }
  }
  for (const auto& [name, tensor] : weights) {
    if (targets.count(name) == 0) match.unexpected.push_back(name);
  }
  return match;
}

void copy_weights(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& weights,
                  const WeightMatch& match) {
  auto targets = named_weights(module);
  torch::NoGradGuard no_grad;
  for (const auto& name : match.matched) targets.at(name).copy_(weights.at(name));
}

}  // namespace xlme::checkpoint
