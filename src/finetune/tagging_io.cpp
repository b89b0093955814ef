#include "xlme/finetune/tagging_io.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/task_registry.h"
#include "xlme/data/line_reader.h"
#include "xlme/finetune/text.h"
#include "xlme/finetune/xtreme_io.h"
#include "xtreme_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <unordered_map>

namespace xlme::finetune {

namespace fs = std::filesystem;

namespace {
namespace ud {

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
  std::string s = text::strip_ascii(form), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xE2\x80\x8C") == 0) {
      i += 2;
    } else if (s[i] != ' ') {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace ud
}  // namespace

// ---- Tagging -----------------------------------------------------------------------------------

std::string tagging_file(const std::string& download_dir, const std::string& task,
                         const std::string& split, const std::string& lang) {
  const std::string path = path_under(download_dir, fmt::format("{}/{}-{}.tsv", task, split, lang));
  XLME_CHECK(fs::is_regular_file(path), "{} {} split for language '{}': '{}' does not exist; {}",
             task, split, lang, path, io::data_remedy(task, download_dir));
  return path;
}

std::vector<TaggedSentence> read_conll_tsv(const std::string& path, const std::string& task) {
  if (!task.empty()) task_labels(task);
  io::Lines reader(path);
  std::vector<TaggedSentence> sentences;
  TaggedSentence current;
  int tagged = -1;  // unknown until the first word line: 1 word+tag, 0 word only
  auto flush = [&] {
    if (!current.words.empty()) sentences.push_back(std::move(current));
    current = TaggedSentence();
  };
  std::string line;
  while (reader.next(line)) {
    if (text::strip_ascii(line).empty()) {
      flush();
      continue;
    }
    const std::string at = io::where(path, reader.lines_read());
    auto f = text::split_tabs(line);
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
      const std::string tag = text::strip_ascii(f[1]);
      current.tags.push_back(task.empty() ? tag : io::check_label(tag, task, at));
    }
  }
  flush();
  io::require_content(!sentences.empty(), path, "sentence ('word TAB tag' lines)");
  return sentences;
}

std::vector<TaggedSentence> read_panx_raw(const std::string& path) {
  io::Lines reader(path);
  std::vector<TaggedSentence> sentences;
  TaggedSentence current;
  std::string line;
  while (reader.next(line)) {
    const auto f = text::split_tabs(text::strip_ascii(line));
    if (f.size() != 2) {
      if (!current.words.empty()) sentences.push_back(std::move(current));
      current = TaggedSentence();
      continue;
    }
    const std::string at = io::where(path, reader.lines_read());
    const size_t colon = f[0].find(':');
    XLME_CHECK(colon != std::string::npos,
               "{}: token '{}' has no 'lang:' prefix; raw PAN-X lines "
               "read 'en:token TAB tag' (use read_conll_tsv for XTREME's processed files)",
               at, f[0]);
    if (current.words.empty()) current.source = {path, reader.lines_read()};
    current.words.push_back(text::strip_ascii(f[0].substr(colon + 1)));
    current.tags.push_back(io::check_label(text::strip_ascii(f[1]), "panx", at));
  }
  if (!current.words.empty()) sentences.push_back(std::move(current));
  io::require_content(!sentences.empty(), path, "raw PAN-X line ('lang:token TAB tag')");
  return sentences;
}

std::vector<TaggedSentence> read_conllu(const std::string& path, const std::string& lang) {
  io::Lines reader(path);
  std::vector<TaggedSentence> sentences;
  std::vector<ud::UdWord> words;
  std::vector<ud::UdRange> ranges;
  int64_t first_line = 0, word_lines = 0;
  const auto& upos_set = task_labels("udpos");
  auto flush = [&] {
    if (!words.empty()) {
      TaggedSentence s;
      for (auto& w : ud::fuse_multiword_tokens(words, ranges, lang)) {
        s.words.push_back(ud::clean_ud_form(w.form));
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
    const std::string at = io::where(path, reader.lines_read());
    const auto f = text::split_tabs(line);
    XLME_CHECK(f.size() == 10, "{}: a CoNLL-U word line has 10 TAB-separated columns, found {}", at,
               f.size());
    ++word_lines;
    if (f[0].find('.') != std::string::npos) continue;  // empty node of enhanced UD
    if (words.empty() && ranges.empty()) first_line = reader.lines_read();
    try {
      const size_t dash = f[0].find('-');
      if (dash != std::string::npos) {
        ranges.push_back(
            {std::stoll(f[0].substr(0, dash)), std::stoll(f[0].substr(dash + 1)), f[1]});
        continue;
      }
      ud::UdWord w;
      w.id = std::stoll(f[0]);
      w.head = f[6] == "_" ? 0 : std::stoll(f[6]);
      w.form = f[1];
      w.upos = text::strip_ascii(f[3]);
      XLME_CHECK(io::contains(upos_set, w.upos) && w.upos != "O",
                 "{}: UPOS '{}' is not one of the 17 UD tags [{}]", at, w.upos,
                 io::join(std::vector<std::string>(upos_set.begin() + 1, upos_set.end())));
      words.push_back(std::move(w));
    } catch (const std::logic_error&) {
      XLME_FAIL("{}: ID '{}' or HEAD '{}' is not a number", at, f[0], f[6]);
    }
  }
  flush();
  // Sentences whose forms are all '_' are dropped (UD_English-ESL has no text): only a file
  // without any word line is refused.
  io::require_content(word_lines > 0 || !sentences.empty(), path, "CoNLL-U word line");
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
             "udpos {} split for language '{}': no '{}_*{}*.conllu' file under '{}'; {}", split,
             lang, lang, split, ud_dir, io::gold_remedy(TaskGold::kUdRelease));
  return paths;
}

std::vector<std::string> tagging_gold_files(const std::string& gold_dir, const std::string& task,
                                            const std::string& lang) {
  switch (task_info(task).gold) {
    case TaskGold::kPanxRaw: {
      const std::string path = path_under(gold_dir, lang + "/test");
      XLME_CHECK(fs::is_regular_file(path),
                 "panx test gold for language '{}': '{}' does not exist; unpack {}.tar.gz of "
                 "WikiAnn (AmazonPhotos.zip) into finetune.gold_dir",
                 lang, path, lang);
      return {path};
    }
    case TaskGold::kUdRelease:
      return ud_conllu_files(gold_dir, lang, "test");
    default:
      XLME_FAIL("task '{}' is not a tagging task with upstream gold (udpos, panx)", task);
  }
}

std::vector<TaggedSentence> read_tagging_gold(const std::string& gold_dir, const std::string& task,
                                              const std::string& lang) {
  const bool panx = task_info(task).gold == TaskGold::kPanxRaw;
  std::vector<TaggedSentence> sentences;
  for (const auto& file : tagging_gold_files(gold_dir, task, lang)) {
    auto part = panx ? read_panx_raw(file) : read_conllu(file, lang);
    sentences.insert(sentences.end(), std::make_move_iterator(part.begin()),
                     std::make_move_iterator(part.end()));
  }
  return sentences;
}

std::string check_ud_release(const std::string& gold_dir, const std::string& dev_file,
                             const std::string& lang) {
  const auto gold_dev = find_ud_files(gold_dir, lang, "dev");
  if (dev_file.empty() || gold_dev.empty()) {
    return fmt::format(
        "; the tags' release not checked: {} has no dev set of {} to compare (UD has none for "
        "some languages)",
        dev_file.empty() ? "finetune.data_dir" : "the gold folder", lang);
  }
  auto tagged = [](const std::vector<TaggedSentence>& sentences) {
    std::vector<ExampleKey> out;
    for (const auto& s : sentences) {
      ExampleKey key{s.source, {}};
      for (size_t w = 0; w < s.words.size(); ++w) {
        key.fields.push_back(text::strip_ascii(s.words[w]) + "/" +
                             (w < s.tags.size() ? s.tags[w] : std::string()));
      }
      out.push_back(std::move(key));
    }
    return out;
  };
  std::vector<TaggedSentence> release;
  for (const auto& file : gold_dev) {
    auto part = read_conllu(file, lang);
    release.insert(release.end(), std::make_move_iterator(part.begin()),
                   std::make_move_iterator(part.end()));
  }
  std::vector<std::string> quoted;
  for (const auto& file : gold_dev) quoted.push_back("'" + file + "'");
  const auto gold_files = io::join(quoted, ", ");
  check_test_matches_gold(
      fmt::format("udpos test set of {}: the gold's release, checked on its dev set", lang),
      tagged(read_conll_tsv(dev_file, "udpos")), dev_file, tagged(release), gold_files, "sentence",
      {"word/tag"}, {}, "dev file");
  return fmt::format("; the gold's release checked: its dev set {} (words and tags) is '{}'",
                     gold_files, dev_file);
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
             ud_dir, io::join(languages.empty() ? task_languages("udpos") : languages));
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
             panx_dir, io::join(languages.empty() ? task_languages("panx") : languages));
  return written;
}

std::vector<PreparedFile> prepare_tagging(const std::string& task, const std::string& input_dir,
                                          const std::string& out_dir,
                                          const std::vector<std::string>& languages) {
  switch (task_info(task).gold) {
    case TaskGold::kUdRelease:
      return prepare_udpos(input_dir, out_dir, languages);
    case TaskGold::kPanxRaw:
      return prepare_panx(input_dir, out_dir, languages);
    default:
      XLME_FAIL("'{}' is not a tagging task; XTREME's processed layout is written for: {}", task,
                io::join(task_names(TaskFamily::kTagging)));
  }
}

}  // namespace xlme::finetune
