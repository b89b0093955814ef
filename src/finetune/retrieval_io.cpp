#include "xlme/finetune/retrieval_io.h"

#include "xlme/common/error.h"
#include "xlme/config/task_registry.h"
#include "xlme/finetune/text.h"
#include "xlme/finetune/xtreme_io.h"
#include "xtreme_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <unordered_set>

namespace xlme::finetune {

namespace fs = std::filesystem;

namespace {

// The bytes of a retrieval sentence that are read: a model sees at most finetune.max_seq_len
// tokens of it, far fewer than this; a longer line (a damaged or concatenated file) is cut while
// it is read, so that memory never follows the length of a line.
constexpr int64_t kSentenceBytesKept = int64_t{1} << 20;

}  // namespace

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
             lang, io::join(task_languages("tatoeba")));
  return it->second;
}

SentencePairs read_line_pairs(const std::string& source_path, const std::string& target_path,
                              const std::string& source_language,
                              const std::string& target_language, bool aligned,
                              const std::string& remedy) {
  const std::string what = fmt::format("{}-{} sentences", source_language, target_language);
  io::require_file(source_path, what, remedy);
  io::require_file(target_path, what, remedy);
  SentencePairs pairs;
  pairs.source_language = source_language;
  pairs.target_language = target_language;
  pairs.source = io::read_lines(source_path, kSentenceBytesKept);
  pairs.target = io::read_lines(target_path, kSentenceBytesKept);
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
  std::string remedy = io::gold_remedy(TaskGold::kLaserTatoeba);
  if (fs::is_regular_file(path_under(dir, fmt::format("tatoeba/{}-en.{}", lang, lang)))) {
    remedy += fmt::format(
        "; '{}' is XTREME's download folder (tatoeba/{}-en.{}): that is finetune.data_dir", dir,
        lang, lang);
  }
  return read_line_pairs(path_under(dir, base + "." + code), path_under(dir, base + ".eng"), lang,
                         "en", true, remedy);
}

SentencePairs read_tatoeba_xtreme(const std::string& download_dir, const std::string& lang) {
  const std::string code = tatoeba_iso3(lang);  // validates the language
  const std::string laser = path_under(download_dir, fmt::format("tatoeba.{}-eng.{}", code, code));
  XLME_CHECK(!fs::is_regular_file(laser),
             "finetune.data_dir '{}' holds LASER's Tatoeba files ('{}'): LASER's data/tatoeba/v1 "
             "folder is the gold; set finetune.gold_dir to it (finetune.data_dir is XTREME's "
             "download folder, whose tatoeba/ copy hides the alignment)",
             download_dir, laser);
  const std::string base = fmt::format("tatoeba/{}-en", lang);
  return read_line_pairs(
      path_under(download_dir, base + "." + lang), path_under(download_dir, base + ".en"), lang,
      "en", false,
      io::data_remedy("tatoeba", download_dir) +
          "; or, to score, set finetune.gold_dir to LASER's data/tatoeba/v1 folder");
}

std::vector<int64_t> tatoeba_sorted_order(const std::vector<std::string>& english) {
  std::vector<std::string> stripped;
  for (const auto& s : english) stripped.push_back(text::strip_ascii(s));
  std::vector<int64_t> order(english.size());
  std::iota(order.begin(), order.end(), 0);
  // Byte order of UTF-8 is code point order, as Python compares str.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return stripped[a] < stripped[b]; });
  return order;
}

