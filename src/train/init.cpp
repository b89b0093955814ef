#include "xlme/train/init.h"

#include "xlme/common/error.h"
#include "xlme/train/checkpoint.h"

#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

std::string shape_text(const torch::Tensor& t) {
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

// Tensors of a module archive and of its submodule archives, as dotted names.
bool in_parts(const std::string& name, const std::string& parts) {
  auto under = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  if (parts == "all") return true;
  if (under("embeddings.")) return true;  // shared by both encoders
  if (parts == "generator") return under("generator.") || under("generator_head.");
  XLME_CHECK(parts == "discriminator",
             "train.init_parts is '{}'; use all, generator or discriminator", parts);
  return under("discriminator.") || under("discriminator_head.") || under("mlm_head.");
}

}  // namespace

std::map<std::string, torch::Tensor> checkpoint_weights(const std::string& folder) {
  XLME_CHECK(fs::is_directory(folder),
             "--init-from {}: not a folder; give a pre-training checkpoint folder such as "
             "runs/demo/checkpoints/step_600",
             folder);
  CheckpointManager::verify(folder);
  auto out = read_module_archive((fs::path(folder) / "model.pt").string());
  XLME_CHECK(!out.empty(), "--init-from {}: model.pt holds no tensors", folder);
  return out;
}

InitReport init_weights(model::ElectraModel& model,
                        const std::map<std::string, torch::Tensor>& weights,
                        const std::string& parts, const std::string& source) {
  std::map<std::string, torch::Tensor> targets;
  for (const auto& item : model->named_parameters()) targets[item.key()] = item.value();
  for (const auto& item : model->named_buffers()) targets[item.key()] = item.value();
  InitReport report;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  for (const auto& [name, target] : targets) {
    if (!in_parts(name, parts)) {
      report.not_selected.push_back(name);
      continue;
    }
    const auto it = weights.find(name);
    if (it == weights.end()) {
      report.missing.push_back(name);
      continue;
    }
    XLME_CHECK(it->second.sizes() == target.sizes(),
               "init from {}: {} has shape {} there but {} in this model; the model config must "
               "match the source's (compare model.* with its config.yaml)",
               source, name, shape_text(it->second), shape_text(target));
    copies.emplace_back(target, it->second);
    report.matched.push_back(name);
  }
  for (const auto& [name, tensor] : weights) {
    if (!targets.count(name)) report.unexpected.push_back(name);
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
  return report;
}

std::string format_report(const InitReport& report, const std::string& source,
                          const std::string& parts) {
  std::string text = fmt::format("init from {} (train.init_parts={}): {} tensors loaded", source,
                                 parts, report.matched.size());
  if (!report.missing.empty()) {
    text += fmt::format("; missing there (kept at initialization): {}",
                        fmt::join(report.missing, ", "));
  }
  if (!report.unexpected.empty()) {
    text += fmt::format("; unexpected (ignored): {}", fmt::join(report.unexpected, ", "));
  }
  if (!report.not_selected.empty()) {
    text += fmt::format("; not selected: {} tensors", report.not_selected.size());
  }
  return text;
}

}  // namespace xlme::train
