#include "xlme/train/init.h"

#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/checkpoint/manager.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/config/config.h"
#include "xlme/model/electra.h"
#include "xlme/model/parameter_count.h"

#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

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

// config.json's model_type, or "" where the folder has none (or it is not JSON).
std::string hf_model_type(const fs::path& folder) {
  std::ifstream in(folder / "config.json");
  if (!in) return "";
  const auto config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return config.is_object() && config.contains("model_type") && config["model_type"].is_string()
             ? config["model_type"].get<std::string>()
             : "";
}

}  // namespace

std::map<std::string, torch::Tensor> xlmr_weights(const std::string& folder,
                                                  const checkpoint::WeightSpecs& expected) {
  const fs::path file = fs::path(folder) / "model.safetensors";
  XLME_CHECK(fs::is_regular_file(file),
             "--init-from {}: no model.safetensors there; an HF XLM-R folder must hold its weights "
             "as safetensors (pytorch_model.bin cannot be read here: convert it with the "
             "safetensors package)",
             folder);
  static const std::vector<std::pair<std::regex, std::string>> rules = {
      {std::regex(R"(^embeddings\.word_embeddings\.weight$)"), "embeddings.token.weight"},
      {std::regex(R"(^embeddings\.LayerNorm\.(weight|bias)$)"), "discriminator.embedding_norm.$1"},
      {std::regex(R"(^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$)"),
       "discriminator.layers.$1.attention.$2.$3"},
      {std::regex(R"(^encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)$)"),
       "discriminator.layers.$1.attention.output.$2"},
      {std::regex(R"(^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)$)"),
       "discriminator.layers.$1.attention_norm.$2"},
      {std::regex(R"(^encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)$)"),
       "discriminator.layers.$1.ffn.intermediate.$2"},
      {std::regex(R"(^encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)$)"),
       "discriminator.layers.$1.ffn.output.$2"},
      {std::regex(R"(^encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)$)"),
       "discriminator.layers.$1.ffn_norm.$2"}};
  const std::string kPositions = "embeddings.position_embeddings.weight";
  const std::string kTypes = "embeddings.token_type_embeddings.weight";
  // RoBERTa's name without the "roberta." prefix that XLMRobertaForMaskedLM files carry.
  auto unprefixed = [](const std::string& stored) {
    return stored.rfind("roberta.", 0) == 0 ? stored.substr(8) : stored;
  };
  // xlme's name for each stored tensor; the position and token-type tables fold into one.
  auto xlme_name = [&](const std::string& stored) {
    const std::string name = unprefixed(stored);
    if (name == kPositions || name == kTypes) return std::string("embeddings.position.weight");
    for (const auto& [pattern, replacement] : rules) {
      if (std::regex_match(name, pattern)) return std::regex_replace(name, pattern, replacement);
    }
    return name;
  };
  // With the model's tensors known, what the file declares is checked before anything is read:
  // a tensor the model has must be a float table no larger than the model's (the position table
  // two rows more), and what the model has not is never read, only named as unexpected.
  std::set<std::string> wanted;
  std::map<std::string, torch::Tensor> hf;  // stored name without "roberta." -> tensor
  if (!expected.empty()) {
    for (const auto& [stored, declared] :
         checkpoint::read_safetensors_header(file.string()).tensors) {
      const std::string mapped = xlme_name(stored);
      const auto model = expected.find(mapped);
      if (model == expected.end()) {
        hf[unprefixed(stored)] = torch::Tensor();
        continue;
      }
      XLME_CHECK(declared.dtype == torch::kFloat32 || declared.dtype == torch::kFloat16 ||
                     declared.dtype == torch::kBFloat16,
                 "--init-from {}: {} is stored as {}; XLM-R's weights are F32, F16 or BF16 (the "
                 "model's {} is F32)",
                 file.string(), stored, c10::toString(declared.dtype), mapped);
      int64_t declared_elements = 1, model_elements = 1;
      for (const int64_t d : declared.shape) declared_elements *= d;
      for (const int64_t d : model->second.shape) model_elements *= d;
      const int64_t extra_rows =
          mapped == "embeddings.position.weight" && !declared.shape.empty()
              ? 2 * (model_elements / std::max<int64_t>(1, model->second.shape.front()))
              : 0;
      XLME_CHECK(declared_elements <= model_elements + extra_rows,
                 "--init-from {}: {} has shape {} there but this model's {} is {}; the model "
                 "config must match the source's (compare model.* with its config.json)",
                 file.string(), stored, shape_text(declared.shape), mapped,
                 shape_text(model->second.shape));
      wanted.insert(stored);
    }
  }
  const auto content = expected.empty() ? checkpoint::read_safetensors(file.string())
                                        : checkpoint::read_safetensors(file.string(), wanted);
  for (auto& [name, tensor] : content.tensors) {
    hf[unprefixed(name)] = tensor;
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : hf) {
    if (name == kPositions || name == kTypes) continue;
    // Undefined: a tensor the model has not, left unread; init_weights reports it as unexpected.
    out[xlme_name(name)] = tensor.defined() ? tensor : torch::empty({0});
  }
  const auto positions = hf.find(kPositions);
  if (positions != hf.end() && positions->second.defined()) {
    XLME_CHECK(positions->second.dim() == 2 && positions->second.size(0) > 2,
               "--init-from {}: embeddings.position_embeddings.weight has shape {}; expected "
               "[max_positions + 2, hidden] (XLM-R's positions start at 2)",
               folder, shape_text(positions->second.sizes()));
    auto table = positions->second.narrow(0, 2, positions->second.size(0) - 2).to(torch::kFloat);
    const auto types = hf.find(kTypes);
    if (types != hf.end() && types->second.defined()) {
      table = table + types->second[0].to(torch::kFloat);
    }
    out["embeddings.position.weight"] = table;
  }
  return out;
}

