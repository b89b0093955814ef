#include "xlme/config/config.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/yaml_file.h"
#include "yaml_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

namespace xlme::config {
namespace {

namespace fs = std::filesystem;
using detail::Origins;
using detail::Source;

constexpr const char* kIncludeKey = "include";

YAML::Node parse_file(const std::string& path) {
  XLME_CHECK(!fs::is_directory(path),
             "config file '{}' is a folder, not a YAML file; pass a file to --config, e.g. "
             "configs/pretrain/demo.yaml",
             path);
  XLME_CHECK(fs::exists(path),
             "config file '{}' not found (working directory: {}); pass an existing YAML file to "
             "--config, e.g. configs/pretrain/demo.yaml",
             path, fs::current_path().string());
  return load_yaml_file(path);
}

// Applies `path` onto `config`: first the files of its `include:` list (paths relative to the
// including file, each one's own includes first), then its own keys.
void apply_file(const std::string& path, Config& config, Origins& origins,
                std::vector<std::string>& chain) {
  const std::string canonical = fs::weakly_canonical(path).string();
  for (const auto& seen : chain) {
    XLME_CHECK(seen != canonical, "{}: include cycle: {} -> {}", path, fmt::join(chain, " -> "),
               canonical);
  }
  YAML::Node root = parse_file(path);
  const Source source{path, true};
  if (root.IsMap()) {
    if (const YAML::Node includes = root[kIncludeKey]) {
      std::vector<std::string> files;
      if (includes.IsScalar()) {
        files.push_back(includes.Scalar());
      } else if (includes.IsSequence()) {
        for (const auto& item : includes) {
          XLME_CHECK(item.IsScalar(), "{}: include: expected a list of file paths",
                     source.where(item));
          files.push_back(item.Scalar());
        }
      } else {
        XLME_FAIL("{}: include: expected a file path or a list of file paths",
                  source.where(includes));
      }
      chain.push_back(canonical);
      for (const auto& file : files) {
        const fs::path resolved =
            fs::path(file).is_absolute() ? fs::path(file) : fs::path(path).parent_path() / file;
        XLME_CHECK(fs::exists(resolved), "{}: included file '{}' not found (looked for {})",
                   source.where(includes), file, resolved.string());
        apply_file(resolved.lexically_normal().string(), config, origins, chain);
      }
      chain.pop_back();
    }
  }
  if (root.IsNull()) return;  // an empty file sets nothing
  detail::YamlReader reader(root, "", source, origins, {kIncludeKey});
  config.visit(reader);
  reader.finish();
}

// `--set a.b.c=value`: a one-key YAML map applied like a file. Values starting with '[' or '{'
// are YAML flow collections ("[de, fr]"); anything else is taken verbatim as one scalar, so that
// paths with spaces or '#' survive.
void apply_override(const std::string& text, Config& config, Origins& origins) {
  const auto eq = text.find('=');
  XLME_CHECK(eq != std::string::npos && eq > 0,
             "--set '{}': expected dotted.key=value, e.g. --set train.lr=1e-4",
             detail::clipped(text));
  const std::string dotted = text.substr(0, eq);
  const std::string value = text.substr(eq + 1);
  YAML::Node leaf;
  if (!value.empty() && (value.front() == '[' || value.front() == '{')) {
    try {
      leaf = YAML::Load(value);
    } catch (const YAML::ParserException& e) {
      XLME_FAIL("--set {}: malformed YAML value: {}", detail::clipped(text), e.msg);
    }
  } else {
    leaf = YAML::Node(value);
  }
  std::vector<std::string> parts;
  std::stringstream stream(dotted);
  for (std::string part; std::getline(stream, part, '.');) {
    XLME_CHECK(!part.empty(), "--set '{}': empty component in key '{}'", text, dotted);
    parts.push_back(part);
  }
  XLME_CHECK(!dotted.empty() && dotted.back() != '.', "--set '{}': empty component in key '{}'",
             text, dotted);
  YAML::Node node = leaf;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node parent(YAML::NodeType::Map);
    parent[*it] = node;
    node = parent;
  }
  const Source source{"--set " + detail::clipped(text), false};
  detail::YamlReader reader(node, "", source, origins);
  config.visit(reader);
  reader.finish();
}

std::string origin_of(const Origins& origins, const std::string& key) {
  const auto it = origins.find(key);
  return it == origins.end() ? "default" : "from " + it->second;
}

// Fine-tuning builds file names from language codes and pair names (download/pawsx/test-de.tsv,
// predictions/tatoeba/test-de.tsv): they are letters, digits, '_' and '-' only, so that a code
// can never name a path ("../../x") outside finetune.data_dir or run.out_dir.
void validate_language_codes(const FinetuneConfig& f, const Origins& o) {
  auto check = [&](const std::string& key, const std::string& code) {
    const bool ok = !code.empty() && std::all_of(code.begin(), code.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
    });
    XLME_CHECK(ok,
               "{} ({}) holds '{}', which is not a language code: use letters, digits, '_' and "
               "'-' only (e.g. de, zh-yue, en-de)",
               key, origin_of(o, key), code);
  };
  check("finetune.train_language", f.train_language);
  for (const auto& code : f.languages) check("finetune.languages", code);
  for (const auto& pair : f.pairs) check("finetune.pairs", pair);
}

