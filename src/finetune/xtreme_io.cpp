#include "xlme/finetune/xtreme_io.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/finetune/task_registry.h"
#include "xlme/finetune/text.h"
#include "xtreme_files.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

namespace xlme::finetune {

namespace fs = std::filesystem;

namespace io {

data::LineReaderOptions reader_options() {
  data::LineReaderOptions options;
  options.warn_invalid_utf8 = true;
  return options;
}

std::string where(const std::string& path, int64_t line) {
  return fmt::format("{}:{}", path, line);
}

void require_file(const std::string& path, const std::string& what) {
  XLME_CHECK(fs::is_regular_file(path),
             "{}: file '{}' not found; download the data (XTREME's "
             "scripts/download_data.sh) or fix the data folder in the config",
             what, path);
}

std::string check_label(const std::string& label, const std::string& task, const std::string& at) {
  const auto& labels = task_labels(task);
  XLME_CHECK(contains(labels, label), "{}: label '{}' is not in the {} label set [{}]", at, label,
             task, join(labels));
  return label;
}

void drop_bom(std::string& line) {
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
}

std::vector<std::string> read_lines(const std::string& path) {
  data::LineReader reader(path, reader_options());
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
  data::LineReader reader(path, io::reader_options());
  std::vector<TsvRow> rows;
  std::string line;
  bool first = true;
  while (reader.next(line)) {
    if (first) io::drop_bom(line);
    first = false;
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
