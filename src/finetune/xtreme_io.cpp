#include "xlme/finetune/xtreme_io.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/task_registry.h"
#include "xlme/finetune/text.h"
#include "xtreme_files.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

namespace xlme::finetune {

namespace fs = std::filesystem;

namespace io {

namespace {

data::LineReaderOptions reader_options(int64_t keep_bytes) {
  data::LineReaderOptions options;
  options.warn_invalid_utf8 = true;
  options.refuse_cr_inside_later_lines = false;
  options.max_line_bytes = keep_bytes;
  options.keep_long_line_prefix = keep_bytes > 0;
  return options;
}

// Long lines named one by one, then counted.
constexpr int64_t kLongLinesNamed = 5;

}  // namespace

Lines::Lines(const std::string& path, int64_t keep_bytes)
    : reader_(path, reader_options(keep_bytes)), keep_bytes_(keep_bytes) {}

bool Lines::next(std::string& line) {
  if (!reader_.next(line)) {
    if (reader_.long_lines() > kLongLinesNamed) {
      spdlog::warn("'{}': {} lines longer than {} bytes were cut to their first {}", reader_.path(),
                   reader_.long_lines(), keep_bytes_, keep_bytes_);
    }
    return false;
  }
  if (reader_.too_long() && reader_.long_lines() <= kLongLinesNamed) {
    spdlog::warn("{}: a line longer than {} bytes: only its first {} are read",
                 where(reader_.path(), reader_.lines_read()), keep_bytes_, line.size());
  }
  const size_t nul = line.find('\0');
  XLME_CHECK(nul == std::string::npos,
             "{}: a NUL byte at byte {} of the line; a text file holds none: is it binary, "
             "UTF-16, or damaged (a failed download or copy)? Fetch or convert it again",
             where(reader_.path(), reader_.lines_read()), nul + 1);
  return true;
}

std::string where(const std::string& path, int64_t line) {
  return fmt::format("{}:{}", path, line);
}

void require_file(const std::string& path, const std::string& what, const std::string& remedy) {
  XLME_CHECK(fs::is_regular_file(path), "{}: file '{}' not found; {}", what, path, remedy);
}

std::string download_remedy(const std::string& data_dir) {
  return fmt::format(
      "XTREME's scripts/download_data.sh writes it into its download/ folder; set "
      "finetune.data_dir ('{}') to that folder",
      data_dir.empty() ? "." : data_dir);
}

std::string data_remedy(const std::string& task, const std::string& data_dir) {
  const std::string dir = data_dir.empty() ? "." : data_dir;
  switch (task_info(task).gold) {
    case TaskGold::kUdRelease:
      return fmt::format(
          "write it with 'xlme-data xtreme --task udpos --input <the unpacked "
          "ud-treebanks-v2.5.tgz> --out {}' (finetune.data_dir)",
          dir);
    case TaskGold::kPanxRaw:
      return fmt::format(
          "write it with 'xlme-data xtreme --task panx --input <a folder with each <lang>.tar.gz "
          "of WikiAnn's AmazonPhotos.zip unpacked into <lang>/> --out {}' (finetune.data_dir)",
          dir);
    case TaskGold::kNone:
      return fmt::format("check finetune.data_dir ('{}')", dir);
    default:
      return download_remedy(data_dir);
  }
}

std::string gold_remedy(TaskGold gold) {
  switch (gold) {
    case TaskGold::kXnliRelease:
      return "finetune.gold_dir must hold XNLI-1.0/xnli.test.tsv (unpack XNLI-1.0.zip into it)";
    case TaskGold::kPawsxRelease:
      return "finetune.gold_dir must hold x-final/<lang>/test_2k.tsv (unpack PAWS-X's "
             "x-final.tar.gz into it)";
    case TaskGold::kUdRelease:
      return "finetune.gold_dir must be a UD v2.5 release folder (the unpacked "
             "ud-treebanks-v2.5.tgz, with <lang>_*-ud-test.conllu files)";
    case TaskGold::kPanxRaw:
      return "finetune.gold_dir must hold <lang>/test (unpack each <lang>.tar.gz of WikiAnn's "
             "AmazonPhotos.zip into <gold_dir>/<lang>/)";
    case TaskGold::kSquadJson:
      return "put the SQuAD-format file with its answers, under the same name, into "
             "finetune.gold_dir";
    case TaskGold::kLaserTatoeba:
      return "finetune.gold_dir must be LASER's data/tatoeba/v1 folder (tatoeba.<xxx>-eng.<xxx> "
             "and tatoeba.<xxx>-eng.eng for each language)";
    case TaskGold::kBucc:
      return "finetune.gold_dir must hold bucc2018/<lang>-en.test.{<lang>,en,gold} (BUCC 2018's "
             "training-gold archive, renamed as XTREME does: training -> test)";
    case TaskGold::kNone:
      break;
  }
  return "this task reads its gold from finetune.data_dir";
}

void require_content(bool found, const std::string& path, const std::string& expected) {
  if (found) return;
  std::error_code error;
  const auto bytes = fs::file_size(path, error);
  XLME_CHECK(error || bytes > 0,
             "'{}' is empty (0 bytes); a failed download or copy? fetch or write it again", path);
  XLME_FAIL("'{}' holds no {}; is it the right file, complete?", path, expected);
}

std::string visible(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '\\') {
      out.push_back(c);
    } else {
      out += fmt::format("\\x{:02X}", byte);
    }
  }
  return out;
}

