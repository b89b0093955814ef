#include "xlme/export/folder.h"

#include "xlme/common/error.h"
#include "xlme/common/json.h"
#include "xlme/data/tokenizer.h"
#include "xlme/model/electra.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <utility>

namespace xlme::export_ {
namespace {

using OrderedJson = nlohmann::ordered_json;

// The longest string value read from config.json; xlme's are names like "bfloat16".
constexpr size_t kMaxExportedString = 256;

// Reads config.json keys with errors that name the file and the dotted key. Each value must have
// its type exactly: an integer is a JSON integer (or a number without a fraction, like 1e3).
class ExportedConfigReader {
 public:
  ExportedConfigReader(const nlohmann::json& root, std::string path)
      : root_(root), path_(std::move(path)) {}

  const nlohmann::json& node(const std::string& dotted) const {
    const nlohmann::json* at = &root_;
    size_t start = 0;
    while (true) {
      const size_t dot = dotted.find('.', start);
      const std::string key = dotted.substr(start, dot - start);
      XLME_CHECK(at->is_object() && at->contains(key),
                 "export config '{}' has no '{}'; it was not written by this xlme-export or was "
                 "edited; export the checkpoint again",
                 path_, dotted);
      at = &(*at)[key];
      if (dot == std::string::npos) return *at;
      start = dot + 1;
    }
  }

  // Whether a top-level key is there (for keys that exports older than the key lack).
  bool has(const std::string& key) const { return root_.is_object() && root_.contains(key); }

  std::string text(const std::string& dotted) const {
    const auto& value = node(dotted);
    check(value.is_string() && value.get_ref<const std::string&>().size() <= kMaxExportedString,
          dotted, value, fmt::format("a string of at most {} bytes", kMaxExportedString));
    return value.get<std::string>();
  }

  bool flag(const std::string& dotted) const {
    const auto& value = node(dotted);
    check(value.is_boolean(), dotted, value, "true or false");
    return value.get<bool>();
  }

  int64_t integer(const std::string& dotted) const {
    const auto& value = node(dotted);
    constexpr double kLargest = 9.0e18;  // below 2^63: the double converts exactly
    const bool ok = value.is_number_integer()
                        ? !value.is_number_unsigned() ||
                              value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                        : value.is_number_float() &&
                              std::floor(value.get<double>()) == value.get<double>() &&
                              std::fabs(value.get<double>()) <= kLargest;
    check(ok, dotted, value, "a 64-bit integer");
    return value.is_number_float() ? static_cast<int64_t>(value.get<double>())
                                   : value.get<int64_t>();
  }

  double real(const std::string& dotted) const {
    const auto& value = node(dotted);
    check(value.is_number(), dotted, value, "a number");
    return value.get<double>();
  }

 private:
  void check(bool ok, const std::string& dotted, const nlohmann::json& value,
             const std::string& expected) const {
    XLME_CHECK(ok, "export config '{}': '{}' must be {}, got {}", path_, dotted, expected,
               describe_json(value));
  }

