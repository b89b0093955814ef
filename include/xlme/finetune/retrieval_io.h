// Readers of the probes (tatoeba, bucc, retrieval, alignment; task_registry.h): line-aligned
// sentence files, LASER's and XTREME's Tatoeba, BUCC 2018 with its gold, and word-alignment gold
// in Pharaoh format (docs/finetuning.md#xtremes-protocol).
#pragma once

#include "xlme/finetune/examples.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::finetune {

// ---- Retrieval (tatoeba, bucc) -----------------------------------------------------------------

// The LASER 3-letter code for XTREME's 2-letter Tatoeba language (fa -> pes, sw -> swh, zh -> cmn,
// ...): the 36 of XTREME and XTREME-R's az, lt, pl, ro, uk. Throws listing them.
const std::string& tatoeba_iso3(const std::string& lang);

// Two line-aligned files as SentencePairs (source_language/target_language given); throws naming
// both files when their line counts differ, and a missing file with `remedy` (what to do).
SentencePairs read_line_pairs(const std::string& source_path, const std::string& target_path,
                              const std::string& source_language,
                              const std::string& target_language, bool aligned,
                              const std::string& remedy);

// LASER's originals `<dir>/tatoeba.{xxx}-eng.{xxx}` and `.eng` (dir = finetune.gold_dir, LASER's
// data/tatoeba/v1): source = lang, target = en, aligned (line i translates line i). A missing
// file's error says what finetune.gold_dir must hold.
SentencePairs read_tatoeba_laser(const std::string& dir, const std::string& lang);

// XTREME's copy `<download_dir>/tatoeba/{xx}-en.{xx}` and `{xx}-en.en` (the English side sorted,
// so not aligned). Throws saying to set finetune.gold_dir when `download_dir` holds LASER's files.
SentencePairs read_tatoeba_xtreme(const std::string& download_dir, const std::string& lang);

// A language's Tatoeba test set and where it came from, for the log.
struct TatoebaTest {
  SentencePairs pairs;
  std::string from;  // "from the gold '…' and '…', the same as XTREME's test files '…' and '…'"
};

// The Tatoeba test set of `lang`: without `gold_dir`, XTREME's copy under `data_dir` (not
// aligned); with it, LASER's originals, which must then hold what XTREME's copy holds when that is
// there (its xx side line for line, its English side as XTREME sorts it): a gold cut short or
// changed is an error naming both files, both counts and the first differing line.
TatoebaTest read_tatoeba(const std::string& gold_dir, const std::string& data_dir,
                         const std::string& lang);

// For each line of XTREME's sorted English file, the line of the LASER English file it came from
// (XTREME sorts the stripped lines with a stable sort): the gold of a leaderboard-order prediction.
std::vector<int64_t> tatoeba_sorted_order(const std::vector<std::string>& english);

// BUCC 2018 `<download_dir>/bucc2018/{lg}-en.{split}.{lg|en}` (`ID TAB sentence` lines) and, when
// present, `{lg}-en.{split}.gold` (`srcID TAB enID`); `require_gold` makes a missing gold file an
// error. Throws naming file:line for a line without a TAB, a duplicate id, or a gold id that is
// not in the corpus.
BuccCorpus read_bucc(const std::string& download_dir, const std::string& lang,
                     const std::string& split, bool require_gold);

// ---- Word alignment ----------------------------------------------------------------------------

// One line of Pharaoh links as the common gold files write them (lilt alignment-scripts,
// awesome-align, SimAlign): "i-j" is a sure link, "ipj" or "i?j" a possible one; indices are
// 0-based unless `one_based`. A leading "<id> TAB" (SimAlign) is ignored. Throws naming `where` for
// a bad link.
void parse_pharaoh_line(const std::string& line, bool one_based, const std::string& where,
                        std::vector<Link>& sure, std::vector<Link>& possible);

// The tokenized sentences (space-separated words, one sentence a line) of both sides and the gold
// Pharaoh file, line-aligned. Throws naming file:line for a link past a sentence's length or
// unequal line counts.
std::vector<AlignedPair> read_aligned_pairs(const std::string& source_path,
                                            const std::string& target_path,
                                            const std::string& gold_path, bool one_based = false);

}  // namespace xlme::finetune
