#include "xlme/checkpoint/export_folder.h"

#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/json.h"
#include "xlme/data/tokenizer.h"
#include "xlme/model/electra.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <utility>

namespace xlme::checkpoint {
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

  // A name of `named`'s list, with the message of validate_model's checks.
  template <class E>
  E choice(const std::string& dotted, const config::Named<E>& named) const {
    const std::string spelling = text(dotted);
    const auto value = named.value(spelling);
    XLME_CHECK(value.has_value(), "export config '{}': {} is '{}'; it must be {}", path_, dotted,
               spelling, named.choices().describe());
    return *value;
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

// The model section's attention kernel is the machine's choice, not the model's: exports never
// carry it (a reader keeps its default).
constexpr const char* kNotExported = "attention";

// Writes the fields that ModelConfig::visit lists into config.json, sections as nested objects.
class ModelJsonWriter {
 public:
  explicit ModelJsonWriter(OrderedJson& out) : out_(out) {}

  template <class T, class... ConstraintAndDoc>
  void field(const char* name, const T& value, const ConstraintAndDoc&...) {
    if (std::string(name) != kNotExported) out_[name] = value;
  }
  template <class E>
  void field(const char* name, const E& value, const config::Named<E>& named, const char* doc) {
    field(name, named.name(value), doc);
  }

  template <class T>
  void section(const char* name, T& value, const char* /*doc*/) {
    ModelJsonWriter writer(out_[name]);
    value.visit(writer);
  }

 private:
  OrderedJson& out_;
};

// Reads the fields that ModelConfig::visit lists from config.json, each with its exact JSON type.
class ModelJsonReader {
 public:
  explicit ModelJsonReader(const ExportedConfigReader& r, std::string prefix = "")
      : r_(r), prefix_(std::move(prefix)) {}

  void field(const char* name, bool& value, const char* /*doc*/) {
    if (exported(name)) value = r_.flag(key(name));
  }
  void field(const char* name, int64_t& value, const config::IntRange&, const char* /*doc*/) {
    if (exported(name)) value = r_.integer(key(name));
  }
  void field(const char* name, double& value, const config::RealRange&, const char* /*doc*/) {
    if (exported(name)) value = r_.real(key(name));
  }
  void field(const char* name, std::string& value, const config::Choices&, const char* /*doc*/) {
    if (exported(name)) value = r_.text(key(name));
  }
  template <class E>
  void field(const char* name, E& value, const config::Named<E>& named, const char* /*doc*/) {
    if (exported(name)) value = r_.choice(key(name), named);
  }

  template <class T>
  void section(const char* name, T& value, const char* /*doc*/) {
    ModelJsonReader reader(r_, key(name));
    value.visit(reader);
  }

 private:
  std::string key(const char* name) const { return prefix_.empty() ? name : prefix_ + "." + name; }
  // Whether config.json holds `name`: never the attention kernel; share_layers and
  // cross_attention only in exports made since ALBERT's layer sharing and VECO exist (older ones
  // have the defaults: none, false).
  bool exported(const char* name) const {
    const std::string k = key(name);
    return k != kNotExported && ((k != "share_layers" && k != "cross_attention") || r_.has(k));
  }

  const ExportedConfigReader& r_;
  std::string prefix_;
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
  // Sizes resolved: config.json never says "the discriminator's value".
  config::ModelConfig m = e.model;
  if (m.embedding_size == 0) m.embedding_size = m.hidden_size;
  auto& g = m.generator;
  if (g.hidden_size == 0) g.hidden_size = m.hidden_size;
  if (g.heads == 0) g.heads = m.heads;
  if (g.ffn_size == 0) g.ffn_size = m.ffn_size;
  OrderedJson j;
  j["format"] = kExportFormat;
  j["format_version"] = kExportFormatVersion;
  j["xlme_version"] = XLME_VERSION;
  // electra: generator + discriminator with the RTD head; masked-lm: the mlm baselines; encoder:
  // a distilled student (the encoder alone).
  j["architecture"] = e.rtd_head ? "electra"
                      : model::architecture_for(e.objective_set) == model::Architecture::kEncoder
                          ? "encoder"
                          : "masked-lm";
  j["objective_set"] = e.objective_set;
  j["dtype"] = e.dtype;
  j["vocab_layout"] = e.vocab_layout;
  j["special_ids"] = {{"bos", e.special_ids.bos},
                      {"pad", e.special_ids.pad},
                      {"eos", e.special_ids.eos},
                      {"unk", e.special_ids.unk},
                      {"mask", e.special_ids.mask}};
  j["activation"] = "gelu";
  // Every field of the model section, as ModelConfig::visit lists it.
  ModelJsonWriter writer(j);
  m.visit(writer);
  j["factorized_embeddings"] = m.embedding_size != m.hidden_size;
  j["rtd_head"] = e.rtd_head;
  j["generator"]["exported"] = e.generator;
  j["training"] = {{"step", e.step}, {"tokens_seen", e.tokens_seen}};
  if (!e.tokenizer_crc32.empty()) {
    j["spm_model"] = {
        {"file", kExportTokenizerFile}, {"bytes", e.tokenizer_bytes}, {"crc32", e.tokenizer_crc32}};
  }
  return j.dump(2) + "\n";
}

ExportedConfig parse_exported_config(const std::string& text, const std::string& path) {
  const auto root = parse_json<nlohmann::json>(text, fmt::format("export config '{}'", path),
                                               /*unique_keys=*/true);
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
  // Every field of the model section, as ModelConfig::visit lists it.
  ModelJsonReader reader(r);
  m.visit(reader);
  e.special_ids.vocab_size = m.vocab_size;
  e.special_ids.bos = r.integer("special_ids.bos");
  e.special_ids.pad = r.integer("special_ids.pad");
  e.special_ids.eos = r.integer("special_ids.eos");
  e.special_ids.unk = r.integer("special_ids.unk");
  e.special_ids.mask = r.integer("special_ids.mask");
  e.rtd_head = r.flag("rtd_head");
  e.generator = r.flag("generator.exported");
  e.step = r.integer("training.step");
  e.tokens_seen = r.integer("training.tokens_seen");
  if (r.has("spm_model")) {
    const std::string name = r.text("spm_model.file");
    XLME_CHECK(name == kExportTokenizerFile,
               "export config '{}': 'spm_model.file' is '{}'; an export's tokenizer is {}", path,
               name, kExportTokenizerFile);
    e.tokenizer_bytes = r.integer("spm_model.bytes");
    e.tokenizer_crc32 = r.text("spm_model.crc32");
    const bool hex = e.tokenizer_crc32.size() == 8 &&
                     e.tokenizer_crc32.find_first_not_of("0123456789abcdef") == std::string::npos;
    XLME_CHECK(e.tokenizer_bytes >= 0 && hex,
               "export config '{}': 'spm_model' must record bytes >= 0 and a crc32 of 8 "
               "lowercase hex digits, got {} and '{}'",
               path, e.tokenizer_bytes, e.tokenizer_crc32);
  }
  // The same limits as a YAML config's model section (ModelConfig::visit and its constraints).
  config::validate_model(m, fmt::format("export config '{}'", path));
  check_exported_config(e, path);
  return e;
}

void record_tokenizer(ExportedConfig& exported, const std::string& tokenizer) {
  exported.tokenizer_bytes = static_cast<int64_t>(std::filesystem::file_size(tokenizer));
  exported.tokenizer_crc32 = fmt::format("{:08x}", file_crc32(tokenizer));
}

void check_tokenizer(const ExportedConfig& exported, const std::string& tokenizer,
                     const std::string& config_path) {
  if (exported.tokenizer_crc32.empty()) return;
  ExportedConfig found;
  record_tokenizer(found, tokenizer);
  XLME_CHECK(found.tokenizer_bytes == exported.tokenizer_bytes &&
                 found.tokenizer_crc32 == exported.tokenizer_crc32,
             "'{}' ({} bytes, CRC32 {}) is not the SentencePiece model this export was made with: "
             "export config '{}' records {} bytes, CRC32 {}; its ids would mean other pieces. Put "
             "the export's own {} back, or export the checkpoint again",
             tokenizer, found.tokenizer_bytes, found.tokenizer_crc32, config_path,
             exported.tokenizer_bytes, exported.tokenizer_crc32, kExportTokenizerFile);
}

}  // namespace xlme::checkpoint
