#include "xlme/export/export.h"

#include "xlme/checkpoint/export_folder.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/json.h"
#include "xlme/export/transformers.h"

#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace xlme::export_ {
namespace {

namespace fs = std::filesystem;

// The weights to export: the discriminator model's, plus the generator side on request.
std::map<std::string, torch::Tensor> exported_weights(checkpoint::Pretrained& p,
                                                      bool with_generator,
                                                      torch::ScalarType dtype) {
  std::map<std::string, torch::Tensor> out;
  auto add = [&](const std::string& key, const torch::Tensor& t) {
    out[key] = t.is_floating_point() ? t.detach().to(dtype) : t.detach();
  };
  for (const auto& [name, tensor] : checkpoint::named_weights(*p.discriminator)) add(name, tensor);
  if (with_generator) {
    for (const auto& item : p.electra->named_parameters()) {
      if (checkpoint::is_generator_weight(item.key())) add(item.key(), item.value());
    }
  }
  return out;
}

// The last record of each kind ("train", "validation", ...) at or before `step` in the run's
// metrics.jsonl; an unreadable line (a crash mid-write, or nested too deeply) is skipped.
std::map<std::string, nlohmann::ordered_json> last_metrics(const std::string& path, int64_t step) {
  std::map<std::string, nlohmann::ordered_json> last;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::ordered_json record;
    try {
      record = parse_json<nlohmann::ordered_json>(line, path);
    } catch (const Error&) {
      continue;
    }
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer() ||
        record["step"].get<int64_t>() > step) {
      continue;
    }
    const std::string kind = record.contains("kind") && record["kind"].is_string()
                                 ? record["kind"].get<std::string>()
                                 : "train";
    last[kind] = record;
  }
  return last;
}

// A value of a metrics record for the model card (bounded: the run's file is not trusted).
std::string metric_value(const nlohmann::ordered_json& value) {
  if (value.is_number_float()) return fmt::format("{:.4g}", value.get<double>());
  if (value.is_string() && value.get_ref<const std::string&>().size() <= kJsonExcerpt) {
    return value.get<std::string>();
  }
  return json_excerpt(value);
}

