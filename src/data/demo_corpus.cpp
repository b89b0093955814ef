#include "xlme/data/demo_corpus.h"

#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/data/line_reader.h"
#include "xlme/data/mo_file.h"
#include "xlme/data/text.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_set>

namespace xlme::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPlaceholder = "{}";
constexpr int64_t kMinWords = 3;

bool is_alpha(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0;
}
bool is_alnum(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0;
}
bool is_digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

// Pango, GTK and HTML tags that carry no text of their own.
bool is_markup_tag(const std::string& name) {
  static const std::set<std::string> kTags = {
      "a",      "b",           "big",       "br",          "code",    "emphasis", "em",
      "i",      "kbd",         "li",        "link",        "literal", "markup",   "p",
      "s",      "small",       "span",      "strong",      "sub",     "sup",      "tt",
      "u",      "ul",          "ol",        "quote",       "var",     "filename", "command",
      "option", "replaceable", "userinput", "application", "guimenu", "guilabel"};
  return kTags.count(name) > 0;
}

std::string strip_markup(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') {
      const size_t close = s.find('>', i);
      size_t name_begin = i + 1 + (i + 1 < s.size() && s[i + 1] == '/');
      size_t name_end = name_begin;
      while (name_end < s.size() && is_alpha(s[name_end])) ++name_end;
      if (close != std::string::npos && name_end > name_begin && s.find('<', i + 1) >= close &&
          is_markup_tag(s.substr(name_begin, name_end - name_begin)) &&
          (s[name_end] == '>' || s[name_end] == ' ' || s[name_end] == '/')) {
        i = close;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

// "&name;" or "&#123;" at i: the entity's length, 0 when there is none.
size_t entity_length(const std::string& s, size_t i) {
  size_t j = i + 1;
  if (j < s.size() && s[j] == '#') ++j;
  const size_t start = j;
  while (j < s.size() && is_alnum(s[j]) && j - start < 8) ++j;
  return j > start && j < s.size() && s[j] == ';' ? j - i + 1 : 0;
}

std::string decode_entities(const std::string& s) {
  static const std::map<std::string, std::string> kEntities = {{"&amp;", "&"},  {"&lt;", "<"},
                                                               {"&gt;", ">"},   {"&quot;", "\""},
                                                               {"&apos;", "'"}, {"&nbsp;", " "}};
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '&') {
      if (const size_t n = entity_length(s, i); n > 0) {
        const auto it = kEntities.find(s.substr(i, n));
        if (it != kEntities.end()) {
          out += it->second;
          i += n - 1;
          continue;
        }
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

// Accelerators: "(_S)" / "(&S)" after a CJK label go entirely; otherwise a lone '_' or '&'
// (exactly one in the message, not an entity) before a letter is removed. Several underscores
// mean identifiers (LC_ALL, file_name), which stay.
std::string strip_accelerators(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(' && i + 3 < s.size() && (s[i + 1] == '_' || s[i + 1] == '&') &&
        is_alnum(s[i + 2]) && s[i + 3] == ')') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      i += 3;
      continue;
    }
    out.push_back(s[i]);
  }
  for (const char marker : {'_', '&'}) {
    const size_t first = out.find(marker);
    if (first == std::string::npos || out.find(marker, first + 1) != std::string::npos) continue;
    if (first + 1 >= out.size()) continue;
    const auto next = static_cast<unsigned char>(out[first + 1]);
    const bool letter = is_alpha(out[first + 1]) || next >= 0x80;
    if (letter && (marker == '_' || entity_length(out, first) == 0)) out.erase(first, 1);
  }
  return out;
}

// printf (%s, %-5.2f, %1$d, %lld, %'d; not the space flag, so "100% sure" stays), Python
// (%(name)s), gettext's %<PRIu64> and brace
// ({0}, {name}, {}) directives become kPlaceholder; "%%" becomes "%".
std::string replace_directives(const std::string& s) {
  static const std::string kConversions = "diouxXeEfFgGaAcspnmCS@";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 1 < s.size()) {
      if (s[i + 1] == '%') {
        out.push_back('%');
        ++i;
        continue;
      }
      size_t j = i + 1;
      if (s[j] == '(') {
        const size_t close = s.find(')', j);
        if (close == std::string::npos || close - j > 32) {
          out.push_back(s[i]);
          continue;
        }
        j = close + 1;
      } else {
        size_t k = j;
        while (k < s.size() && is_digit(s[k])) ++k;
        if (k > j && k < s.size() && s[k] == '$') j = k + 1;  // %1$d
      }
      while (j < s.size() && std::string("-+#0'I").find(s[j]) != std::string::npos) ++j;
      while (j < s.size() && (is_digit(s[j]) || s[j] == '*')) ++j;
      if (j < s.size() && s[j] == '.') {
        ++j;
        while (j < s.size() && (is_digit(s[j]) || s[j] == '*')) ++j;
      }
      while (j < s.size() && std::string("hlLqjzZt").find(s[j]) != std::string::npos) ++j;
      if (j < s.size() && s[j] == '<') {  // %<PRIu64>
        const size_t close = s.find('>', j);
        if (close != std::string::npos && s.compare(j + 1, 3, "PRI") == 0) {
          out += kPlaceholder;
          i = close;
          continue;
        }
      }
      if (j < s.size() && kConversions.find(s[j]) != std::string::npos) {
        out += kPlaceholder;
        i = j;
        continue;
      }
    } else if (s[i] == '{') {
      const size_t close = s.find('}', i);
      if (close != std::string::npos && close - i <= 32) {
        const std::string inner = s.substr(i + 1, close - i - 1);
        const bool directive = std::all_of(inner.begin(), inner.end(), [](char c) {
          return is_alnum(c) || c == '_' || c == ':' || c == '.' || c == '!';
        });
        if (directive && inner.find_first_of("{") == std::string::npos) {
          out += kPlaceholder;
          i = close;
          continue;
        }
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool has_control_characters(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

std::string language_name(const std::string& dir) {
  std::string name = dir;
  std::replace(name.begin(), name.end(), '@', '_');
  return name;
}

bool is_foreign_language(const std::string& dir) {
  if (dir.empty() || dir == "C" || dir.find('.') != std::string::npos) return false;
  if (dir == "en" || dir.rfind("en_", 0) == 0 || dir.rfind("en@", 0) == 0) return false;
  if (dir.rfind("man", 0) == 0 && dir.size() > 3 && is_digit(dir[3])) return false;
  return std::all_of(dir.begin(), dir.end(),
                     [](char c) { return is_alnum(c) || c == '_' || c == '@' || c == '-'; });
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> entries;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path());
  std::sort(entries.begin(), entries.end());
  return entries;
}

// The roff escape at s[i] == '\\' removed or replaced; returns the index after it.
size_t unescape_roff(const std::string& s, size_t i, std::string& out) {
  static const std::map<std::string, std::string> kGlyphs = {
      {"em", "—"}, {"en", "–"}, {"aq", "'"},  {"dq", "\""}, {"lq", "“"}, {"rq", "”"},
      {"Fo", "«"}, {"Fc", "»"}, {"bu", "•"},  {"co", "©"},  {"mu", "×"}, {"hy", "-"},
      {"oq", "‘"}, {"cq", "’"}, {"rs", "\\"}, {"ti", "~"},  {"ha", "^"}, {"at", "@"}};
  if (i + 1 >= s.size()) return s.size();
  const char c = s[i + 1];
  // The name after \( (two characters), \[ (up to ']') or a single character.
  auto name_at = [&](size_t j, std::string& name) -> size_t {
    if (j >= s.size()) return s.size();
    if (s[j] == '(') {
      name = s.substr(j + 1, 2);
      return std::min(s.size(), j + 3);
    }
    if (s[j] == '[') {
      const size_t close = s.find(']', j);
      if (close == std::string::npos) return s.size();
      name = s.substr(j + 1, close - j - 1);
      return close + 1;
    }
    name = s.substr(j, 1);
    return j + 1;
  };
  std::string name;
  switch (c) {
    case '(':
    case '[': {
      const size_t next = name_at(i + 1, name);
      const auto it = kGlyphs.find(name);
      if (it != kGlyphs.end()) out += it->second;
      return next;
    }
    case 'f':
    case '*':
    case 'n':
    case 'F':
    case 'm':
    case 'g':
    case 'k':
      return name_at(i + 2, name);
    case 's': {
      size_t j = i + 2;
      if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
      while (j < s.size() && is_digit(s[j])) ++j;
      return j;
    }
    case '-':
      out.push_back('-');
      return i + 2;
    case 'e':
    case '\\':
      out.push_back('\\');
      return i + 2;
    case ' ':
    case '~':
    case '0':
      out.push_back(' ');
      return i + 2;
    case '"':
      return s.size();  // a comment to the end of the line
    case 'X':
    case 'h':
    case 'v':
    case 'w':
    case 'o':
    case 'l':
    case 'L':
    case 'D':
    case 'Z':
    case 'b':
    case 'x': {  // \X'...': an argument between delimiters
      if (i + 2 >= s.size()) return s.size();
      const size_t close = s.find(s[i + 2], i + 3);
      return close == std::string::npos ? s.size() : close + 1;
    }
    default:
      return i + 2;  // \&, \c, \%, \:, \/, \,, \|, \^, \) and the rest: nothing printed
  }
}

std::string roff_text(const std::string& line) {
  std::string out;
  for (size_t i = 0; i < line.size();) {
    if (line[i] == '\\') {
      i = unescape_roff(line, i, out);
    } else {
      out.push_back(line[i++]);
    }
  }
  return out;
}

// "Foo. Bar" -> {"Foo.", "Bar"}: splits after . ! ? before a capital or non-ASCII letter, and
// after the ideographic full stop.
std::vector<std::string> split_sentences(const std::string& paragraph) {
  std::vector<std::string> sentences;
  size_t start = 0;
  for (size_t i = 0; i < paragraph.size(); ++i) {
    size_t end = std::string::npos;
    if ((paragraph[i] == '.' || paragraph[i] == '!' || paragraph[i] == '?') &&
        i + 2 < paragraph.size() && paragraph[i + 1] == ' ' &&
        (std::isupper(static_cast<unsigned char>(paragraph[i + 2])) ||
         static_cast<unsigned char>(paragraph[i + 2]) >= 0x80)) {
      end = i + 1;
    } else if (paragraph.compare(i, 3, "。") == 0) {
      end = i + 3;
    }
    if (end != std::string::npos) {
      sentences.push_back(collapse_whitespace(paragraph.substr(start, end - start)));
      start = end;
      i = end - 1;
    }
  }
  sentences.push_back(collapse_whitespace(paragraph.substr(start)));
  sentences.erase(std::remove(sentences.begin(), sentences.end(), std::string()), sentences.end());
  return sentences;
}

struct Pair {
  std::string en;
  std::string tr;
};

struct HeldPair {
  uint64_t hash;
  Pair pair;
  bool operator<(const HeldPair& o) const {
    return std::tie(hash, pair.en, pair.tr) < std::tie(o.hash, o.pair.en, o.pair.tr);
  }
};

// Everything gathered for one language before it is written.
struct LanguageData {
  std::vector<std::vector<std::string>> documents;  // candidate mono lines per catalog / page
  std::vector<Pair> train;
  std::vector<HeldPair> heldout[2];  // dev, test
  std::unordered_set<std::string> seen_pairs;
  std::unordered_set<std::string> heldout_targets;  // never in mono
};

void add_catalog(const std::vector<MoEntry>& entries, int64_t per_mille, LanguageData& data) {
  std::vector<std::string> document;
  auto add_pair = [&](const std::string& en_raw, const std::string& tr_raw,
                      const std::vector<std::string>& more_forms) {
    const auto en = clean_message(en_raw);
    const auto tr = clean_message(tr_raw);
    if (!en || !tr || *en == *tr || count_words(*en) < kMinWords) return;
    const int split = heldout_split(*en, per_mille);
    if (split > 0) {
      data.heldout_targets.insert(*tr);
      for (const auto& form : more_forms) {
        if (auto cleaned = clean_message(form)) data.heldout_targets.insert(*cleaned);
      }
    }
    if (!data.seen_pairs.insert(*en + '\t' + *tr).second) return;
    if (split > 0) {
      data.heldout[split - 1].push_back({hash64(*en), {*en, *tr}});
      return;
    }
    data.train.push_back({*en, *tr});
    document.push_back(*tr);
    for (const auto& form : more_forms) {
      if (auto cleaned = clean_message(form); cleaned && *cleaned != *en) {
        document.push_back(*cleaned);
      }
    }
  };
  for (const auto& entry : entries) {
    if (entry.msgstrs.empty() || entry.msgstrs[0].empty()) continue;
    if (entry.msgid_plural.empty()) {
      add_pair(entry.msgid, entry.msgstrs[0], {});
      continue;
    }
    // Plural forms: the singular pairs with form 0, msgid_plural with form 1 (the "other" form
    // of most languages); any further forms only join the monolingual text.
    add_pair(entry.msgid, entry.msgstrs[0], {});
    if (entry.msgstrs.size() > 1) {
      add_pair(entry.msgid_plural, entry.msgstrs[1],
               std::vector<std::string>(entry.msgstrs.begin() + 2, entry.msgstrs.end()));
    }
  }
  if (!document.empty()) data.documents.push_back(std::move(document));
}

std::string read_compressed(const std::string& path) {
  LineReaderOptions options;
  options.refuse_cr_line_ends = false;  // Debian's pages, not the user's: an odd one is not fatal
  LineReader reader(path, options);
  std::string text;
  for (std::string line; reader.next(line);) {
    text += line;
    text += '\n';
  }
  return text;
}

struct Outputs {
  std::string text;
  void add_line(const std::string& line) {
    text += line;
    text += '\n';
  }
};

}  // namespace

std::optional<std::string> clean_message(const std::string& text) {
  if (!valid_utf8(text)) return std::nullopt;
  std::string s = text;
  std::replace_if(
      s.begin(), s.end(), [](char c) { return c == '\n' || c == '\t' || c == '\r'; }, ' ');
  s = strip_markup(s);
  s = strip_accelerators(s);
  s = decode_entities(s);
  s = replace_directives(s);
  s = collapse_whitespace(s);
  if (s.empty() || has_control_characters(s)) return std::nullopt;
  return s;
}

int64_t count_words(const std::string& text) {
  int64_t words = 0;
  bool in_word = false;
  bool has_letter = false;
  for (size_t i = 0; i <= text.size(); ++i) {
    const bool space = i == text.size() || text[i] == ' ';
    if (space) {
      words += in_word && has_letter;
      in_word = has_letter = false;
    } else {
      in_word = true;
      has_letter = has_letter || is_alnum(text[i]) || static_cast<unsigned char>(text[i]) >= 0x80;
    }
  }
  return words;
}

int heldout_split(const std::string& english, int64_t per_mille) {
  const uint64_t bucket = hash64(english) % 1000;
  if (bucket < static_cast<uint64_t>(per_mille)) return 1;
  if (bucket < static_cast<uint64_t>(2 * per_mille)) return 2;
  return 0;
}

std::vector<std::string> man_page_sentences(const std::string& roff) {
  static const std::set<std::string> kFontMacros = {"B",  "I",  "BR", "BI", "IB",
                                                    "IR", "RB", "RI", "SM", "SB"};
  std::vector<std::string> sentences;
  std::string paragraph;
  bool skipping = false;  // inside .nf/.fi, .EX/.EE or .TS/.TE
  auto flush = [&] {
    for (auto& sentence : split_sentences(paragraph)) {
      if (count_words(sentence) >= kMinWords || sentence.size() >= 24) {
        sentences.push_back(std::move(sentence));
      }
    }
    paragraph.clear();
  };
  size_t start = 0;
  while (start < roff.size()) {
    size_t end = roff.find('\n', start);
    if (end == std::string::npos) end = roff.size();
    const std::string line = roff.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && (line[0] == '.' || line[0] == '\'')) {
      size_t name_end = 1;
      while (name_end < line.size() && line[name_end] != ' ' && line[name_end] != '\t') {
        ++name_end;
      }
      const std::string request = line.substr(1, name_end - 1);
      if (request.rfind("\\\"", 0) == 0) continue;  // a comment
      if (request == "so") return {};               // the page only includes another one
      if (request == "nf" || request == "EX" || request == "TS") {
        flush();
        skipping = true;
      } else if (request == "fi" || request == "EE" || request == "TE") {
        skipping = false;
      } else if (kFontMacros.count(request) > 0 && !skipping) {
        std::string args = line.substr(std::min(line.size(), name_end));
        args.erase(std::remove(args.begin(), args.end(), '"'), args.end());
        paragraph += ' ' + roff_text(args);
      } else {
        flush();  // .SH headings, .PP, .TP, .IP, .sp, .br and the rest end a paragraph
      }
      continue;
    }
    if (!skipping) paragraph += ' ' + roff_text(line);
  }
  flush();
  std::vector<std::string> usable;
  for (const auto& sentence : sentences) {
    if (valid_utf8(sentence) && !has_control_characters(sentence)) usable.push_back(sentence);
  }
  return usable;
}

DemoCorpusReport build_demo_corpus(const DemoCorpusOptions& options) {
  XLME_CHECK(!options.out_dir.empty(), "demo-corpus needs an output folder (--out DIR)");
  XLME_CHECK(fs::is_directory(options.locale_dir),
             "locale folder '{}' not found; install the catalog packages with "
             "scripts/prepare_demo_corpus.sh",
             options.locale_dir);
  XLME_CHECK(options.heldout_per_mille > 0 && options.heldout_per_mille < 500,
             "held-out fraction {} per mille is outside [1, 499]", options.heldout_per_mille);
  DemoCorpusReport report;
  std::map<std::string, LanguageData> languages;

  for (const auto& dir : sorted_entries(options.locale_dir)) {
    const std::string dir_name = dir.filename().string();
    if (!is_foreign_language(dir_name) || !fs::is_directory(dir / "LC_MESSAGES")) continue;
    LanguageData& data = languages[language_name(dir_name)];
    for (const auto& file : sorted_entries(dir / "LC_MESSAGES")) {
      if (file.extension() != ".mo") continue;
      std::vector<MoEntry> entries;
      try {
        entries = read_mo(file.string());
      } catch (const Error& e) {
        spdlog::warn("skipping a catalog: {}", e.what());
        ++report.bad_catalogs;
        continue;
      }
      ++report.catalogs;
      report.entries += static_cast<int64_t>(entries.size());
      add_catalog(entries, options.heldout_per_mille, data);
    }
  }
  XLME_CHECK(report.catalogs > 0,
             "no .mo catalogs under '{}/<lang>/LC_MESSAGES/'; install the catalog packages with "
             "scripts/prepare_demo_corpus.sh",
             options.locale_dir);
  spdlog::info("read {} catalogs ({} messages) in {} languages", report.catalogs, report.entries,
               languages.size());

  if (!options.man_dir.empty() && fs::is_directory(options.man_dir)) {
    for (const auto& dir : sorted_entries(options.man_dir)) {
      const std::string dir_name = dir.filename().string();
      if (!is_foreign_language(dir_name) || !fs::is_directory(dir)) continue;
      LanguageData& data = languages[language_name(dir_name)];
      for (const auto& section : sorted_entries(dir)) {
        for (const auto& page : sorted_entries(section)) {
          if (page.extension() != ".gz" || fs::is_symlink(page)) continue;
          auto sentences = man_page_sentences(read_compressed(page.string()));
          ++report.man_pages;
          if (!sentences.empty()) data.documents.push_back(std::move(sentences));
        }
      }
    }
    spdlog::info("read {} translated man pages", report.man_pages);
  }

  const fs::path out(options.out_dir);
  const char* const kSplitNames[] = {"dev", "test"};
  for (auto& [lang, data] : languages) {
    DemoLanguageCounts counts;
    counts.language = lang;
    Outputs mono;
    std::unordered_set<std::string> seen;
    for (const auto& document : data.documents) {
      int64_t lines = 0;
      for (const auto& line : document) {
        if (data.heldout_targets.count(line) > 0 || !seen.insert(line).second) continue;
        if (lines == 0 && counts.mono_documents > 0) mono.add_line("");
        mono.add_line(line);
        ++lines;
      }
      counts.mono_lines += lines;
      counts.mono_documents += lines > 0;
    }
    if (counts.mono_lines > 0) {
      write_file_atomic((out / "mono" / (lang + ".txt")).string(), mono.text);
    }
    if (!data.train.empty()) {
      Outputs en, tr;
      for (const auto& pair : data.train) {
        if (data.heldout_targets.count(pair.tr) > 0) continue;  // a held-out translation
        en.add_line(pair.en);
        tr.add_line(pair.tr);
        ++counts.train_pairs;
      }
      const std::string stem = (out / "para" / ("en-" + lang)).string();
      write_file_atomic(stem + ".en", en.text);
      write_file_atomic(stem + "." + lang, tr.text);
    }
    for (int split = 0; split < 2; ++split) {
      auto& held = data.heldout[split];
      if (held.empty()) continue;
      std::sort(held.begin(), held.end());
      held.resize(std::min<size_t>(held.size(), static_cast<size_t>(options.heldout_pairs)));
      Outputs en, tr;
      for (const auto& h : held) {
        en.add_line(h.pair.en);
        tr.add_line(h.pair.tr);
      }
      const std::string stem = (out / "heldout" / kSplitNames[split] / ("en-" + lang)).string();
      write_file_atomic(stem + ".en", en.text);
      write_file_atomic(stem + "." + lang, tr.text);
      (split == 0 ? counts.dev_pairs : counts.test_pairs) = static_cast<int64_t>(held.size());
    }
    if (counts.mono_lines > 0 || counts.train_pairs > 0) report.languages.push_back(counts);
  }

  std::string table = "language\tmono_lines\tmono_documents\ttrain_pairs\tdev_pairs\ttest_pairs\n";
  for (const auto& c : report.languages) {
    table += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\n", c.language, c.mono_lines, c.mono_documents,
                         c.train_pairs, c.dev_pairs, c.test_pairs);
  }
  write_file_atomic((out / "counts.tsv").string(), table);
  return report;
}

}  // namespace xlme::data
