#include "xlme/finetune/xtreme_io.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/data/line_reader.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace xlme::finetune {

namespace fs = std::filesystem;

namespace {

// XTREME files are read with a warning naming the file and line for invalid UTF-8.
data::LineReaderOptions xtreme_reader_options() {
  data::LineReaderOptions options;
  options.warn_invalid_utf8 = true;
  return options;
}

namespace xio {

const std::map<std::string, std::vector<std::string>>& languages_by_task() {
  static const std::map<std::string, std::vector<std::string>> table = [] {
    auto split = [](const std::string& s) {
      std::vector<std::string> out;
      std::istringstream in(s);
      for (std::string w; in >> w;) out.push_back(w);
      return out;
    };
    return std::map<std::string, std::vector<std::string>>{
        {"udpos", split("af ar bg de el en es et eu fa fi fr he hi hu id it ja kk ko mr nl pt ru "
                        "ta te th tl tr ur vi yo zh")},
        {"panx", split("ar he vi id jv ms tl eu ml ta te af nl en de el bn hi mr ur fa fr it pt "
                       "es bg ru ja ka ko th sw yo my zh kk tr et fi hu")},
        {"xnli", split("ar bg de el en es fr hi ru sw th tr ur vi zh")},
        {"pawsx", split("de en es fr ja ko zh")},
        {"xquad", split("en es de el ru tr ar vi th zh hi")},
        {"mlqa", split("en es de ar hi vi zh")},
        {"tydiqa", split("en ar bn fi id ko ru sw te")},
        {"tatoeba", split("ar he vi id jv tl eu ml ta te af nl de el bn hi mr ur fa fr it pt es "
                          "bg ru ja ka ko th sw zh kk tr et fi hu")},
        {"bucc", split("de fr ru zh")},
        {"squad", split("en")},
    };
  }();
  return table;
}

std::string join(const std::vector<std::string>& items, const std::string& sep = " ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

bool contains(const std::vector<std::string>& items, const std::string& s) {
  return std::find(items.begin(), items.end(), s) != items.end();
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    fields.push_back(
        line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return fields;
    start = tab + 1;
  }
}

// Python's str.strip() for the ASCII whitespace that occurs in these files.
std::string strip(const std::string& s) {
  const char* ws = " \t\r\n\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

void drop_bom(std::string& line) {
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
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

// The byte offset of code point `cp` in UTF-8 `text` (text.size() just past the end); -1 when
// `text` has fewer code points.
int64_t byte_offset_of_code_point(const std::string& text, int64_t cp) {
  if (cp < 0) return -1;
  int64_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;  // continuation byte
    if (seen == cp) return static_cast<int64_t>(i);
    ++seen;
  }
  return seen == cp ? static_cast<int64_t>(text.size()) : -1;
}

const nlohmann::json& field(const nlohmann::json& j, const char* key, nlohmann::json::value_t type,
                            const std::string& path, std::string_view at) {
  const auto it = j.find(key);
  XLME_CHECK(it != j.end(), "{}: {}.{} is missing; is this a SQuAD v1.1 JSON file?", path, at, key);
  const bool ok = type == nlohmann::json::value_t::number_integer ? it->is_number_integer()
                                                                  : it->type() == type;
  XLME_CHECK(ok, "{}: {}.{} has type {}, expected {}", path, at, key, it->type_name(),
             nlohmann::json(type).type_name());
  return *it;
}

// One sentence of a UD tree: the words with their heads, and the multi-word token ranges.
struct UdWord {
  int64_t id = 0, head = 0;
  std::string form, upos;
};
struct UdRange {
  int64_t first = 0, last = 0;
  std::string form;
};

// The POS precedence lists of ud-conversion-tools' conllu_to_conll.py (POSRANKPRECEDENCEDICT),
// which break ties between the highest nodes of a multi-word span.
const std::vector<std::string>& pos_precedence(const std::string& lang) {
  static const std::map<std::string, std::vector<std::string>> lists = {
      {"default",
       {"VERB", "NOUN", "PROPN", "PRON", "ADJ", "NUM", "ADV", "INTJ", "AUX", "ADP", "DET", "PART",
        "CCONJ", "SCONJ", "X", "PUNCT"}},
      {"es", {"VERB", "AUX", "PRON", "ADP", "DET"}},
      {"fr", {"VERB", "AUX", "PRON", "NOUN", "ADJ", "ADV", "ADP", "DET", "PART", "SCONJ", "CONJ"}},
      {"it", {"VERB", "AUX", "ADV", "PRON", "ADP", "DET"}},
  };
  const auto it = lists.find(lang);
  return it != lists.end() ? it->second : lists.at("default");
}

// The words of one UD sentence after conllu_to_conll.py's fused-form step (see read_conllu).
std::vector<UdWord> fuse_multiword_tokens(const std::vector<UdWord>& words,
                                          const std::vector<UdRange>& ranges,
                                          const std::string& lang) {
  std::unordered_map<int64_t, size_t> index;
  for (size_t i = 0; i < words.size(); ++i) index[words[i].id] = i;
  auto depth = [&](int64_t id) {  // ancestors up to the root, guarding against cycles
    int64_t d = 0;
    for (int64_t h = words[index.at(id)].head; d <= static_cast<int64_t>(words.size()); ++d) {
      const auto it = index.find(h);
      if (it == index.end()) return d + 1;  // h is the root 0 (or dangling)
      h = words[it->second].head;
    }
    return d;
  };
  std::vector<bool> removed(words.size(), false);
  std::vector<UdWord> out = words;
  const auto& precedence = pos_precedence(lang);
  for (const auto& range : ranges) {
    std::vector<int64_t> span;
    for (int64_t id = range.first; id <= range.last; ++id)
      if (index.count(id)) span.push_back(id);
    if (span.empty()) continue;
    int64_t best_depth = INT64_MAX;
    for (const int64_t id : span) best_depth = std::min(best_depth, depth(id));
    std::vector<int64_t> highest;
    for (const int64_t id : span)
      if (depth(id) == best_depth) highest.push_back(id);
    int64_t head = highest.front();
    if (highest.size() > 1) {
      size_t best_rank = precedence.size() + 1;
      for (const int64_t id : highest) {
        const auto it = std::find(precedence.begin(), precedence.end(), words[index[id]].upos);
        const size_t rank = static_cast<size_t>(it - precedence.begin());
        if (it != precedence.end() && rank < best_rank) {
          best_rank = rank;
          head = id;
        }
      }
    }
    for (const int64_t id : span) {
      if (id == head) {
        out[index[id]].form = range.form;
      } else {
        removed[index[id]] = true;
      }
    }
  }
  std::vector<UdWord> kept;
  for (size_t i = 0; i < out.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(out[i]));
  return kept;
}

// XTREME's udpos clean-up of a form: strip, delete U+200C (ZWNJ) and spaces.
std::string clean_ud_form(const std::string& form) {
  std::string s = strip(form), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xE2\x80\x8C") == 0) {
      i += 2;
    } else if (s[i] != ' ') {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<std::string> split_spaces(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  data::LineReader reader(path, xtreme_reader_options());
  std::vector<std::string> lines;
  for (std::string line; reader.next(line);) lines.push_back(line);
  return lines;
}

void write_lines_atomic(const std::string& path, const std::vector<std::string>& lines) {
  std::string content;
  for (const auto& l : lines) content += l + "\n";
  write_file_atomic(path, content);
}

}  // namespace xio
}  // namespace

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

// ---- Tasks -------------------------------------------------------------------------------------

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"xnli", "pawsx",  "udpos",   "panx", "xquad",
                                                 "mlqa", "tydiqa", "tatoeba", "bucc", "squad"};
  return names;
}

const std::vector<std::string>& task_languages(const std::string& task) {
  const auto& table = xio::languages_by_task();
  const auto it = table.find(task);
  XLME_CHECK(it != table.end(), "unknown XTREME task '{}'; the tasks are: {}", task,
             xio::join(task_names()));
  return it->second;
}

const std::vector<std::string>& task_labels(std::string_view task) {
  static const std::map<std::string, std::vector<std::string>, std::less<>> labels = {
      {"xnli", {"contradiction", "entailment", "neutral"}},
      {"pawsx", {"0", "1"}},
      {"udpos",
       {"O", "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
        "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X"}},
      {"panx", {"B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"}},
  };
  const auto it = labels.find(task);
  XLME_CHECK(it != labels.end(),
             "task '{}' has no label set; the labelled tasks are: xnli pawsx "
             "udpos panx",
             task);
  return it->second;
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
  data::LineReader reader(path, xtreme_reader_options());
  std::vector<TsvRow> rows;
  std::string line;
  bool first = true;
  while (reader.next(line)) {
    if (first) xio::drop_bom(line);
    first = false;
    if (line.empty()) continue;
    TsvRow row;
    row.line = reader.lines_read();
    if (quoting == TsvQuoting::kFaithful) {
      row.fields = xio::split_tabs(line);
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
                     xio::where(path, row.line));
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

// ---- Sentence-pair classification --------------------------------------------------------------

std::string pair_file(const std::string& download_dir, const std::string& task,
                      const std::string& split, const std::string& lang) {
  const std::string current =
      path_under(download_dir, fmt::format("{}/{}-{}.tsv", task, split, lang));
  const std::string original =
      path_under(download_dir, fmt::format("{}/{}-{}.tsv", task, lang, split));
  if (fs::is_regular_file(current)) return current;
  if (fs::is_regular_file(original)) return original;
  XLME_FAIL(
      "{} {} split for language '{}': neither '{}' nor '{}' exists; run XTREME's "
      "download_data.sh or drop '{}' from the task's languages",
      task, split, lang, current, original, lang);
}

std::vector<PairExample> read_pair_tsv(const std::string& path, const std::string& task,
                                       const std::string& split, TsvQuoting quoting) {
  task_labels(task);  // validates the task
  std::vector<PairExample> examples;
  for (auto& row : read_tsv(path, quoting)) {
    const std::string at = xio::where(path, row.line);
    const size_t n = row.fields.size();
    XLME_CHECK(n == 3 || (split == "test" && n == 2),
               "{}: expected {} TAB-separated columns (text_a, text_b, label{}), found {}", at,
               split == "test" ? "2 or 3" : "3", split == "test" ? " absent on test" : "", n);
    PairExample ex;
    ex.text_a = std::move(row.fields[0]);
    ex.text_b = std::move(row.fields[1]);
    if (n == 3) {
      std::string label = xio::strip(row.fields[2]);
      if (task == "xnli" && label == "contradictory") label = "contradiction";
      ex.label = xio::check_label(label, task, at);
    }
    ex.source = {path, row.line};
    examples.push_back(std::move(ex));
  }
  return examples;
}

std::vector<PairExample> read_pair_split(const std::string& download_dir, const std::string& task,
                                         const std::string& split, const std::string& lang,
                                         TsvQuoting quoting) {
  return read_pair_tsv(pair_file(download_dir, task, split, lang), task, split, quoting);
}

std::vector<PairExample> read_xnli_gold(const std::string& path, const std::string& lang) {
  xio::require_file(path, "XNLI-1.0 gold for language '" + lang + "'");
  data::LineReader reader(path, xtreme_reader_options());
  std::vector<PairExample> examples;
  std::string line;
  reader.next(line);  // header
  while (reader.next(line)) {
    if (line.empty()) continue;
    const std::string at = xio::where(path, reader.lines_read());
    const auto f = xio::split_tabs(line);
    XLME_CHECK(f.size() >= 8,
               "{}: expected XNLI-1.0's columns (language, gold_label, ..., "
               "sentence1 at 6, sentence2 at 7), found {} columns",
               at, f.size());
    if (xio::strip(f[0]) != lang) continue;
    PairExample ex;
    std::string label = xio::strip(f[1]);
    if (label == "contradictory") label = "contradiction";
    ex.label = xio::check_label(label, "xnli", at);
    ex.text_a = xio::strip(f[6]);
    ex.text_b = xio::strip(f[7]);
    ex.source = {path, reader.lines_read()};
    examples.push_back(std::move(ex));
  }
  XLME_CHECK(!examples.empty(), "{}: no pairs for language '{}'; is it an XNLI language ({})?",
             path, lang, xio::join(task_languages("xnli")));
  return examples;
}

std::vector<PairExample> read_pawsx_gold(const std::string& path) {
  xio::require_file(path, "PAWS-X gold");
  data::LineReader reader(path, xtreme_reader_options());
  std::vector<PairExample> examples;
  std::string line;
  reader.next(line);  // header
  while (reader.next(line)) {
    if (line.empty()) continue;
    const std::string at = xio::where(path, reader.lines_read());
    const auto f = xio::split_tabs(line);
    XLME_CHECK(f.size() == 4, "{}: expected 4 columns (id, sentence1, sentence2, label), found {}",
               at, f.size());
    PairExample ex;
    ex.text_a = xio::strip(f[1]);
    ex.text_b = xio::strip(f[2]);
    ex.label = xio::check_label(xio::strip(f[3]), "pawsx", at);
    ex.source = {path, reader.lines_read()};
    examples.push_back(std::move(ex));
  }
  return examples;
}

// ---- Tagging -----------------------------------------------------------------------------------

std::string tagging_file(const std::string& download_dir, const std::string& task,
                         const std::string& split, const std::string& lang) {
  const std::string path = path_under(download_dir, fmt::format("{}/{}-{}.tsv", task, split, lang));
  XLME_CHECK(fs::is_regular_file(path),
             "{} {} split for language '{}': '{}' does not exist; run "
             "XTREME's download_data.sh or drop '{}' from the task's languages",
             task, split, lang, path, lang);
  return path;
}

std::vector<TaggedSentence> read_conll_tsv(const std::string& path, const std::string& task) {
  if (!task.empty()) task_labels(task);
  data::LineReader reader(path, xtreme_reader_options());
  std::vector<TaggedSentence> sentences;
  TaggedSentence current;
  int tagged = -1;  // unknown until the first word line: 1 word+tag, 0 word only
  auto flush = [&] {
    if (!current.words.empty()) sentences.push_back(std::move(current));
    current = TaggedSentence();
  };
  std::string line;
  while (reader.next(line)) {
    if (reader.lines_read() == 1) xio::drop_bom(line);
    if (xio::strip(line).empty()) {
      flush();
      continue;
    }
    const std::string at = xio::where(path, reader.lines_read());
    auto f = xio::split_tabs(line);
    XLME_CHECK(f.size() <= 2,
               "{}: expected 'word TAB tag' or 'word', found {} TAB-separated "
               "fields",
               at, f.size());
    const int has_tag = f.size() == 2 ? 1 : 0;
    XLME_CHECK(tagged < 0 || tagged == has_tag,
               "{}: this line has {} but earlier lines {}; a "
               "file carries tags on every word or on none",
               at, has_tag ? "a tag" : "no tag", tagged ? "have tags" : "do not");
    tagged = has_tag;
    if (current.words.empty()) current.source = {path, reader.lines_read()};
    current.words.push_back(f[0]);
    if (has_tag) {
      const std::string tag = xio::strip(f[1]);
      current.tags.push_back(task.empty() ? tag : xio::check_label(tag, task, at));
    }
  }
  flush();
  return sentences;
}

std::vector<TaggedSentence> read_panx_raw(const std::string& path) {
  data::LineReader reader(path, xtreme_reader_options());
  std::vector<TaggedSentence> sentences;
  TaggedSentence current;
  std::string line;
  while (reader.next(line)) {
    const auto f = xio::split_tabs(xio::strip(line));
    if (f.size() != 2) {
      if (!current.words.empty()) sentences.push_back(std::move(current));
      current = TaggedSentence();
      continue;
    }
    const std::string at = xio::where(path, reader.lines_read());
    const size_t colon = f[0].find(':');
    XLME_CHECK(colon != std::string::npos,
               "{}: token '{}' has no 'lang:' prefix; raw PAN-X lines "
               "read 'en:token TAB tag' (use read_conll_tsv for XTREME's processed files)",
               at, f[0]);
    if (current.words.empty()) current.source = {path, reader.lines_read()};
    current.words.push_back(xio::strip(f[0].substr(colon + 1)));
    current.tags.push_back(xio::check_label(xio::strip(f[1]), "panx", at));
  }
  if (!current.words.empty()) sentences.push_back(std::move(current));
  return sentences;
}

std::vector<TaggedSentence> read_conllu(const std::string& path, const std::string& lang) {
  data::LineReader reader(path, xtreme_reader_options());
  std::vector<TaggedSentence> sentences;
  std::vector<xio::UdWord> words;
  std::vector<xio::UdRange> ranges;
  int64_t first_line = 0;
  const auto& upos_set = task_labels("udpos");
  auto flush = [&] {
    if (!words.empty()) {
      TaggedSentence s;
      for (auto& w : xio::fuse_multiword_tokens(words, ranges, lang)) {
        s.words.push_back(xio::clean_ud_form(w.form));
        s.tags.push_back(std::move(w.upos));
      }
      const bool all_blank = std::all_of(s.words.begin(), s.words.end(),
                                         [](const std::string& w) { return w == "_"; });
      s.source = {path, first_line};
      if (!all_blank) sentences.push_back(std::move(s));
    }
    words.clear();
    ranges.clear();
  };
  std::string line;
  while (reader.next(line)) {
    if (line.empty()) {
      flush();
      continue;
    }
    if (line[0] == '#') continue;
    const std::string at = xio::where(path, reader.lines_read());
    const auto f = xio::split_tabs(line);
    XLME_CHECK(f.size() == 10, "{}: a CoNLL-U word line has 10 TAB-separated columns, found {}", at,
               f.size());
    if (f[0].find('.') != std::string::npos) continue;  // empty node of enhanced UD
    if (words.empty() && ranges.empty()) first_line = reader.lines_read();
    try {
      const size_t dash = f[0].find('-');
      if (dash != std::string::npos) {
        ranges.push_back(
            {std::stoll(f[0].substr(0, dash)), std::stoll(f[0].substr(dash + 1)), f[1]});
        continue;
      }
      xio::UdWord w;
      w.id = std::stoll(f[0]);
      w.head = f[6] == "_" ? 0 : std::stoll(f[6]);
      w.form = f[1];
      w.upos = xio::strip(f[3]);
      XLME_CHECK(xio::contains(upos_set, w.upos) && w.upos != "O",
                 "{}: UPOS '{}' is not one of the 17 UD tags [{}]", at, w.upos,
                 xio::join(std::vector<std::string>(upos_set.begin() + 1, upos_set.end())));
      words.push_back(std::move(w));
    } catch (const std::logic_error&) {
      XLME_FAIL("{}: ID '{}' or HEAD '{}' is not a number", at, f[0], f[6]);
    }
  }
  flush();
  return sentences;
}

namespace {

// The `.conllu` files of `lang` and `split` under `ud_dir`, sorted by file name; maybe none.
std::vector<std::string> find_ud_files(const std::string& ud_dir, const std::string& lang,
                                       const std::string& split) {
  XLME_CHECK(fs::is_directory(ud_dir),
             "UD folder '{}' does not exist; unpack "
             "ud-treebanks-v2.5.tgz there",
             ud_dir);
  std::vector<std::pair<std::string, std::string>> found;  // (file name, path)
  for (const auto& entry : fs::recursive_directory_iterator(ud_dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && entry.path().extension() == ".conllu" &&
        name.rfind(lang + "_", 0) == 0 && name.find(split) != std::string::npos) {
      found.emplace_back(name, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

}  // namespace

std::vector<std::string> ud_conllu_files(const std::string& ud_dir, const std::string& lang,
                                         const std::string& split) {
  auto paths = find_ud_files(ud_dir, lang, split);
  XLME_CHECK(!paths.empty(),
             "udpos {} split for language '{}': no '{}_*{}*.conllu' file under "
             "'{}'",
             split, lang, lang, split, ud_dir);
  return paths;
}

// ---- QA ----------------------------------------------------------------------------------------

namespace {

// The names XTREME's scripts and preprocessing give the SQuAD-format file of `task`, `split` and
// `lang`, relative to the download folder, most current first.
std::vector<fs::path> qa_candidates(const std::string& task, const std::string& split,
                                    const std::string& lang) {
  static const std::map<std::string, std::string> tydiqa_names = {
      {"ar", "arabic"},  {"bn", "bengali"},    {"en", "english"},
      {"fi", "finnish"}, {"id", "indonesian"}, {"ko", "korean"},
      {"ru", "russian"}, {"sw", "swahili"},    {"te", "telugu"}};
  std::vector<fs::path> candidates;
  if (task == "squad" && (split == "train" || split == "dev")) {
    candidates.push_back(fs::path("squad") / fmt::format("{}-v1.1.json", split));
  } else if (task == "xquad" && split == "test") {
    candidates.push_back(fs::path("xquad") / fmt::format("xquad.{}.json", lang));
  } else if (task == "mlqa" && (split == "dev" || split == "test")) {
    candidates.push_back(fs::path("mlqa") / "MLQA_V1" / split /
                         fmt::format("{}-context-{}-question-{}.json", split, lang, lang));
  } else if (task == "tydiqa" && split == "train") {
    const fs::path dir = fs::path("tydiqa") / "tydiqa-goldp-v1.1-train";
    candidates.push_back(dir / fmt::format("tydiqa.goldp.{}.train.json", lang));
    candidates.push_back(dir / fmt::format("tydiqa.{}.train.json", lang));
  } else if (task == "tydiqa" && (split == "test" || split == "dev")) {
    const fs::path dir = fs::path("tydiqa") / "tydiqa-goldp-v1.1-dev";
    candidates.push_back(dir / fmt::format("tydiqa.goldp.{}.dev.json", lang));
    candidates.push_back(dir / fmt::format("tydiqa.{}.dev.json", lang));
    const auto it = tydiqa_names.find(lang);
    if (it != tydiqa_names.end())
      candidates.push_back(dir / fmt::format("tydiqa-goldp-dev-{}.json", it->second));
  } else {
    XLME_FAIL(
        "QA task '{}' has no '{}' split; the QA files are squad train/dev, xquad test, mlqa "
        "dev/test, tydiqa train/test",
        task, split);
  }
  return candidates;
}

// The first of `relative` that exists under `root`; throws listing every path tried.
std::string first_qa_file(const std::string& root, const std::vector<fs::path>& relative,
                          const std::string& task, const std::string& split,
                          const std::string& lang, const std::string& remedy) {
  std::vector<std::string> tried;
  for (const auto& r : relative) {
    const std::string path = path_under(root, r.string());
    if (fs::is_regular_file(path)) return path;
    tried.push_back("'" + path + "'");
  }
  XLME_FAIL(
      "{} {} split for language '{}': {} not found; {} or drop '{}' from the task's languages",
      task, split, lang, xio::join(tried, " or "), remedy, lang);
}

}  // namespace

std::string qa_file(const std::string& download_dir, const std::string& task,
                    const std::string& split, const std::string& lang) {
  return first_qa_file(download_dir, qa_candidates(task, split, lang), task, split, lang,
                       "run XTREME's download_data.sh");
}

std::string qa_gold_file(const std::string& gold_dir, const std::string& task,
                         const std::string& split, const std::string& lang) {
  std::vector<fs::path> names;
  for (const auto& c : qa_candidates(task, split, lang)) names.push_back(c.filename());
  return first_qa_file(gold_dir, names, task, split, lang,
                       "put the file with its answers into finetune.gold_dir");
}

QaData read_squad_json(const std::string& path, bool skip_mismatched) {
  xio::require_file(path, "SQuAD-format QA data");
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const size_t at = std::min<size_t>(e.byte, text.size());
    const int64_t line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(at), '\n');
    XLME_FAIL("{}: invalid JSON: {}", xio::where(path, line), e.what());
  }
  using T = nlohmann::json::value_t;
  XLME_CHECK(root.is_object(), "{}: the top level is not a JSON object with a 'data' list", path);
  QaData out;
  const auto& data = xio::field(root, "data", T::array, path, "<root>");
  for (size_t d = 0; d < data.size(); ++d) {
    const std::string at_d = fmt::format("data[{}]", d);
    const auto& paragraphs = xio::field(data[d], "paragraphs", T::array, path, at_d);
    for (size_t p = 0; p < paragraphs.size(); ++p) {
      const std::string at_p = fmt::format("{}.paragraphs[{}]", at_d, p);
      const auto& context = xio::field(paragraphs[p], "context", T::string, path, at_p);
      const auto& qas = xio::field(paragraphs[p], "qas", T::array, path, at_p);
      for (size_t q = 0; q < qas.size(); ++q) {
        const std::string at_q = fmt::format("{}.qas[{}]", at_p, q);
        QaExample ex;
        ex.id = xio::field(qas[q], "id", T::string, path, at_q).get<std::string>();
        ex.question = xio::field(qas[q], "question", T::string, path, at_q).get<std::string>();
        ex.context = context.get<std::string>();
        ex.source = {path, 0};
        bool mismatch = false;
        const auto& answers = xio::field(qas[q], "answers", T::array, path, at_q);
        for (size_t a = 0; a < answers.size(); ++a) {
          const std::string at_a = fmt::format("{}.answers[{}]", at_q, a);
          QaAnswer ans;
          ans.text = xio::field(answers[a], "text", T::string, path, at_a).get<std::string>();
          const int64_t cp =
              xio::field(answers[a], "answer_start", T::number_integer, path, at_a).get<int64_t>();
          ans.start = xio::byte_offset_of_code_point(ex.context, cp);
          if (ans.start < 0 ||
              ex.context.compare(static_cast<size_t>(ans.start), ans.text.size(), ans.text) != 0) {
            mismatch = true;
            ans.start = -1;
          }
          ex.answers.push_back(std::move(ans));
        }
        if (mismatch && skip_mismatched) {
          ++out.skipped;
          continue;
        }
        out.examples.push_back(std::move(ex));
      }
    }
  }
  if (out.skipped > 0) {
    spdlog::warn(
        "{}: skipped {} question(s) whose answer text does not match the context at "
        "answer_start",
        path, out.skipped);
  }
  return out;
}

// ---- Retrieval ---------------------------------------------------------------------------------

const std::string& tatoeba_iso3(const std::string& lang) {
  static const std::map<std::string, std::string> codes = {
      {"af", "afr"},
      {"ar", "ara"},
      {"bg", "bul"},
      {"bn", "ben"},
      {"de", "deu"},
      {"el", "ell"},
      {"es", "spa"},
      {"et", "est"},
      {"eu", "eus"},
      {"fa", "pes"},
      {"fi", "fin"},
      {"fr", "fra"},
      {"he", "heb"},
      {"hi", "hin"},
      {"hu", "hun"},
      {"id", "ind"},
      {"it", "ita"},
      {"ja", "jpn"},
      {"jv", "jav"},
      {"ka", "kat"},
      {"kk", "kaz"},
      {"ko", "kor"},
      {"ml", "mal"},
      {"mr", "mar"},
      {"nl", "nld"},
      {"pt", "por"},
      {"ru", "rus"},
      {"sw", "swh"},
      {"ta", "tam"},
      {"te", "tel"},
      {"th", "tha"},
      {"tl", "tgl"},
      {"tr", "tur"},
      {"ur", "urd"},
      {"vi", "vie"},
      {"zh", "cmn"},
      // XTREME-R's additions (utils_preprocess.py's tatoeba_preprocess).
      {"az", "aze"},
      {"lt", "lit"},
      {"pl", "pol"},
      {"ro", "ron"},
      {"uk", "ukr"}};
  const auto it = codes.find(lang);
  XLME_CHECK(it != codes.end(),
             "'{}' is not a Tatoeba language of XTREME; they are: {} and XTREME-R's az lt pl ro uk",
             lang, xio::join(task_languages("tatoeba")));
  return it->second;
}

SentencePairs read_line_pairs(const std::string& source_path, const std::string& target_path,
                              const std::string& source_language,
                              const std::string& target_language, bool aligned) {
  const std::string what = fmt::format("{}-{} sentences", source_language, target_language);
  xio::require_file(source_path, what);
  xio::require_file(target_path, what);
  SentencePairs pairs;
  pairs.source_language = source_language;
  pairs.target_language = target_language;
  pairs.source = xio::read_lines(source_path);
  pairs.target = xio::read_lines(target_path);
  pairs.aligned = aligned;
  XLME_CHECK(pairs.source.size() == pairs.target.size(),
             "'{}' has {} lines but '{}' has {}; the "
             "two sides must be line-aligned",
             source_path, pairs.source.size(), target_path, pairs.target.size());
  return pairs;
}

SentencePairs read_tatoeba_laser(const std::string& dir, const std::string& lang) {
  const std::string code = tatoeba_iso3(lang);
  const std::string base = fmt::format("tatoeba.{}-eng", code);
  return read_line_pairs(path_under(dir, base + "." + code), path_under(dir, base + ".eng"), lang,
                         "en", true);
}

SentencePairs read_tatoeba_xtreme(const std::string& download_dir, const std::string& lang) {
  tatoeba_iso3(lang);  // validates the language
  const std::string base = fmt::format("tatoeba/{}-en", lang);
  return read_line_pairs(path_under(download_dir, base + "." + lang),
                         path_under(download_dir, base + ".en"), lang, "en", false);
}

std::vector<int64_t> tatoeba_sorted_order(const std::vector<std::string>& english) {
  std::vector<std::string> stripped;
  for (const auto& s : english) stripped.push_back(xio::strip(s));
  std::vector<int64_t> order(english.size());
  std::iota(order.begin(), order.end(), 0);
  // Byte order of UTF-8 is code point order, as Python compares str.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return stripped[a] < stripped[b]; });
  return order;
}

BuccCorpus read_bucc(const std::string& download_dir, const std::string& lang,
                     const std::string& split, bool require_gold) {
  XLME_CHECK(xio::contains(task_languages("bucc"), lang),
             "'{}' is not a BUCC language; they are: "
             "{}",
             lang, xio::join(task_languages("bucc")));
  const std::string base = path_under(download_dir, fmt::format("bucc2018/{}-en.{}", lang, split));
  BuccCorpus corpus;
  corpus.language = lang;
  auto read_side = [&](const std::string& ext,
                       std::vector<std::pair<std::string, std::string>>& out,
                       std::unordered_set<std::string>& ids) {
    const std::string path = base + "." + ext;
    xio::require_file(path, fmt::format("bucc {} split for language '{}'", split, lang));
    data::LineReader reader(path, xtreme_reader_options());
    for (std::string line; reader.next(line);) {
      if (line.empty()) continue;
      const std::string at = xio::where(path, reader.lines_read());
      const size_t tab = line.find('\t');
      XLME_CHECK(tab != std::string::npos, "{}: expected 'ID TAB sentence'", at);
      std::string id = line.substr(0, tab);
      XLME_CHECK(ids.insert(id).second, "{}: id '{}' occurs twice", at, id);
      out.emplace_back(std::move(id), line.substr(tab + 1));
    }
  };
  std::unordered_set<std::string> source_ids, english_ids;
  read_side(lang, corpus.source, source_ids);
  read_side("en", corpus.english, english_ids);
  const std::string gold_path = base + ".gold";
  if (!fs::is_regular_file(gold_path)) {
    XLME_CHECK(!require_gold,
               "bucc {} gold for language '{}': '{}' does not exist (XTREME deletes "
               "the test gold; take it from the BUCC 2018 training-gold archive)",
               split, lang, gold_path);
    return corpus;
  }
  data::LineReader reader(gold_path, xtreme_reader_options());
  for (std::string line; reader.next(line);) {
    if (line.empty()) continue;
    const std::string at = xio::where(gold_path, reader.lines_read());
    const auto f = xio::split_tabs(line);
    XLME_CHECK(f.size() == 2, "{}: expected 'srcID TAB enID', found {} fields", at, f.size());
    XLME_CHECK(source_ids.count(f[0]) && english_ids.count(f[1]),
               "{}: gold pair ({}, {}) names "
               "an id that is not in the {} corpus; do the gold and the sentence files belong to "
               "the same split?",
               at, f[0], f[1], split);
    corpus.gold.emplace_back(f[0], f[1]);
  }
  return corpus;
}

// ---- Word alignment ----------------------------------------------------------------------------

void parse_pharaoh_line(const std::string& line, bool one_based, const std::string& where,
                        std::vector<Link>& sure, std::vector<Link>& possible) {
  const size_t tab = line.find('\t');
  for (const auto& item :
       xio::split_spaces(tab == std::string::npos ? line : line.substr(tab + 1))) {
    const size_t sep = item.find_first_of("-p?");
    bool ok = sep != std::string::npos && sep > 0 && sep + 1 < item.size();
    int64_t i = 0, j = 0;
    if (ok) {
      const std::string a = item.substr(0, sep), b = item.substr(sep + 1);
      ok = std::all_of(a.begin(), a.end(), ::isdigit) && std::all_of(b.begin(), b.end(), ::isdigit);
      if (ok) {
        i = std::stoll(a) - (one_based ? 1 : 0);
        j = std::stoll(b) - (one_based ? 1 : 0);
        ok = i >= 0 && j >= 0;
      }
    }
    XLME_CHECK(ok,
               "{}: bad alignment link '{}'; expected 'i-j' (sure) or 'ipj' / 'i?j' "
               "(possible) with {}-based word indices",
               where, item, one_based ? 1 : 0);
    (item[sep] == '-' ? sure : possible).push_back({i, j});
  }
}

std::vector<AlignedPair> read_aligned_pairs(const std::string& source_path,
                                            const std::string& target_path,
                                            const std::string& gold_path, bool one_based) {
  xio::require_file(source_path, "word-alignment source sentences");
  xio::require_file(target_path, "word-alignment target sentences");
  xio::require_file(gold_path, "word-alignment gold");
  const auto src = xio::read_lines(source_path), tgt = xio::read_lines(target_path),
             gold = xio::read_lines(gold_path);
  XLME_CHECK(src.size() == tgt.size() && src.size() == gold.size(),
             "word alignment: '{}' has {} "
             "lines, '{}' {} and '{}' {}; the three files must be line-aligned",
             source_path, src.size(), target_path, tgt.size(), gold_path, gold.size());
  std::vector<AlignedPair> pairs(src.size());
  for (size_t k = 0; k < src.size(); ++k) {
    auto& p = pairs[k];
    p.source_words = xio::split_spaces(src[k]);
    p.target_words = xio::split_spaces(tgt[k]);
    const std::string at = xio::where(gold_path, static_cast<int64_t>(k) + 1);
    parse_pharaoh_line(gold[k], one_based, at, p.sure, p.possible);
    for (const auto* links : {&p.sure, &p.possible}) {
      for (const Link& l : *links) {
        XLME_CHECK(l.source < static_cast<int64_t>(p.source_words.size()) &&
                       l.target < static_cast<int64_t>(p.target_words.size()),
                   "{}: link {}-{} is past the sentence pair ({} source, {} target words); are "
                   "the indices {}-based?",
                   at, l.source, l.target, p.source_words.size(), p.target_words.size(),
                   one_based ? 1 : 0);
      }
    }
  }
  return pairs;
}

// ---- XTREME's processed layout from the downloads -----------------------------------------------

void write_tagged_tsv(const std::string& path, const std::vector<TaggedSentence>& sentences,
                      bool with_tags) {
  std::string content;
  for (size_t s = 0; s < sentences.size(); ++s) {
    if (s > 0) content += "\n";
    const auto& sentence = sentences[s];
    for (size_t w = 0; w < sentence.words.size(); ++w) {
      content += sentence.words[w];
      if (with_tags) content += "\t" + sentence.tags.at(w);
      content += "\n";
    }
  }
  write_file_atomic(path, content);
}

std::vector<PreparedFile> prepare_udpos(const std::string& ud_dir, const std::string& out_dir,
                                        const std::vector<std::string>& languages) {
  std::vector<PreparedFile> written;
  for (const auto& lang : languages.empty() ? task_languages("udpos") : languages) {
    for (const std::string split : {"train", "dev", "test"}) {
      std::vector<TaggedSentence> sentences;
      for (const auto& file : find_ud_files(ud_dir, lang, split)) {
        auto part = read_conllu(file, lang);
        sentences.insert(sentences.end(), std::make_move_iterator(part.begin()),
                         std::make_move_iterator(part.end()));
      }
      if (sentences.empty()) continue;
      const auto path = path_under(out_dir, fmt::format("udpos/{}-{}.tsv", split, lang));
      write_tagged_tsv(path, sentences, split != "test");
      written.push_back({path, static_cast<int64_t>(sentences.size())});
    }
  }
  XLME_CHECK(!written.empty(),
             "'{}' holds no '<lang>_*-ud-{{train,dev,test}}.conllu' file of the languages {}; is "
             "it an unpacked UD release (ud-treebanks-v2.5)?",
             ud_dir, xio::join(languages.empty() ? task_languages("udpos") : languages));
  return written;
}

std::vector<PreparedFile> prepare_panx(const std::string& panx_dir, const std::string& out_dir,
                                       const std::vector<std::string>& languages) {
  XLME_CHECK(fs::is_directory(panx_dir),
             "PAN-X folder '{}' does not exist; unpack each <lang>.tar.gz of AmazonPhotos.zip "
             "into <folder>/<lang>/",
             panx_dir);
  std::vector<PreparedFile> written;
  for (const auto& lang : languages.empty() ? task_languages("panx") : languages) {
    for (const std::string split : {"train", "dev", "test"}) {
      const auto raw = path_under(panx_dir, lang + "/" + split);
      if (!fs::is_regular_file(raw)) continue;
      const auto sentences = read_panx_raw(raw);
      const auto path = path_under(out_dir, fmt::format("panx/{}-{}.tsv", split, lang));
      write_tagged_tsv(path, sentences, split != "test");
      written.push_back({path, static_cast<int64_t>(sentences.size())});
    }
  }
  XLME_CHECK(!written.empty(),
             "'{}' holds no <lang>/{{train,dev,test}} file of the languages {}; unpack each "
             "<lang>.tar.gz of AmazonPhotos.zip into <folder>/<lang>/",
             panx_dir, xio::join(languages.empty() ? task_languages("panx") : languages));
  return written;
}

// ---- Submission layout -------------------------------------------------------------------------

std::string prediction_path(const std::string& dir, const std::string& task,
                            const std::string& lang) {
  const bool qa = task == "xquad" || task == "mlqa" || task == "tydiqa";
  return path_under(dir, fmt::format("{}/test-{}.{}", task, lang, qa ? "json" : "tsv"));
}

void write_label_predictions(const std::string& path, const std::vector<std::string>& labels) {
  xio::write_lines_atomic(path, labels);
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
  write_file_atomic(path, nlohmann::json(answers).dump() + "\n");
}

void write_index_predictions(const std::string& path, const std::vector<int64_t>& indices) {
  std::vector<std::string> lines;
  for (const int64_t i : indices) lines.push_back(std::to_string(i));
  xio::write_lines_atomic(path, lines);
}

void write_pair_predictions(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<std::string> lines;
  for (const auto& [a, b] : pairs) lines.push_back(a + "\t" + b);
  xio::write_lines_atomic(path, lines);
}

}  // namespace xlme::finetune