std::string list_or(const std::vector<std::string>& items, const std::string& empty) {
  if (items.empty()) return empty;
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string model_card(const checkpoint::Pretrained& p, const checkpoint::ExportedConfig& exported,
                       const ExportSummary& summary, const std::string& metrics_path) {
  const auto& m = p.model;
  const auto& rp = m.relative_position;
  std::ostringstream out;
  out << "# XLM-E " << (exported.rtd_head ? "discriminator" : "encoder") << " (xlme export)\n\n"
      << "Exported by xlme-export " << XLME_VERSION << " from `" << p.path << "`.\n\n"
      << "| | |\n| --- | --- |\n"
      << "| training | " << p.step << " steps, " << p.tokens_seen << " tokens seen, objectives.set "
      << p.objective_set << " |\n"
      << "| encoder | " << m.layers << " layers, hidden " << m.hidden_size << ", " << m.heads
      << " heads, FFN " << m.ffn_size << ", " << config::kNorms.name(m.norm) << "-LN, GELU |\n"
      << "| embeddings | " << (m.embedding_size > 0 ? m.embedding_size : m.hidden_size) << " wide ("
      << config::kEmbeddingSharings.name(m.embedding_sharing) << " sharing)"
      << (m.absolute_positions ? fmt::format(", absolute positions up to {}", m.max_positions)
                               : std::string(", no absolute positions"))
      << " |\n"
      << "| relative position bias | "
      << (rp.enabled ? fmt::format("{}{}, {} buckets, max distance {}",
                                   rp.gated ? "gated" : "plain (no gate)",
                                   rp.shared_across_layers ? ", one table for all layers"
                                                           : ", one table per layer",
                                   rp.num_buckets, rp.max_distance)
                     : std::string("off"))
      << " |\n"
      << "| vocabulary | " << m.vocab_size << " ids, " << p.vocab_layout
      << " layout (<s>=" << p.special_ids.bos << ", <pad>=" << p.special_ids.pad
      << ", </s>=" << p.special_ids.eos << ", <unk>=" << p.special_ids.unk
      << ", <mask>=" << p.special_ids.mask << "), SentencePiece model `"
      << checkpoint::kExportTokenizerFile << "` |\n"
      << "| weights | `" << checkpoint::kExportWeightsFile << "`, " << exported.dtype << ", "
      << summary.parameters << " parameters: discriminator, shared embeddings"
      << (exported.rtd_head ? ", RTD head" : "") << (exported.generator ? ", generator + head" : "")
      << " |\n\n";

  out << "## Training data\n\n";
  if (p.run_config) {
    const auto& d = p.run_config->data;
    out << "- shards: `" << d.shards << "` (tokenizer `" << d.tokenizer << "`)\n"
        << "- monolingual (MRTD): " << list_or(d.mono.languages, "every language in the shards")
        << ", max_len " << d.mono.max_len << ", sampling exponent " << d.mono.sampling_exponent
        << "\n"
        << "- parallel (TRTD): " << list_or(d.para.languages, "every pair in the shards")
        << ", max_len " << d.para.max_len << ", sampling exponent " << d.para.sampling_exponent
        << "\n\n";
  } else {
    out << "Not recorded: exported from another export.\n\n";
  }

  out << "## Metrics\n\n";
  const auto records = last_metrics(metrics_path, p.step);
  if (records.empty()) {
    out << "No metrics found (looked for `" << metrics_path << "`).\n\n";
  } else {
    out << "Last records at or before step " << p.step << " in `" << metrics_path << "`:\n\n";
    for (const auto& [kind, record] : records) {
      out << "- " << kind << ":";
      bool first = true;
      for (const auto& [key, value] : record.items()) {
        if (key == "kind") continue;
        out << (first ? " " : ", ") << key << " " << metric_value(value);
        first = false;
      }
      out << "\n";
    }
    out << "\n";
  }

  out << "## Loading\n\n"
      << "PyTorch, with xlme's reference implementation (`scripts/xlme_reference.py`, torch + "
         "numpy only):\n\n"
      << "```python\n"
      << "import torch, xlme_reference  # scripts/ on sys.path\n"
      << "model = xlme_reference.load_model(\"" << summary.out_dir << "\")\n"
      << "ids = torch.tensor([[" << p.special_ids.bos << ", 17, 42, " << p.special_ids.eos
      << "]])\n"
      << "states = model.hidden_states(ids)  # [embeddings, layer 1, ..., layer " << m.layers
      << "]\n"
      << "```\n\n"
      << "or `python3 scripts/xlme_reference.py --model " << summary.out_dir
      << " --ids \"0 17 42 2\"`. With HuggingFace `transformers` (the folder holds its remote "
         "code; `sentencepiece` for the tokenizer):\n\n"
      << "```python\n"
      << "from transformers import AutoModel, AutoTokenizer\n"
      << "model = AutoModel.from_pretrained(\"" << summary.out_dir
      << "\", trust_remote_code=True)\n"
      << "tokenizer = AutoTokenizer.from_pretrained(\"" << summary.out_dir
      << "\", trust_remote_code=True)\n"
      << "out = model(**tokenizer([\"Hello world\"], return_tensors=\"pt\"), "
         "output_hidden_states=True)\n"
      << "```\n\n"
      << "(`AutoModelForSequenceClassification`, `...ForTokenClassification` and "
         "`...ForQuestionAnswering` add xlme-finetune's heads.) In C++: "
         "`xlme::checkpoint::load_pretrained(\""
      << summary.out_dir
      << "\")`. The weights are plain safetensors (`safetensors.torch.load_file`); "
         "`config.json` lists every architectural field.\n";
  return out.str();
}

// Copies a file's bytes atomically (write_file_atomic: temporary file, fsync, rename).
void copy_file_synced(const std::string& from, const std::string& to) {
  write_file_atomic(to, read_file(from));
}

bool is_non_empty_directory(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && !fs::is_empty(path, ec);
}

// The names xlme-export writes into an export folder.
const std::set<std::string>& export_file_names() {
  static const std::set<std::string> names = [] {
    std::set<std::string> own = {checkpoint::kExportWeightsFile, checkpoint::kExportConfigFile,
                                 checkpoint::kExportTokenizerFile, checkpoint::kExportReadmeFile,
                                 checkpoint::kExportMarkerFile, "tokenizer_config.json",
                                 kTokenizerJsonFile,
                                 // Python's byte-code cache of the remote code, once imported
                                 "__pycache__"};
    for (const auto& file : transformers_files()) own.insert(file.name);
    return own;
  }();
  return names;
}

// The file an export writes first into its unfinished folder (<out>.tmp-<pid>) and removes last,
// before the folder moves into place: only a folder holding it is removed as a killed export's.
constexpr const char* kUnfinishedMarker = ".xlme-export-unfinished";

// The first entry of folder `dir` that xlme-export does not write ("" when none). With
// `temporary_suffix` (".tmp-<pid>" of the export that made an unfinished folder), a file that
// export was writing when it was killed (write_file_streamed's `<name>.tmp-<pid>`) is its own too.
std::string foreign_entry(const fs::path& dir, const std::string& temporary_suffix = "") {
  const auto own = [&](const std::string& name) {
    return export_file_names().count(name) > 0 || name == kUnfinishedMarker;
  };
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool own_temporary = !temporary_suffix.empty() && name.size() > temporary_suffix.size() &&
                               name.compare(name.size() - temporary_suffix.size(),
                                            std::string::npos, temporary_suffix) == 0 &&
                               own(name.substr(0, name.size() - temporary_suffix.size())) &&
                               entry.is_regular_file() && !entry.is_symlink();
    if (!own(name) && !own_temporary) return name;
  }
  return "";
}