std::map<std::string, torch::Tensor> init_source_weights(const std::string& folder,
                                                         const checkpoint::WeightSpecs& expected) {
  const std::string type = hf_model_type(folder);
  if (!fs::exists(fs::path(folder) / checkpoint::kModelFile) &&
      (type == "xlm-roberta" || type == "roberta")) {
    return xlmr_weights(folder, expected);
  }
  return checkpoint_weights(folder);
}

std::map<std::string, torch::Tensor> checkpoint_weights(const std::string& folder) {
  XLME_CHECK(fs::is_directory(folder),
             "--init-from {}: not a folder; give a pre-training checkpoint folder such as "
             "runs/demo/checkpoints/step_600, or an HF XLM-R checkpoint folder",
             folder);
  const auto files = checkpoint::CheckpointManager::verify(folder);
  const std::string file = files.path(checkpoint::kModelFile);
  // The source may be another model than the one initialized: its own config bounds what its
  // model.pt may hold (fp32 parameters, and buffers within the slack of the bound).
  const config::Config source = config::load_config(files.path(checkpoint::kConfigFile));
  uint64_t parameters = 0;
  for (const auto& m : model::analytic_parameter_counts(
           source.model, model::architecture_for(source.objectives.set))) {
    parameters += static_cast<uint64_t>(m.count);
  }
  auto out = checkpoint::read_module_archive(file, parameters * sizeof(float) + (16u << 20));
  XLME_CHECK(!out.empty(), "--init-from {}: {} holds no tensors", folder, checkpoint::kModelFile);
  checkpoint::check_finite_weights(out, file);
  return out;
}

InitReport init_weights(model::ElectraModel& model,
                        const std::map<std::string, torch::Tensor>& weights,
                        const std::string& parts, const std::string& source) {
  const checkpoint::WeightMatch match = checkpoint::match_weights(
      *model, weights, [&](const std::string& name) { return in_parts(name, parts); });
  if (!match.mismatched.empty()) {
    const auto& m = match.mismatched.front();
    XLME_FAIL(
        "init from {}: {} has shape {} there but {} in this model; the model config must "
        "match the source's (compare model.* with its config.yaml)",
        source, m.name, shape_text(m.stored), shape_text(m.expected));
  }
  checkpoint::copy_weights(*model, weights, match);
  return {match.matched, match.missing, match.unexpected, match.not_selected};
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
