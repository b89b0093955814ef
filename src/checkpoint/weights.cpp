#include "xlme/checkpoint/weights.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"

#include <torch/torch.h>

#include <vector>

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

WeightSpecs weight_specs(const torch::nn::Module& module) {
  WeightSpecs out;
  for (const auto& [name, tensor] : named_weights(module)) {
    out[name] = {tensor.sizes().vec(), tensor.scalar_type()};
  }
  return out;
}

uint64_t weight_bytes(const WeightSpecs& specs) {
  uint64_t bytes = 0;
  for (const auto& [name, spec] : specs) {
    uint64_t n = c10::elementSize(spec.dtype);
    for (const int64_t size : spec.shape) n *= static_cast<uint64_t>(size);
    bytes += n;
  }
  return bytes;
}

std::string first_weight_names(const std::vector<std::string>& names) {
  std::string out;
  const size_t shown = std::min<size_t>(names.size(), 20);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += fmt::format(" and {} more", names.size() - shown);
  return out;
}

void check_declared_weights(const WeightSpecs& declared, const WeightSpecs& expected,
                            torch::ScalarType floating, const std::string& file,
                            const std::string& hint) {
  std::vector<std::string> unexpected, missing, misshapen, mistyped;
  for (const auto& [name, spec] : declared) {
    if (expected.count(name) == 0) unexpected.push_back(name);
  }
  XLME_CHECK(unexpected.empty(),
             "'{}' has {} weight(s) that the model of its config does not have: {}; nothing of "
             "them was read; {}",
             file, unexpected.size(), first_weight_names(unexpected), hint);
  for (const auto& [name, want] : expected) {
    const auto found = declared.find(name);
    if (found == declared.end()) {
      missing.push_back(name);
      continue;
    }
    const WeightSpec& have = found->second;
    if (have.shape != want.shape) {
      misshapen.push_back(fmt::format("{} ({} stored, {} expected)", name, shape_text(have.shape),
                                      shape_text(want.shape)));
    }
    const bool converted = want.dtype == torch::kFloat32 && have.dtype == floating;
    if (have.dtype != want.dtype && !converted) {
      mistyped.push_back(fmt::format("{} ({} stored, {} expected)", name, c10::toString(have.dtype),
                                     c10::toString(want.dtype)));
    }
  }
  XLME_CHECK(missing.empty(), "'{}' lacks {} weight(s) that the model of its config needs: {}; {}",
             file, missing.size(), first_weight_names(missing), hint);
  XLME_CHECK(misshapen.empty(),
             "'{}' has weights whose shape differs from the model of its config: {}; {}", file,
             first_weight_names(misshapen), hint);
  XLME_CHECK(mistyped.empty(),
             "'{}' has weights whose dtype differs from the model of its config: {}; xlme reads "
             "no other dtype in their place (no conversion applies); {}",
             file, first_weight_names(mistyped), hint);
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