// Why --force may not replace the existing folder `out` ("" when it may): only a folder that
// xlme-export wrote (its marker file) and that holds nothing but an export's files is replaced.
std::string not_replaceable(const fs::path& out) {
  std::error_code ec;
  if (fs::exists(out / checkpoint::kCheckpointsFolder, ec) ||
      fs::exists(out / checkpoint::kManifestFile, ec) ||
      fs::exists(out / checkpoint::kModelFile, ec)) {
    return "it holds checkpoints (a run or checkpoint folder)";
  }
  if (!fs::is_regular_file(out / checkpoint::kExportMarkerFile, ec)) {
    return fmt::format("xlme-export did not write it (no {} marker file)",
                       checkpoint::kExportMarkerFile);
  }
  const std::string foreign = foreign_entry(out);
  if (!foreign.empty()) {
    return fmt::format("it holds '{}', which xlme-export does not write", foreign);
  }
  return "";
}

// Folders a killed xlme-export left beside `out` (<out>.tmp-<pid>: unfinished; <out>.old-<pid>:
// the export it was replacing), handled under the export's lock, so that no other export of
// `out` runs: an unfinished one holding only export files is removed; an old one is put back when
// `out` is missing, or removed when it is a replaceable export. Anything else stays, with a
// warning naming it.
void clean_leftovers(const fs::path& out) {
  const std::string prefix = out.filename().string();
  std::error_code ec;
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(out.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.rfind(prefix + ".tmp-", 0) == 0 || name.rfind(prefix + ".old-", 0) == 0;
    if (ours && entry.is_directory(ec) && !entry.is_symlink(ec)) found.push_back(entry.path());
  }
  for (const auto& path : found) {
    const std::string name = path.filename().string();
    const bool unfinished = name.rfind(prefix + ".tmp-", 0) == 0;
    if (unfinished && fs::is_regular_file(path / kUnfinishedMarker, ec) &&
        !fs::is_symlink(path / kUnfinishedMarker, ec) &&
        foreign_entry(path, name.substr(prefix.size())).empty()) {
      fs::remove_all(path, ec);
      spdlog::warn("removed '{}', the unfinished folder of an xlme-export that was killed",
                   path.string());
    } else if (!unfinished && !fs::exists(out, ec) && not_replaceable(path).empty()) {
      fs::rename(path, out, ec);
      spdlog::warn(
          "'{}' was missing and '{}' held the export an xlme-export was replacing when "
          "it was killed: put back",
          out.string(), path.string());
    } else if (!unfinished && not_replaceable(path).empty()) {
      fs::remove_all(path, ec);
      spdlog::warn("removed '{}', an old export an xlme-export that was killed had set aside",
                   path.string());
    } else {
      spdlog::warn(
          "'{}' looks like a folder a killed xlme-export left, but holds other files; "
          "it is kept: remove it yourself once you have checked it",
          path.string());
    }
  }
}

