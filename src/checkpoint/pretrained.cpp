#include "xlme/checkpoint/pretrained.h"

#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/export_folder.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/checkpoint/manager.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/shape_text.h"
#include "xlme/config/yaml_file.h"
#include "xlme/data/tokenizer.h"
#include "xlme/model/parameter_count.h"

#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

namespace xlme::checkpoint {
namespace {

namespace fs = std::filesystem;

// The longest config.json read: an export's is a few kilobytes.
constexpr uintmax_t kMaxExportConfigBytes = 1u << 20;

std::string read_export_config(const std::string& path) {
  std::error_code ec;
  XLME_CHECK(fs::is_regular_file(path, ec),
             "export config '{}' is missing or not a regular file: the folder is incomplete; "
             "export the checkpoint again",
             path);
  const uintmax_t size = fs::file_size(path, ec);
  XLME_CHECK(!ec && size <= kMaxExportConfigBytes,
             "export config '{}' is {} bytes long; an export's config.json is a few kilobytes "
             "(at most {} accepted): it is not an xlme export's",
             path, size, kMaxExportConfigBytes);
  return read_file(path, "export config");
}

// Copies `weights` into `module` by name. Every parameter and buffer of the module must be there
// with its shape, and every weight must be the module's (or, when `generator_allowed`, the
// generator side's; when `cross_attention_allowed`, VECO's cross-attention, plugged out): errors
// name `source` and the weights, and nothing is copied then.
void copy_weights_strictly(torch::nn::Module& module,
                           const std::map<std::string, torch::Tensor>& weights,
                           bool generator_allowed, bool cross_attention_allowed,
                           const std::string& source) {
  const WeightMatch match = match_weights(module, weights);
  std::vector<std::string> unexpected;
  for (const auto& name : match.unexpected) {
    if (!(generator_allowed && is_generator_weight(name)) &&
        !(cross_attention_allowed && is_cross_attention_weight(name))) {
      unexpected.push_back(name);
    }
  }
  XLME_CHECK(unexpected.empty(),
             "'{}' has {} weight(s) that the model of its config does not have: {}; the weights "
             "and the config do not belong together",
             source, unexpected.size(), first_weight_names(unexpected));
  XLME_CHECK(match.missing.empty(),
             "'{}' lacks {} weight(s) that the model of its config needs: {}; the weights and the "
             "config do not belong together",
             source, match.missing.size(), first_weight_names(match.missing));
  std::vector<std::string> mismatched;
  for (const auto& m : match.mismatched) {
    mismatched.push_back(fmt::format("{} ({} stored, {} expected)", m.name, shape_text(m.stored),
                                     shape_text(m.expected)));
  }
  XLME_CHECK(mismatched.empty(),
             "'{}' has weights whose shape differs from the model of its config: {}", source,
             first_weight_names(mismatched));
  copy_weights(module, weights, match);
}

// Loading is strict, so the weights hold every parameter of the model that the config describes.
// A config that describes a larger model than the file holds is refused before anything is built:
// a few edited sizes must not allocate gigabytes.
// `stored`: the values the weight file declares (an upper bound for an archive).
void check_model_fits_weights(const Pretrained& p, model::Architecture architecture,
                              uint64_t stored, const std::string& weights_file,
                              const std::string& config_file) {
  const auto counts = model::analytic_parameter_counts(p.model, architecture);
  const auto needed = static_cast<uint64_t>(model::count_of(counts, "embeddings") +
                                            model::count_of(counts, "discriminator"));
  XLME_CHECK(needed <= stored,
             "'{}' describes a model with {} parameters in its embeddings and encoder, but '{}' "
             "holds only {} values; the weights and the config do not belong together",
             config_file, needed, weights_file, stored);
}

// The values that `specs` declare in all (saturating: a hostile header may overflow the sum).
uint64_t declared_values(const WeightSpecs& specs) {
  uint64_t total = 0;
  for (const auto& [name, spec] : specs) {
    uint64_t n = 1;
    for (const int64_t size : spec.shape) n *= static_cast<uint64_t>(size);
    if (__builtin_add_overflow(total, n, &total)) return UINT64_MAX;
  }
  return total;
}

// The vocabulary size and special ids of the weights, the config and the tokenizer agree.
// `declared`: what the weight file declares, checked before anything of it is read.
void check_vocabulary(Pretrained& p, const WeightSpecs& declared, const std::string& weights_file,
                      const std::string& config_file) {
  const auto table = declared.find("embeddings.token.weight");
  XLME_CHECK(table != declared.end() && table->second.shape.size() == 2,
             "'{}' has no 2-D embeddings.token.weight: it is not an xlme model", weights_file);
  XLME_CHECK(table->second.shape[0] == p.model.vocab_size,
             "vocabulary size mismatch: embeddings.token.weight in '{}' has {} rows but '{}' says "
             "vocab_size {}; the weights and the config do not belong together",
             weights_file, table->second.shape[0], config_file, p.model.vocab_size);
  if (p.tokenizer_path.empty()) return;
  const data::Tokenizer tokenizer(p.tokenizer_path, data::parse_vocab_layout(p.vocab_layout));
  XLME_CHECK(tokenizer.vocab_size() == p.model.vocab_size,
             "vocabulary size mismatch: the tokenizer '{}' ({} layout) has {} ids (<mask> "
             "included) but '{}' says vocab_size {} (and the weights have {} rows); use the "
             "SentencePiece model the model was trained with",
             p.tokenizer_path, p.vocab_layout, tokenizer.vocab_size(), config_file,
             p.model.vocab_size, table->second.shape[0]);
  const auto& t = tokenizer.special_ids();
  const auto& c = p.special_ids;
  const std::pair<const char*, std::pair<int64_t, int64_t>> ids[] = {{"<s>", {c.bos, t.bos}},
                                                                     {"<pad>", {c.pad, t.pad}},
                                                                     {"</s>", {c.eos, t.eos}},
                                                                     {"<unk>", {c.unk, t.unk}},
                                                                     {"<mask>", {c.mask, t.mask}}};
  for (const auto& [piece, pair] : ids) {
    XLME_CHECK(pair.first == pair.second,
               "special id mismatch: {} is {} in '{}' but {} in the tokenizer '{}' ({} layout); "
               "use the SentencePiece model and data.vocab_layout the model was trained with",
               piece, pair.first, config_file, pair.second, p.tokenizer_path, p.vocab_layout);
  }
}

// Reads what a checkpoint says of itself into `p`; returns the path of its model.pt.
std::string read_checkpoint(const VerifiedFiles& files, const PretrainedOptions& options,
                            Pretrained& p, std::string& config_file) {
  // Every file below is read through the verified manifest: an unlisted file is never read.
  config_file = files.path(kConfigFile);
  const config::Config run = config::load_config(config_file);
  p.run_config = run;
  p.model = run.model;
  p.objective_set = run.objectives.set;
  p.vocab_layout = run.data.vocab_layout;
  const TrainerState state = read_trainer_state(files.path(kTrainerStateFile));
  p.step = state.step;
  p.tokens_seen = state.tokens_seen;
  p.tokenizer_path =
      files.lists(kTokenizerFile) ? files.path(kTokenizerFile) : options.fallback_tokenizer;
  // The trainer's vocabulary: <mask> last, the others fixed (data::SpecialIds).
  p.special_ids = data::SpecialIds::for_vocab(p.model.vocab_size);
  return files.path(kModelFile);
}

// Reads what an export says of itself into `p`; returns the path of its model.safetensors.
std::string read_export(const std::string& path, const PretrainedOptions& options, Pretrained& p,
                        std::string& config_file, bool& has_generator) {
  config_file = (fs::path(path) / kExportConfigFile).string();
  const ExportedConfig exported =
      parse_exported_config(read_export_config(config_file), config_file);
  p.model = exported.model;
  p.objective_set = exported.objective_set;
  p.vocab_layout = exported.vocab_layout;
  p.special_ids = exported.special_ids;
  p.step = exported.step;
  p.tokens_seen = exported.tokens_seen;
  p.dtype = exported.dtype;
  has_generator = exported.generator;
  XLME_CHECK(!options.with_generator || exported.generator,
             "export '{}' has no generator weights; export the checkpoint again with "
             "--with-generator",
             path);
  p.tokenizer_path = (fs::path(path) / kExportTokenizerFile).string();
  XLME_CHECK(fs::is_regular_file(p.tokenizer_path),
             "export '{}' has no {}: the folder is incomplete; export the checkpoint again", path,
             kExportTokenizerFile);
  check_tokenizer(exported, p.tokenizer_path, config_file);
  return (fs::path(path) / kExportWeightsFile).string();
}

// What the weight file of `p` holds when it is what it says: a checkpoint's model.pt the whole
// model the run trained (its cross-attention included); an export the discriminator without
// cross-attention and, when exported, the generator's parameters (xlme-export's
// exported_weights).
WeightSpecs expected_weights(const Pretrained& p, model::Architecture architecture,
                             bool has_generator) {
  torch::NoGradGuard no_grad;
  if (p.source == PretrainedSource::kCheckpoint) {
    return weight_specs(*model::ElectraModel(p.model, architecture, p.special_ids));
  }
  config::ModelConfig plain = p.model;
  plain.cross_attention = false;
  WeightSpecs out = weight_specs(
      *model::DiscriminatorModel(plain, architecture == model::Architecture::kElectra));
  if (has_generator) {
    const model::ElectraModel electra(plain, architecture, p.special_ids);
    for (const auto& item : electra->named_parameters()) {
      if (is_generator_weight(item.key())) {
        out[item.key()] = {item.value().sizes().vec(), item.value().scalar_type()};
      }
    }
  }
  return out;
}

}  // namespace

bool is_generator_weight(const std::string& name) {
  for (const char* prefix : {"generator.", "generator_head.", "mlm_head."}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

bool is_cross_attention_weight(const std::string& name) {
  return name.find(".cross_attention.") != std::string::npos ||
         name.find(".cross_attention_norm.") != std::string::npos;
}

std::string resolve_pretrained_folder(const std::string& path) {
  const std::string checkpoints = checkpoints_folder(path);
  if (!fs::is_directory(checkpoints)) return path;
  const auto latest = CheckpointManager(checkpoints, 1, 0).latest_valid();
  XLME_CHECK(latest.has_value(), "run folder {} has no valid checkpoint under {}", path,
             checkpoints);
  return latest->path;
}

PretrainedSource detect_pretrained_source(const std::string& path) {
  const fs::path folder(path);
  XLME_CHECK(fs::is_directory(folder), "pre-trained model folder '{}' not found", path);
  if (fs::is_regular_file(folder / kExportConfigFile) ||
      fs::is_regular_file(folder / kExportWeightsFile)) {
    return PretrainedSource::kExport;
  }
  if (fs::is_regular_file(folder / kModelFile) || fs::is_regular_file(folder / kManifestFile)) {
    return PretrainedSource::kCheckpoint;
  }
  XLME_CHECK(!fs::is_directory(folder / kCheckpointsFolder),
             "'{}' is a run folder; pass one of its checkpoints ({}/checkpoints/step_<N>) or an "
             "xlme-export folder",
             path, path);
  XLME_FAIL(
      "'{}' is neither a pre-training checkpoint (model.pt, config.yaml, manifest.yaml) nor an "
      "xlme-export folder ({}, {}, {})",
      path, kExportWeightsFile, kExportConfigFile, kExportTokenizerFile);
}

Pretrained load_pretrained(const std::string& path, const PretrainedOptions& options) {
  Pretrained p;
  p.path = path;
  p.source = detect_pretrained_source(path);
  std::string config_file;
  bool has_generator = true;  // a checkpoint always holds the whole model
  std::optional<VerifiedFiles> files;
  if (p.source == PretrainedSource::kCheckpoint) files = CheckpointManager::verify(path);
  const std::string weights_file = files
                                       ? read_checkpoint(*files, options, p, config_file)
                                       : read_export(path, options, p, config_file, has_generator);
  if (!p.tokenizer_path.empty()) {
    // Opened right after the checkpoint verified and kept open: the file stays readable when a
    // live run prunes the checkpoint later.
    const int fd = ::open(p.tokenizer_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    XLME_CHECK(fd >= 0, "cannot open the tokenizer '{}': {}", p.tokenizer_path,
               std::strerror(errno));
    p.tokenizer_fd = std::shared_ptr<const int>(new int(fd), [](const int* f) {
      ::close(*f);
      delete f;
    });
    p.tokenizer_file = fmt::format("/proc/self/fd/{}", fd);
  }
  const auto architecture = model::architecture_for(p.objective_set);
  XLME_CHECK(!options.with_generator || architecture != model::Architecture::kEncoder,
             "'{}' is a student distilled with objectives.set={}: it has no generator or MLM "
             "head; load or export it without the generator (no --with-generator)",
             path, p.objective_set);
  // VECO's cross-attention is plugged out unless asked for: the model is then the plain encoder,
  // as exports write it.
  const bool has_cross_attention = p.model.cross_attention;
  XLME_CHECK(
      !options.cross_attention || has_cross_attention,
      "'{}' has no cross-attention to plug in (pre-trained with objectives.set={}{}); "
      "finetune.cross_attention=plug-in needs the run or checkpoint folder of an "
      "objectives.set=veco pre-training; use finetune.cross_attention=plug-out",
      path, p.objective_set,
      p.source == PretrainedSource::kExport ? ", and exports leave the cross-attention out" : "");
  // What the file declares is checked against the model before anything of it is read: an extra
  // tensor, however large it claims to be, is refused by name and never allocated.
  const std::string hint = "the weights and the config do not belong together";
  std::map<std::string, torch::Tensor> weights;
  if (p.source == PretrainedSource::kExport) {
    const SafetensorsHeader header = read_safetensors_header(weights_file);
    check_vocabulary(p, header.tensors, weights_file, config_file);
    check_model_fits_weights(p, architecture, declared_values(header.tensors), weights_file,
                             config_file);
    const WeightSpecs expected = expected_weights(p, architecture, has_generator);
    // The documented conversion: a bf16 export (config.json's dtype) is read into fp32 weights.
    const torch::ScalarType floating = p.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
    check_declared_weights(header.tensors, expected, floating, weights_file, hint);
    std::set<std::string> names;
    for (const auto& [name, spec] : expected) names.insert(name);
    weights = read_safetensors(weights_file, names).tensors;
  } else {
    // model.pt holds fp32 values: its size bounds how many.
    check_model_fits_weights(p, architecture, fs::file_size(weights_file) / sizeof(float),
                             weights_file, config_file);
    weights = read_module_archive(weights_file, expected_weights(p, architecture, has_generator));
    WeightSpecs declared;
    for (const auto& [name, tensor] : weights) {
      declared[name] = {tensor.sizes().vec(), tensor.scalar_type()};
    }
    check_vocabulary(p, declared, weights_file, config_file);
  }
  check_finite_weights(weights, weights_file);
  p.model.cross_attention = options.cross_attention;
  p.discriminator =
      model::DiscriminatorModel(p.model, architecture == model::Architecture::kElectra);
  copy_weights_strictly(*p.discriminator, weights, has_generator, has_cross_attention,
                        weights_file);
  p.discriminator->eval();
  if (options.with_generator) {
    p.electra = model::ElectraModel(p.model, architecture, p.special_ids);
    copy_weights_strictly(*p.electra, weights, /*generator_allowed=*/false, has_cross_attention,
                          weights_file);
    p.electra->eval();
  }
  return p;
}

Pretrained load_pretrained_resolved(const std::string& path, const PretrainedOptions& options) {
  constexpr int kAttempts = 20;
  const std::string checkpoints = checkpoints_folder(path);
  // The checkpoint folders of a run folder by name: they change while its run saves and prunes.
  const auto listed = [&] {
    std::vector<std::string> names;
    if (!fs::is_directory(checkpoints)) return names;
    for (const auto& ref : CheckpointManager(checkpoints, 1, 0).list()) names.push_back(ref.path);
    return names;
  };
  for (int attempt = 1;; ++attempt) {
    const auto before = listed();
    try {
      return load_pretrained(resolve_pretrained_folder(path), options);
    } catch (const std::exception&) {
      // Any failure (an xlme::Error or a file system error of a file pruned under the reader)
      // while the run's checkpoints changed: the newest one left is read again.
      if (before.empty() || listed() == before || attempt == kAttempts) throw;
      spdlog::info(
          "the checkpoints of {} changed while one was read (its run saves and prunes old ones); "
          "reading the newest one again",
          path);
    }
  }
}

}  // namespace xlme::checkpoint