// Where the value of a dotted key was set, for messages: "from configs/x.yaml:3", "default".
using OriginOf = std::function<std::string(const std::string& key)>;

// The constraints between the model's fields, for every reader of a model config; keys are named
// `prefix` + the field ("model.heads" in YAML configs, "heads" in an export's config.json).
void check_model_constraints(const ModelConfig& m, const std::string& prefix,
                             const OriginOf& origin) {
  const std::string& p = prefix;
  XLME_CHECK(m.hidden_size % m.heads == 0,
             "{}hidden_size ({}, {}) must be a multiple of {}heads ({}, {})", p, m.hidden_size,
             origin(p + "hidden_size"), p, m.heads, origin(p + "heads"));
  const int64_t gen_hidden = m.generator.hidden_size ? m.generator.hidden_size : m.hidden_size;
  const int64_t gen_heads = m.generator.heads ? m.generator.heads : m.heads;
  XLME_CHECK(gen_hidden % gen_heads == 0,
             "the generator's hidden size ({}) must be a multiple of its number of heads ({}); "
             "set {}generator.hidden_size ({}) and {}generator.heads ({})",
             gen_hidden, gen_heads, p, origin(p + "generator.hidden_size"), p,
             origin(p + "generator.heads"));
  XLME_CHECK(m.embedding_size <= m.hidden_size,
             "{}embedding_size ({}, {}) must not exceed {}hidden_size ({}, {}); 0 means equal to "
             "hidden_size",
             p, m.embedding_size, origin(p + "embedding_size"), p, m.hidden_size,
             origin(p + "hidden_size"));
  const auto& rp = m.relative_position;
  XLME_CHECK(rp.num_buckets % 2 == 0,
             "{}relative_position.num_buckets ({}, {}) must be even: half the buckets are for "
             "each direction",
             p, rp.num_buckets, origin(p + "relative_position.num_buckets"));
  XLME_CHECK(rp.max_distance > rp.num_buckets / 4,
             "{}relative_position.max_distance ({}, {}) must exceed num_buckets / 4 ({}), the "
             "exact buckets per direction",
             p, rp.max_distance, origin(p + "relative_position.max_distance"), rp.num_buckets / 4);
}

// Checks each field against the limits its struct's `visit` lists, for values that the YAML
// reader (which checks them as it reads) did not read. Covers the field kinds ModelConfig has.
class LimitChecker {
 public:
  LimitChecker(const std::string& source, std::string prefix)
      : source_(source), prefix_(std::move(prefix)) {}

  void field(const char* /*name*/, bool& /*value*/, const char* /*doc*/) {}
  void field(const char* name, int64_t& value, const IntRange& range, const char* /*doc*/) {
    check(range.contains(value), name, std::to_string(value), range.describe());
  }
  void field(const char* name, double& value, const RealRange& range, const char* /*doc*/) {
    check(range.contains(value), name, detail::format_scalar(value), range.describe());
  }
  void field(const char* name, std::string& value, const Choices& choices, const char* /*doc*/) {
    check(choices.contains(value), name, "'" + value + "'", choices.describe());
  }
  template <class E>
  void field(const char* name, E& value, const Named<E>& named, const char* /*doc*/) {
    check(!named.name(value).empty(), name, std::to_string(static_cast<int>(value)),
          named.choices().describe());
  }
  template <class T>
  void section(const char* name, T& value, const char* /*doc*/) {
    LimitChecker inner(source_, prefix_ + name + ".");
    value.visit(inner);
  }

 private:
  void check(bool ok, const char* name, const std::string& value,
             const std::string& allowed) const {
    XLME_CHECK(ok, "{}: {}{} is {}; it must be {}", source_, prefix_, name, value, allowed);
  }

  const std::string& source_;
  std::string prefix_;
};

