#include "xlme/export/folder.h"

#include "xlme/common/error.h"

#include <nlohmann/json.hpp>

namespace xlme::export_ {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Reads config.json keys with errors that name the file and the dotted key.
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

  template <class T>
  T get(const std::string& dotted) const {
    const auto& value = node(dotted);
    try {
      return value.get<T>();
    } catch (const nlohmann::json::exception&) {
      XLME_FAIL("export config '{}': '{}' has the wrong type: {}", path_, dotted, value.dump());
    }
  }

 private:
  const nlohmann::json& root_;
  std::string path_;
};

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
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    XLME_FAIL("export config '{}' is not valid JSON: {}", path, e.what());
  }
  const ExportedConfigReader r(root, path);
  const auto format = r.get<std::string>("format");
  XLME_CHECK(format == kExportFormat, "'{}' has format '{}', not '{}': it is not an xlme export",
             path, format, kExportFormat);
  const int version = r.get<int>("format_version");
  XLME_CHECK(version >= 1 && version <= kExportFormatVersion,
             "export config '{}' has format version {}; this xlme (" XLME_VERSION
             ") reads versions up to {}; use a newer xlme",
             path, version, kExportFormatVersion);
  ExportedConfig e;
  auto& m = e.model;
  e.objective_set = r.get<std::string>("objective_set");
  e.dtype = r.get<std::string>("dtype");
  e.vocab_layout = r.get<std::string>("vocab_layout");
  m.vocab_size = r.get<int64_t>("vocab_size");
  e.special_ids.vocab_size = m.vocab_size;
  e.special_ids.bos = r.get<int64_t>("special_ids.bos");
  e.special_ids.pad = r.get<int64_t>("special_ids.pad");
  e.special_ids.eos = r.get<int64_t>("special_ids.eos");
  e.special_ids.unk = r.get<int64_t>("special_ids.unk");
  e.special_ids.mask = r.get<int64_t>("special_ids.mask");
  m.hidden_size = r.get<int64_t>("hidden_size");
  m.layers = r.get<int64_t>("layers");
  m.heads = r.get<int64_t>("heads");
  m.ffn_size = r.get<int64_t>("ffn_size");
  m.embedding_size = r.get<int64_t>("embedding_size");
  m.embedding_sharing = r.get<std::string>("embedding_sharing");
  m.max_positions = r.get<int64_t>("max_positions");
  m.absolute_positions = r.get<bool>("absolute_positions");
  m.norm = r.get<std::string>("norm");
  XLME_CHECK(m.norm == "post" || m.norm == "pre",
             "export config '{}': norm is '{}', not post or pre", path, m.norm);
  m.layer_norm_eps = r.get<double>("layer_norm_eps");
  m.relative_position.enabled = r.get<bool>("relative_position.enabled");
  m.relative_position.gated = r.get<bool>("relative_position.gated");
  m.relative_position.shared_across_layers = r.get<bool>("relative_position.shared_across_layers");
  m.relative_position.num_buckets = r.get<int64_t>("relative_position.num_buckets");
  m.relative_position.max_distance = r.get<int64_t>("relative_position.max_distance");
  m.dropout = r.get<double>("dropout");
  m.attention_dropout = r.get<double>("attention_dropout");
  m.init_std = r.get<double>("init_std");
  e.rtd_head = r.get<bool>("rtd_head");
  e.generator = r.get<bool>("generator.exported");
  m.generator.layers = r.get<int64_t>("generator.layers");
  m.generator.hidden_size = r.get<int64_t>("generator.hidden_size");
  m.generator.heads = r.get<int64_t>("generator.heads");
  m.generator.ffn_size = r.get<int64_t>("generator.ffn_size");
  m.generator.sampling_temperature = r.get<double>("generator.sampling_temperature");
  e.step = r.get<int64_t>("training.step");
  e.tokens_seen = r.get<int64_t>("training.tokens_seen");
  return e;
}

}  // namespace xlme::export_