  const nlohmann::json& root_;
  std::string path_;
};

// Checks what config.json says beyond the model's shape, which config::validate_model checks.
void check_exported_config(const ExportedConfig& e, const std::string& path) {
  const auto where = fmt::format("export config '{}'", path);
  XLME_CHECK(e.model.vocab_size >= 1, "{}: vocab_size is {}; it must be at least 1", where,
             e.model.vocab_size);
  const std::pair<const char*, int64_t> ids[] = {{"special_ids.bos", e.special_ids.bos},
                                                 {"special_ids.pad", e.special_ids.pad},
                                                 {"special_ids.eos", e.special_ids.eos},
                                                 {"special_ids.unk", e.special_ids.unk},
                                                 {"special_ids.mask", e.special_ids.mask}};
  for (const auto& [key, id] : ids) {
    XLME_CHECK(id >= 0 && id < e.model.vocab_size,
               "{}: {} is {}; it must be an id of the vocabulary, in [0, {})", where, key, id,
               e.model.vocab_size);
  }
  XLME_CHECK(e.dtype == "float32" || e.dtype == "bfloat16",
             "{}: dtype is '{}'; it must be float32 or bfloat16", where, e.dtype);
  try {
    model::architecture_for(e.objective_set);
    data::parse_vocab_layout(e.vocab_layout);
  } catch (const Error& error) {
    XLME_FAIL("{}: {}", where, error.what());
  }
  XLME_CHECK(e.step >= 0 && e.tokens_seen >= 0,
             "{}: training.step ({}) and training.tokens_seen ({}) must not be negative", where,
             e.step, e.tokens_seen);
}

}  // namespace

std::string to_json(const ExportedConfig& e) {
  const auto& m = e.model;
  const int64_t embedding_size = m.embedding_size > 0 ? m.embedding_size : m.hidden_size;
  OrderedJson j;
  j["format"] = kExportFormat;
  j["format_version"] = kExportFormatVersion;
  j["xlme_version"] = XLME_VERSION;
  // electra: generator + discriminator with the RTD head; masked-lm: the mlm baselines.
  j["architecture"] = e.rtd_head ? "electra" : "masked-lm";
  j["objective_set"] = e.objective_set;
  j["dtype"] = e.dtype;
  j["vocab_size"] = m.vocab_size;
  j["vocab_layout"] = e.vocab_layout;
  j["special_ids"] = {{"bos", e.special_ids.bos},
                      {"pad", e.special_ids.pad},
                      {"eos", e.special_ids.eos},
                      {"unk", e.special_ids.unk},
                      {"mask", e.special_ids.mask}};
  j["hidden_size"] = m.hidden_size;
  j["layers"] = m.layers;
  j["heads"] = m.heads;
  j["ffn_size"] = m.ffn_size;
  j["activation"] = "gelu";
  j["embedding_size"] = embedding_size;
  j["factorized_embeddings"] = embedding_size != m.hidden_size;
  j["embedding_sharing"] = m.embedding_sharing;
  j["share_layers"] = m.share_layers;
  j["max_positions"] = m.max_positions;
  j["absolute_positions"] = m.absolute_positions;
  j["norm"] = m.norm;
  j["layer_norm_eps"] = m.layer_norm_eps;
  j["relative_position"] = {{"enabled", m.relative_position.enabled},
                            {"gated", m.relative_position.gated},
                            {"shared_across_layers", m.relative_position.shared_across_layers},
                            {"num_buckets", m.relative_position.num_buckets},
                            {"max_distance", m.relative_position.max_distance}};
  j["dropout"] = m.dropout;
  j["attention_dropout"] = m.attention_dropout;
  j["init_std"] = m.init_std;
  j["rtd_head"] = e.rtd_head;
  const auto& g = m.generator;
  j["generator"] = {{"exported", e.generator},
                    {"layers", g.layers},
                    {"hidden_size", g.hidden_size > 0 ? g.hidden_size : m.hidden_size},
                    {"heads", g.heads > 0 ? g.heads : m.heads},
                    {"ffn_size", g.ffn_size > 0 ? g.ffn_size : m.ffn_size},
                    {"sampling_temperature", g.sampling_temperature}};
  j["training"] = {{"step", e.step}, {"tokens_seen", e.tokens_seen}};
  return j.dump(2) + "\n";
}

ExportedConfig parse_exported_config(const std::string& text, const std::string& path) {
  const auto root = parse_json<nlohmann::json>(text, fmt::format("export config '{}'", path));
  const ExportedConfigReader r(root, path);
  const auto format = r.text("format");
  XLME_CHECK(format == kExportFormat, "'{}' has format '{}', not '{}': it is not an xlme export",
             path, format, kExportFormat);
  const int64_t version = r.integer("format_version");
  XLME_CHECK(version >= 1 && version <= kExportFormatVersion,
             "export config '{}' has format version {}; this xlme (" XLME_VERSION
             ") reads versions up to {}; use a newer xlme",
             path, version, kExportFormatVersion);
  ExportedConfig e;
  auto& m = e.model;
  e.objective_set = r.text("objective_set");
  e.dtype = r.text("dtype");
  e.vocab_layout = r.text("vocab_layout");
  m.vocab_size = r.integer("vocab_size");
  e.special_ids.vocab_size = m.vocab_size;
  e.special_ids.bos = r.integer("special_ids.bos");
  e.special_ids.pad = r.integer("special_ids.pad");
  e.special_ids.eos = r.integer("special_ids.eos");
  e.special_ids.unk = r.integer("special_ids.unk");
  e.special_ids.mask = r.integer("special_ids.mask");
  m.hidden_size = r.integer("hidden_size");
  m.layers = r.integer("layers");
  m.heads = r.integer("heads");
  m.ffn_size = r.integer("ffn_size");
  m.embedding_size = r.integer("embedding_size");
  m.embedding_sharing = r.text("embedding_sharing");
  // Exports made before ALBERT's layer sharing existed have no key: their layers are unshared.
  m.share_layers = r.has("share_layers") ? r.text("share_layers") : "none";
  m.max_positions = r.integer("max_positions");
  m.absolute_positions = r.flag("absolute_positions");
  m.norm = r.text("norm");
  m.layer_norm_eps = r.real("layer_norm_eps");
  m.relative_position.enabled = r.flag("relative_position.enabled");
  m.relative_position.gated = r.flag("relative_position.gated");
  m.relative_position.shared_across_layers = r.flag("relative_position.shared_across_layers");
  m.relative_position.num_buckets = r.integer("relative_position.num_buckets");
  m.relative_position.max_distance = r.integer("relative_position.max_distance");
  m.dropout = r.real("dropout");
  m.attention_dropout = r.real("attention_dropout");
  m.init_std = r.real("init_std");
  e.rtd_head = r.flag("rtd_head");
  e.generator = r.flag("generator.exported");
  m.generator.layers = r.integer("generator.layers");
  m.generator.hidden_size = r.integer("generator.hidden_size");
  m.generator.heads = r.integer("generator.heads");
  m.generator.ffn_size = r.integer("generator.ffn_size");
  m.generator.sampling_temperature = r.real("generator.sampling_temperature");
  e.step = r.integer("training.step");
  e.tokens_seen = r.integer("training.tokens_seen");
  // The same limits as a YAML config's model section (ModelConfig::visit and its constraints).
  config::validate_model(m, fmt::format("export config '{}'", path));
  check_exported_config(e, path);
  return e;
}

}  // namespace xlme::export_