// Constraints that involve more than one key; the message names each key and where it was set.
void validate(const Config& c, const Origins& o) {
  validate_language_codes(c.finetune, o);
  XLME_CHECK(c.run.out_dir.find_first_not_of(" \t") != std::string::npos,
             "run.out_dir ({}) is empty: the run would write into the working directory; set it "
             "to a folder, e.g. --set run.out_dir=runs/demo",
             origin_of(o, "run.out_dir"));
  const auto& m = c.model;
  check_model_constraints(m, "model.", [&](const std::string& key) { return origin_of(o, key); });
  for (const auto* task : {"mono", "para"}) {
    const TaskDataConfig& d = std::string(task) == "mono" ? c.data.mono : c.data.para;
    const std::string key = fmt::format("data.{}.max_len", task);
    XLME_CHECK(d.max_len <= m.max_positions,
               "{} ({}, {}) exceeds model.max_positions ({}, {}); lower one or raise the other",
               key, d.max_len, origin_of(o, key), m.max_positions,
               origin_of(o, "model.max_positions"));
    XLME_CHECK(d.max_len <= c.train.micro_batch_tokens,
               "{} ({}, {}) exceeds train.micro_batch_tokens ({}, {}): one sequence must fit in "
               "a micro-batch",
               key, d.max_len, origin_of(o, key), c.train.micro_batch_tokens,
               origin_of(o, "train.micro_batch_tokens"));
  }
  const auto& set = objectives::objective_set(c.objectives.set);
  XLME_CHECK(!set.cross_attention || m.cross_attention,
             "objectives.set={} ({}) trains VECO's cross-attention modules, but "
             "model.cross_attention is false ({}); set model.cross_attention=true",
             c.objectives.set, origin_of(o, "objectives.set"),
             origin_of(o, "model.cross_attention"));
  XLME_CHECK(set.cross_attention || !m.cross_attention,
             "model.cross_attention=true ({}) adds VECO's cross-attention modules, which only "
             "objectives.set=veco trains, but objectives.set is {} ({}); use --set "
             "objectives.set=veco or model.cross_attention=false",
             origin_of(o, "model.cross_attention"), c.objectives.set,
             origin_of(o, "objectives.set"));
  XLME_CHECK(c.train.warmup_steps <= c.train.steps,
             "train.warmup_steps ({}, {}) exceeds train.steps ({}, {})", c.train.warmup_steps,
             origin_of(o, "train.warmup_steps"), c.train.steps, origin_of(o, "train.steps"));
  XLME_CHECK(c.train.probe_layer <= m.layers,
             "train.probe_layer ({}, {}) exceeds model.layers ({}, {}); use 0..{} or -1 (= "
             "model.layers / 2)",
             c.train.probe_layer, origin_of(o, "train.probe_layer"), m.layers,
             origin_of(o, "model.layers"), m.layers);
  XLME_CHECK(c.finetune.max_len <= m.max_positions,
             "finetune.max_len ({}, {}) exceeds model.max_positions ({}, {})", c.finetune.max_len,
             origin_of(o, "finetune.max_len"), m.max_positions,
             origin_of(o, "model.max_positions"));
  XLME_CHECK(!c.finetune.seeds.empty(), "finetune.seeds ({}) must name at least one seed",
             origin_of(o, "finetune.seeds"));
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config config;
  Origins origins;
  if (!path.empty()) {
    std::vector<std::string> chain;
    apply_file(path, config, origins, chain);
  }
  for (const auto& text : overrides) apply_override(text, config, origins);
  validate(config, origins);
  return config;
}

ModelArgs discriminator_args(const ModelConfig& model) {
  ModelArgs args = model;
  if (args.embedding_size == 0) args.embedding_size = model.hidden_size;
  return args;
}

ModelArgs generator_args(const ModelConfig& model) {
  ModelArgs args = discriminator_args(model);
  const auto& g = model.generator;
  args.layers = g.layers;
  if (g.hidden_size > 0) args.hidden_size = g.hidden_size;
  if (g.heads > 0) args.heads = g.heads;
  if (g.ffn_size > 0) args.ffn_size = g.ffn_size;
  args.embedding_sharing = EmbeddingSharing::kFull;
  args.cross_attention = false;
  return args;
}

void validate_model(const ModelConfig& model, const std::string& source) {
  ModelConfig copy = model;  // visit() is shared with the reader, which needs mutable access
  LimitChecker limits(source, "");
  copy.visit(limits);
  check_model_constraints(model, "", [&](const std::string&) { return "in " + source; });
}

std::string to_yaml(const Config& config, bool docs) {
  std::ostringstream out;
  if (docs) out << "# xlme resolved configuration (defaults < --config file < --set)\n";
  Config copy = config;  // visit() is shared with the reader, which needs mutable access
  detail::YamlWriter writer(out, docs);
  copy.visit(writer);
  return out.str();
}

namespace {

void flatten(const YAML::Node& node, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& item : node) {
      const std::string key = item.first.as<std::string>();
      flatten(item.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else {
    out[prefix] = YAML::Dump(node);
  }
}

}  // namespace

std::map<std::string, std::string> flat_values(const std::string& yaml) {
  std::map<std::string, std::string> out;
  flatten(YAML::Load(yaml), "", out);
  return out;
}

void save_config(const Config& config, const std::string& path) {
  write_file_atomic(path, to_yaml(config, /*docs=*/false));
}

}  // namespace xlme::config