TatoebaTest read_tatoeba(const std::string& gold_dir, const std::string& data_dir,
                         const std::string& lang) {
  const std::string xtreme_base = path_under(data_dir, fmt::format("tatoeba/{}-en", lang));
  const std::string xtreme_xx = xtreme_base + "." + lang, xtreme_en = xtreme_base + ".en";
  TatoebaTest out;
  if (gold_dir.empty()) {
    out.pairs = read_tatoeba_xtreme(data_dir, lang);
    out.from =
        fmt::format("from XTREME's '{}' and '{}' (English sorted; no gold)", xtreme_xx, xtreme_en);
    return out;
  }
  out.pairs = read_tatoeba_laser(gold_dir, lang);
  const std::string code = tatoeba_iso3(lang);
  const std::string laser_base = path_under(gold_dir, fmt::format("tatoeba.{}-eng", code));
  const std::string laser_xx = laser_base + "." + code, laser_en = laser_base + ".eng";
  if (!fs::is_regular_file(xtreme_xx) && !fs::is_regular_file(xtreme_en)) {
    out.from = fmt::format(
        "from the gold '{}' and '{}' alone (finetune.data_dir has no XTREME copy of {} to check "
        "it against)",
        laser_xx, laser_en, lang);
    return out;
  }
  const auto xtreme = read_tatoeba_xtreme(data_dir, lang);
  // XTREME copies the xx file as it is and writes the English lines stripped, sorted.
  auto lines = [](const std::vector<std::string>& sentences, const std::string& file,
                  const std::vector<int64_t>& order, bool strip) {
    std::vector<ExampleKey> keys;
    for (size_t k = 0; k < sentences.size(); ++k) {
      const int64_t line = order.empty() ? static_cast<int64_t>(k) : order[k];
      const auto& value = sentences[static_cast<size_t>(line)];
      keys.push_back({{file, line + 1}, {strip ? text::strip_ascii(value) : value}});
    }
    return keys;
  };
  const std::string what = fmt::format("tatoeba test set of {}", lang);
  check_test_matches_gold(what, lines(xtreme.source, xtreme_xx, {}, false), xtreme_xx,
                          lines(out.pairs.source, laser_xx, {}, false), "'" + laser_xx + "'",
                          "line", {"sentence"});
  check_test_matches_gold(
      what + " (English, as XTREME sorts it)", lines(xtreme.target, xtreme_en, {}, false),
      xtreme_en, lines(out.pairs.target, laser_en, tatoeba_sorted_order(out.pairs.target), true),
      "'" + laser_en + "'", "line", {"sentence"});
  out.from =
      fmt::format("from the gold '{}' and '{}', the same as XTREME's test files '{}' and '{}'",
                  laser_xx, laser_en, xtreme_xx, xtreme_en);
  return out;
}

BuccCorpus read_bucc(const std::string& download_dir, const std::string& lang,
                     const std::string& split, bool require_gold) {
  XLME_CHECK(io::contains(task_languages("bucc"), lang),
             "'{}' is not a BUCC language; they are: "
             "{}",
             lang, io::join(task_languages("bucc")));
  const std::string base = path_under(download_dir, fmt::format("bucc2018/{}-en.{}", lang, split));
  BuccCorpus corpus;
  corpus.language = lang;
  const std::string remedy = fmt::format(
      "XTREME's scripts/download_data.sh writes the dev files and the test sentences (set "
      "finetune.data_dir to its download/ folder); the test gold is BUCC 2018's training-gold "
      "archive ({})",
      io::gold_remedy(TaskGold::kBucc));
  auto read_side = [&](const std::string& ext,
                       std::vector<std::pair<std::string, std::string>>& out,
                       std::unordered_set<std::string>& ids) {
    const std::string path = base + "." + ext;
    io::require_file(path, fmt::format("bucc {} split for language '{}'", split, lang), remedy);
    io::Lines reader(path, kSentenceBytesKept);
    for (std::string line; reader.next(line);) {
      if (line.empty()) continue;
      const std::string at = io::where(path, reader.lines_read());
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
  io::Lines reader(gold_path);
  for (std::string line; reader.next(line);) {
    if (line.empty()) continue;
    const std::string at = io::where(gold_path, reader.lines_read());
    const auto f = text::split_tabs(line);
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
       text::split_ascii(tab == std::string::npos ? line : line.substr(tab + 1))) {
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
  const std::string remedy =
      "finetune.data_dir must hold each pair's <a>-<b>.<a>, <a>-<b>.<b> and <a>-<b>.gold";
  io::require_file(source_path, "word-alignment source sentences", remedy);
  io::require_file(target_path, "word-alignment target sentences", remedy);
  io::require_file(gold_path, "word-alignment gold", remedy);
  const auto src = io::read_lines(source_path), tgt = io::read_lines(target_path),
             gold = io::read_lines(gold_path);
  XLME_CHECK(src.size() == tgt.size() && src.size() == gold.size(),
             "word alignment: '{}' has {} "
             "lines, '{}' {} and '{}' {}; the three files must be line-aligned",
             source_path, src.size(), target_path, tgt.size(), gold_path, gold.size());
  std::vector<AlignedPair> pairs(src.size());
  for (size_t k = 0; k < src.size(); ++k) {
    auto& p = pairs[k];
    p.source_words = text::split_ascii(src[k]);
    p.target_words = text::split_ascii(tgt[k]);
    const std::string at = io::where(gold_path, static_cast<int64_t>(k) + 1);
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

}  // namespace xlme::finetune