std::string check_label(const std::string& label, const std::string& task, const std::string& at) {
  const auto& labels = task_labels(task);
  if (contains(labels, label)) return label;
  // Labels are ASCII: anything else is shown by its bytes, so that an invisible character (a
  // byte-order mark of a file pasted into this one, a no-break space) shows in the message.
  const bool bom = label.find("\xEF\xBB\xBF") != std::string::npos;
  constexpr size_t kShown = 60;
  const std::string shown =
      label.size() <= kShown
          ? "'" + visible(label) + "'"
          : fmt::format("'{}...' ({} bytes)", visible(label.substr(0, kShown)), label.size());
  XLME_FAIL("{}: label {} is not in the {} label set [{}]{}", at, shown, task, join(labels),
            bom ? "; it holds a UTF-8 byte-order mark (\\xEF\\xBB\\xBF): was a file that starts "
                  "with one pasted or concatenated into this one? Remove the mark"
                : "");
}

std::vector<std::string> read_lines(const std::string& path, int64_t keep_bytes) {
  Lines reader(path, keep_bytes);
  std::vector<std::string> lines;
  for (std::string line; reader.next(line);) lines.push_back(line);
  return lines;
}

void write_lines_atomic(const std::string& path, const std::vector<std::string>& lines) {
  std::string content;
  for (const auto& l : lines) content += l + "\n";
  write_file_atomic(path, content);
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

}  // namespace io

// ---- Paths -------------------------------------------------------------------------------------

std::string path_under(const std::string& root, const std::string& relative) {
  fs::path base = fs::path(root.empty() ? "." : root).lexically_normal();
  if (base.filename().empty() && base.has_parent_path() && base != base.root_path()) {
    base = base.parent_path();  // "download/" -> "download"
  }
  const fs::path rel(relative);
  const fs::path joined = (base / rel).lexically_normal();
  const fs::path inside = joined.lexically_relative(base);
  const bool ok =
      !rel.has_root_path() && !inside.empty() && *inside.begin() != ".." && *inside.begin() != ".";
  XLME_CHECK(ok,
             "the path '{}' built under '{}' leads outside that folder; a language code, pair "
             "name or file name from the config must not contain '/' or '..' (finetune.data_dir, "
             "finetune.gold_dir and run.out_dir bound what xlme-finetune reads and writes)",
             relative, root);
  return (fs::path(root) / rel).string();
}

// ---- TSV ---------------------------------------------------------------------------------------

TsvQuoting parse_tsv_quoting(const std::string& name) {
  if (name == "faithful") return TsvQuoting::kFaithful;
  if (name == "unquoted") return TsvQuoting::kUnquoted;
  XLME_FAIL(
      "unknown TSV quoting '{}'; use 'faithful' (quotes kept, as XTREME) or 'unquoted' "
      "(proper CSV)",
      name);
}