// `path` absolute, normalized, without a trailing separator.
fs::path plain_absolute(const std::string& path) {
  fs::path p = fs::absolute(path).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p;
}

// Whether `inner` is `outer` or lies inside it (symbolic links resolved).
bool is_within(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(inner, ec);
  const fs::path b = fs::weakly_canonical(outer, ec);
  auto i = a.begin();
  for (auto o = b.begin(); o != b.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == a.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

void move_export_into_place(const std::string& written, const std::string& out_dir, bool force) {
  const fs::path tmp(written), out(out_dir);
  const fs::path old = out.string() + fmt::format(".old-{}", ::getpid());
  std::error_code ec;
  // Checked again here, not only at start: the folder at `out` may have changed meanwhile (a run
  // moved there, another export), and only what is replaceable now may be moved aside.
  const auto refuse = [&](const std::string& reason) {
    fs::remove_all(tmp, ec);
    XLME_FAIL(
        "export folder '{}' changed while the export ran: {}; it was left as it is and the "
        "new export discarded. Choose another --out, or run again",
        out_dir, reason);
  };
  const bool replace = fs::exists(fs::symlink_status(out, ec));
  if (replace) {
    if (fs::is_symlink(out, ec)) refuse("it is now a symbolic link");
    if (!fs::is_directory(out, ec)) refuse("it is now a file");
    if (!fs::is_empty(out, ec)) {
      if (!force) refuse("it is not empty (pass --force to replace an export)");
      const std::string reason = not_replaceable(out);
      if (!reason.empty()) refuse(reason);
    }
    fs::rename(out, old);
    // What was moved aside is what was checked: a folder swapped in between is put back.
    const std::string reason = fs::is_empty(old, ec) ? "" : not_replaceable(old);
    if (!reason.empty()) {
      fs::rename(old, out);
      refuse(reason);
    }
  }
  fs::rename(tmp, out);
  fsync_path(out.parent_path().string(), O_RDONLY | O_DIRECTORY);
  if (replace) fs::remove_all(old);
}

ExportOptions ExportOptions::from_config(const config::Config& config) {
  ExportOptions o;
  o.checkpoint = config.export_.checkpoint;
  o.out_dir = config.export_.out_dir;
  o.with_generator = config.export_.with_generator;
  o.dtype = config.export_.dtype;
  o.fallback_tokenizer = config.data.tokenizer;
  return o;
}

namespace {

// The checks made before anything is locked or read: the options, and `--out` as a place to
// write (not a link, not a file, not the checkpoint's own folder). Returns `--out` absolute.
fs::path checked_destination(const ExportOptions& options) {
  XLME_CHECK(!options.checkpoint.empty(),
             "no checkpoint to export: pass --checkpoint DIR (a run folder, whose newest valid "
             "checkpoint is exported, a <run>/checkpoints/step_<N> folder or an export folder) or "
             "--set export.checkpoint=DIR");
  XLME_CHECK(!options.out_dir.empty(), "export.out_dir is empty; pass --out DIR");
  XLME_CHECK(options.dtype == "fp32" || options.dtype == "bf16",
             "export dtype must be fp32 or bf16, not '{}'", options.dtype);
  const fs::path out = plain_absolute(options.out_dir);
  std::error_code ec;
  XLME_CHECK(!fs::is_symlink(out, ec),
             "export folder '{}' is a symbolic link; xlme-export never writes or replaces "
             "through one: give the real folder as --out",
             options.out_dir);
  XLME_CHECK(!fs::exists(out, ec) || fs::is_directory(out, ec),
             "export folder '{}' exists and is a file; choose another --out", options.out_dir);
  XLME_CHECK(!is_within(options.checkpoint, out),
             "--out '{}' is the folder being exported or holds it ('{}'); choose another --out",
             options.out_dir, options.checkpoint);
  return out;
}

// A non-empty `out` is replaced only with --force, and only when xlme-export wrote it.
void check_replaceable(const ExportOptions& options, const fs::path& out) {
  if (!is_non_empty_directory(out)) return;
  XLME_CHECK(options.force,
             "export folder '{}' exists and is not empty; pass --force to replace it, or choose "
             "another --out",
             options.out_dir);
  const std::string reason = not_replaceable(out);
  XLME_CHECK(reason.empty(),
             "--force refuses to replace '{}': {}; only an export folder written by xlme-export "
             "is replaced. Choose another --out (or remove the folder yourself)",
             options.out_dir, reason);
}

// The checkpoint to export, with its tokenizer. A run folder stands for its newest valid
// checkpoint, as finetune.init and distill.teacher.
checkpoint::Pretrained load_source(const ExportOptions& options) {
  checkpoint::PretrainedOptions load;
  load.with_generator = options.with_generator;
  load.fallback_tokenizer = options.fallback_tokenizer;
  checkpoint::Pretrained p = checkpoint::load_pretrained_resolved(options.checkpoint, load);
  if (p.path != options.checkpoint) {
    spdlog::info("run folder {}: exporting its newest valid checkpoint {}", options.checkpoint,
                 p.path);
  }
  XLME_CHECK(!p.tokenizer_path.empty(),
             "checkpoint '{}' holds no tokenizer.model (its run had no data.tokenizer); give the "
             "SentencePiece model it was trained with: --set data.tokenizer=FILE",
             p.path);
  spdlog::info("loaded {} (step {}, {} tokens seen)", p.path, p.step, p.tokens_seen);
  return p;
}

// config.json's content for the export of `p`.
checkpoint::ExportedConfig exported_config(const checkpoint::Pretrained& p,
                                           const ExportOptions& options) {
  checkpoint::ExportedConfig exported;
  exported.model = p.model;
  exported.objective_set = p.objective_set;
  exported.vocab_layout = p.vocab_layout;
  exported.special_ids = p.special_ids;
  exported.dtype = options.dtype == "bf16" ? "bfloat16" : "float32";
  exported.rtd_head = !p.discriminator->discriminator_head.is_empty();
  exported.generator = options.with_generator;
  exported.step = p.step;
  exported.tokens_seen = p.tokens_seen;
  return exported;
}

// The run's metrics.jsonl for the model card: beside the checkpoints folder
// (<run>/checkpoints/step_<N>), else under the run's recorded run.out_dir.
fs::path metrics_file(const checkpoint::Pretrained& p) {
  const fs::path source = fs::absolute(p.path).lexically_normal();
  fs::path metrics = source.parent_path().parent_path() / checkpoint::kMetricsFile;
  if (!fs::is_regular_file(metrics) && p.run_config) {
    metrics = fs::path(p.run_config->run.out_dir) / checkpoint::kMetricsFile;
  }
  return metrics;
}

// Writes the export's files into the new folder `tmp`, the unfinished marker first and removed
// last; sets `summary.weight_bytes`. `metrics`: the run's metrics.jsonl, for the model card.
void write_export_files(const fs::path& tmp, const checkpoint::Pretrained& p,
                        const checkpoint::SafetensorsContent& content,
                        checkpoint::ExportedConfig& exported, const fs::path& metrics,
                        ExportSummary& summary) {
  write_file_atomic(
      (tmp / kUnfinishedMarker).string(),
      fmt::format("an unfinished xlme-export (pid {} on host {})\n", ::getpid(), host_name()));
  checkpoint::write_safetensors((tmp / checkpoint::kExportWeightsFile).string(), content);
  summary.weight_bytes = fs::file_size(tmp / checkpoint::kExportWeightsFile);
  const std::string tokenizer = (tmp / checkpoint::kExportTokenizerFile).string();
  copy_file_synced(p.tokenizer_file, tokenizer);
  checkpoint::record_tokenizer(exported, tokenizer);
  write_file_atomic((tmp / checkpoint::kExportConfigFile).string(), checkpoint::to_json(exported));
  write_transformers_files(tmp.string(), exported);
  write_file_atomic((tmp / checkpoint::kExportReadmeFile).string(),
                    model_card(p, exported, summary, metrics.string()));
  write_file_atomic((tmp / checkpoint::kExportMarkerFile).string(),
                    "written by xlme-export " XLME_VERSION "; --force may replace this folder\n");
  fs::remove(tmp / kUnfinishedMarker);
}

}  // namespace

ExportSummary export_model(const ExportOptions& options) {
  const fs::path out = checked_destination(options);
  // One export of `out` at a time: a second one fails here naming the first, instead of both
  // finishing and one export silently replacing the other.
  std::error_code ec;
  fs::create_directories(out.parent_path(), ec);
  const FileLock lock(out.string() + ".lock", fmt::format("export folder '{}'", options.out_dir),
                      "two exports to one --out would replace each other",
                      /*remove_when_done=*/true);
  clean_leftovers(out);
  check_replaceable(options, out);

  checkpoint::Pretrained p = load_source(options);
  checkpoint::SafetensorsContent content;
  content.tensors = exported_weights(p, options.with_generator,
                                     options.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32);
  content.metadata = {{"format", "pt"}, {"producer", "xlme-export " XLME_VERSION}};
  checkpoint::ExportedConfig exported = exported_config(p, options);

  ExportSummary summary;
  summary.out_dir = options.out_dir;
  summary.step = p.step;
  summary.tensors = static_cast<int64_t>(content.tensors.size());
  for (const auto& [name, tensor] : content.tensors) summary.parameters += tensor.numel();
  const fs::path metrics = metrics_file(p);

  // A new folder of this export's own: one left at this name that clean_leftovers kept (no
  // marker, or files of someone else) is not removed by its name alone.
  const fs::path tmp = out.string() + fmt::format(".tmp-{}", ::getpid());
  XLME_CHECK(!fs::exists(fs::symlink_status(tmp, ec)),
             "'{}' exists and is not an unfinished export's folder (no {} file in it, or other "
             "files): it is kept; move it away and run xlme-export again",
             tmp.string(), kUnfinishedMarker);
  fs::create_directories(tmp, ec);
  XLME_CHECK(!ec, "cannot create the folder '{}': {}", tmp.string(), ec.message());
  try {
    write_export_files(tmp, p, content, exported, metrics, summary);
    move_export_into_place(tmp.string(), out.string(), options.force);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    XLME_FAIL("cannot write the export folder '{}': {}", options.out_dir, e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  spdlog::info("exported {} tensors ({} parameters, {} bytes, {}) to {}", summary.tensors,
               summary.parameters, summary.weight_bytes, options.dtype, options.out_dir);
  return summary;
}

}  // namespace xlme::export_