std::vector<TsvRow> read_tsv(const std::string& path, TsvQuoting quoting) {
  io::Lines reader(path);
  std::vector<TsvRow> rows;
  std::string line;
  while (reader.next(line)) {
    if (line.empty()) continue;
    TsvRow row;
    row.line = reader.lines_read();
    if (quoting == TsvQuoting::kFaithful) {
      row.fields = text::split_tabs(line);
      rows.push_back(std::move(row));
      continue;
    }
    // Excel dialect: a field that starts with '"' runs to the next lone '"' (doubled quotes are
    // one quote), possibly over several lines; characters after the closing quote are kept as
    // Python's csv does.
    std::string fieldv;
    bool quoted = false, in_quotes = false;
    size_t i = 0;
    while (true) {
      if (i == line.size()) {
        if (in_quotes) {
          XLME_CHECK(reader.next(line),
                     "{}: a quoted field opened on this line is never closed; "
                     "is the file truncated, or should it be read with quoting 'faithful'?",
                     io::where(path, row.line));
          fieldv.push_back('\n');
          i = 0;
          continue;
        }
        row.fields.push_back(std::move(fieldv));
        break;
      }
      const char c = line[i++];
      if (in_quotes) {
        if (c == '"' && i < line.size() && line[i] == '"') {
          fieldv.push_back('"');
          ++i;
        } else if (c == '"') {
          in_quotes = false;
        } else {
          fieldv.push_back(c);
        }
      } else if (c == '\t') {
        row.fields.push_back(std::move(fieldv));
        fieldv.clear();
        quoted = false;
      } else if (c == '"' && fieldv.empty() && !quoted) {
        quoted = in_quotes = true;
      } else {
        fieldv.push_back(c);
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// ---- Test files against their gold -------------------------------------------------------------

namespace {

// `value` quoted for a message, cut to 60 bytes at a character boundary.
std::string excerpt(const std::string& value) {
  constexpr size_t kMax = 60;
  if (value.size() <= kMax) return "'" + value + "'";
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(value[cut]) & 0xC0) == 0x80) --cut;
  return "'" + value.substr(0, cut) + "...'";
}

std::string place(const Source& source) {
  return source.line > 0 ? io::where(source.file, source.line) : source.file;
}

}  // namespace

void check_test_matches_gold(const std::string& what, const std::vector<ExampleKey>& test,
                             const std::string& test_file, const std::vector<ExampleKey>& gold,
                             const std::string& gold_files, const std::string& unit,
                             const std::vector<std::string>& field_names, const SameValue& same,
                             const std::string& kind) {
  auto field_name = [&](size_t j) {
    return field_names.size() == 1 ? fmt::format("{} {}", field_names[0], j + 1)
                                   : field_names.at(j);
  };
  auto equal = [&](const std::string& a, const std::string& b) {
    return same ? same(a, b) : a == b;
  };
  const size_t n = std::min(test.size(), gold.size());
  std::string difference;
  size_t k = 0;
  for (; k < n && difference.empty(); ++k) {
    const auto& a = test[k].fields;
    const auto& b = gold[k].fields;
    for (size_t j = 0; j < std::min(a.size(), b.size()) && difference.empty(); ++j) {
      if (!equal(a[j], b[j])) {
        difference = fmt::format("{} is {} in the {} and {} in the gold", field_name(j),
                                 excerpt(a[j]), kind, excerpt(b[j]));
      }
    }
    if (difference.empty() && a.size() != b.size()) {
      const std::string name = field_names.size() == 1 ? field_names[0] + "s" : "fields";
      difference = fmt::format("{} {} in the {}, {} in the gold", a.size(), name, kind, b.size());
    }
    if (!difference.empty()) {
      difference = fmt::format("{} {} ({}; gold {}): {}", unit, k + 1, place(test[k].source),
                               place(gold[k].source), difference);
    }
  }
  if (difference.empty() && test.size() != gold.size()) {
    const bool gold_longer = gold.size() > test.size();
    const auto& first = gold_longer ? gold[n] : test[n];
    difference =
        fmt::format("after {} {}s the {} ends; the {} goes on at {}", n, unit,
                    gold_longer ? kind : "gold", gold_longer ? "gold" : kind, place(first.source));
  }
  XLME_CHECK(difference.empty(),
             "{}: the {} '{}' ({} {}s) and the gold {} ({} {}s) differ; first difference: {}. "
             "XTREME's {} is made from the gold: are both complete and of the same release?",
             what, kind, test_file, test.size(), unit, gold_files, gold.size(), unit, difference,
             kind);
}

// ---- Submission layout -------------------------------------------------------------------------

std::string prediction_path(const std::string& dir, const std::string& task,
                            const std::string& lang) {
  const bool qa = task_info(task).family == TaskFamily::kQa;
  return path_under(dir, fmt::format("{}/test-{}.{}", task, lang, qa ? "json" : "tsv"));
}

void write_label_predictions(const std::string& path, const std::vector<std::string>& labels) {
  io::write_lines_atomic(path, labels);
}

void write_tag_predictions(const std::string& path,
                           const std::vector<std::vector<std::string>>& sentences) {
  std::string content;
  for (size_t s = 0; s < sentences.size(); ++s) {
    if (s > 0) content += "\n";
    for (const auto& tag : sentences[s]) content += tag + "\n";
  }
  write_file_atomic(path, content);
}

void write_qa_predictions(const std::string& path,
                          const std::map<std::string, std::string>& answers) {
  write_file_atomic(path, nlohmann::json(answers).dump(2) + "\n");
}

void write_index_predictions(const std::string& path, const std::vector<int64_t>& indices) {
  std::vector<std::string> lines;
  for (const int64_t i : indices) lines.push_back(std::to_string(i));
  io::write_lines_atomic(path, lines);
}

void write_pair_predictions(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<std::string> lines;
  for (const auto& [a, b] : pairs) lines.push_back(a + "\t" + b);
  io::write_lines_atomic(path, lines);
}

}  // namespace xlme::finetune
