// Readers for XTREME's processed layout (`download/<task>/…`) and for the upstream files that carry
// test gold (../shared/XTREME.md §9), the task language and label lists, and writers for XTREME's
// submission layout (`predictions/<task>/test-<lang>.{tsv,json}`). Every error names the file and
// the 1-based line (or the JSON key) and says what to do.
#pragma once

#include "xlme/finetune/examples.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xlme::finetune {

// ---- Paths -------------------------------------------------------------------------------------

// `root`/`relative`, checked to stay under `root` after resolving "." and ".." (lexically): every
// path fine-tuning builds from config values (a language code, a pair name, a file name) under
// finetune.data_dir, finetune.gold_dir or run.out_dir goes through here. Throws naming both
// otherwise.
std::string path_under(const std::string& root, const std::string& relative);

// ---- Tasks -------------------------------------------------------------------------------------

// The task names: xnli pawsx udpos panx xquad mlqa tydiqa tatoeba bucc (and squad, whose only
// language is en). Throws xlme::Error listing them for an unknown name.
const std::vector<std::string>& task_names();

// The languages XTREME evaluates for `task`, in XTREME's order (the original release: udpos 33,
// panx 40, xnli 15, pawsx 7, xquad 11, mlqa 7, tydiqa 9, tatoeba 36 without en, bucc 4).
const std::vector<std::string>& task_languages(const std::string& task);

// The label set of a classification or tagging task, in the model's class order: xnli
// contradiction/entailment/neutral, pawsx 0/1, udpos "O" + the 17 sorted UPOS tags (XTREME's
// get_labels prepends O: 18 classes), panx the 7 sorted IOB2 tags. Throws for other tasks.
const std::vector<std::string>& task_labels(std::string_view task);

// ---- TSV ---------------------------------------------------------------------------------------

// How to read a TSV that Python's csv.writer (excel dialect, TAB delimiter) wrote: a field with a
// quote, TAB or newline is wrapped in quotes with inner quotes doubled.
enum class TsvQuoting {
  // XTREME's reader (csv.reader with quotechar=None): every physical line is a row split at TABs,
  // quotes are kept literally (`"He said ""hi"""`). The default, for reproducing XTREME.
  kFaithful,
  // Proper CSV: quoted fields are unquoted, doubled quotes undone, and a quoted field may span
  // lines.
  kUnquoted,
};

// "faithful" or "unquoted"; throws listing both otherwise.
TsvQuoting parse_tsv_quoting(const std::string& name);

struct TsvRow {
  std::vector<std::string> fields;
  int64_t line = 0;  // 1-based line where the row starts
};

// The rows of a TSV with LF or CRLF line ends (a UTF-8 BOM is dropped, empty lines are skipped).
// Throws naming file:line for an unterminated quoted field (kUnquoted).
std::vector<TsvRow> read_tsv(const std::string& path, TsvQuoting quoting);

// ---- Sentence-pair classification (xnli, pawsx) ------------------------------------------------

// XTREME's processed file `<download_dir>/<task>/{split}-{lang}.tsv`, falling back to the original
// release's `{lang}-{split}.tsv`. Throws naming both paths, the task and the language when neither
// exists.
std::string pair_file(const std::string& download_dir, const std::string& task,
                      const std::string& split, const std::string& lang);

// Rows `text_a TAB text_b TAB label`; on the test split the label column may be missing (XTREME
// removed it), giving an empty label. The label is whitespace-stripped, xnli's "contradictory" is
// renamed "contradiction", and it must be in task_labels(task). Throws naming file:line for a
// wrong column count or an unknown label (listing the label set).
std::vector<PairExample> read_pair_tsv(const std::string& path, const std::string& task,
                                       const std::string& split,
                                       TsvQuoting quoting = TsvQuoting::kFaithful);

// pair_file + read_pair_tsv.
std::vector<PairExample> read_pair_split(const std::string& download_dir, const std::string& task,
                                         const std::string& split, const std::string& lang,
                                         TsvQuoting quoting = TsvQuoting::kFaithful);

// Upstream XNLI-1.0 gold `xnli.{dev,test}.tsv` (header; columns 0 language, 1 gold_label,
// 6 sentence1, 7 sentence2; plain TAB split as XTREME's preprocessing): the pairs of `lang`.
// Throws when the file has none for `lang`.
std::vector<PairExample> read_xnli_gold(const std::string& path, const std::string& lang);

// Upstream PAWS-X gold `x-final/{lang}/{dev_2k,test_2k}.tsv` (header; id, sentence1, sentence2,
// label; plain TAB split as XTREME's preprocessing).
std::vector<PairExample> read_pawsx_gold(const std::string& path);

// ---- Tagging (udpos, panx) ---------------------------------------------------------------------

// XTREME's processed file `<download_dir>/<task>/{split}-{lang}.tsv`; throws naming the path, the
// task and the language when it is missing.
std::string tagging_file(const std::string& download_dir, const std::string& task,
                         const std::string& split, const std::string& lang);

// CoNLL-style `word TAB tag` lines, a blank line between sentences; test files carry only the
// word (tags stay empty). A file mixes neither. Tags must be in task_labels(task) (pass "" to skip
// the check). Throws naming file:line otherwise.
std::vector<TaggedSentence> read_conll_tsv(const std::string& path, const std::string& task);

// Raw PAN-X (WikiAnn, Rahimi et al.) `lang:token TAB tag` lines: everything up to the first ':' is
// dropped (XTREME's later rule; the original cut at the second ':' too). A line without exactly two
// TAB fields ends a sentence, as XTREME's panx_preprocess. Tags are checked against panx's set.
std::vector<TaggedSentence> read_panx_raw(const std::string& path);

// A UD `.conllu` file as XTREME's udpos pipeline sees it (conllu_to_conll.py
// --replace_subtokens_with_fused_forms, then utils_preprocess.py): FORM and UPOS of every word;
// a multi-word token `3-4 del` becomes one word with the fused form and the UPOS of the span's
// head (the node with fewest ancestors in the HEAD tree, ties broken by the conversion tool's POS
// precedence list for `lang`); empty nodes (`8.1`) and comments are skipped; U+200C and spaces
// inside forms are deleted; sentences whose forms are all `_` are dropped (the original rule).
// UPOS must be one of the 17 tags.
std::vector<TaggedSentence> read_conllu(const std::string& path, const std::string& lang);

// The `.conllu` files of `lang` and `split` under a UD release folder (e.g. ud-treebanks-v2.5):
// every file, at any depth, whose name starts with "<lang>_" and contains `split`, sorted by file
// name, as XTREME concatenates all treebanks of a language. Throws naming the folder when none.
std::vector<std::string> ud_conllu_files(const std::string& ud_dir, const std::string& lang,
                                         const std::string& split);

// ---- QA (squad, xquad, mlqa, tydiqa) -----------------------------------------------------------

// The SQuAD-format file of `task` (squad: train/dev; xquad: test; mlqa: dev/test,
// context = question language; tydiqa: train/test, test being TyDiQA-GoldP dev) under
// `download_dir`, trying the names XTREME's scripts and preprocessing use (XTREME.md §5). Throws
// listing every path tried, the task and the language when none exists.
std::string qa_file(const std::string& download_dir, const std::string& task,
                    const std::string& split, const std::string& lang);

// The same file with its answers in a flat `gold_dir` (finetune.gold_dir): the name qa_file
// finds, without its folders. Throws listing every path tried.
std::string qa_gold_file(const std::string& gold_dir, const std::string& task,
                         const std::string& split, const std::string& lang);

struct QaData {
  std::vector<QaExample> examples;
  // Questions left out because an answer's text is not the context's text at its `answer_start`
  // (counted only with skip_mismatched).
  int64_t skipped = 0;
};

// A SQuAD v1.1 JSON file. `answer_start` (code points) becomes a byte offset into the UTF-8
// context. With `skip_mismatched` (for training, as the official code skips such examples) a
// question with an answer that does not match the context at its offset is skipped, counted and
// logged; without it (for gold used in evaluation, where every question counts) the answer is
// kept with start = -1. Throws naming the file and the JSON path (data[0].paragraphs[2].qas[1].id)
// for a missing or mistyped field, the file and line for invalid JSON.
QaData read_squad_json(const std::string& path, bool skip_mismatched = true);

// ---- Retrieval (tatoeba, bucc) -----------------------------------------------------------------

// The LASER 3-letter code for XTREME's 2-letter Tatoeba language (fa -> pes, sw -> swh, zh -> cmn,
// ...): the 36 of XTREME and XTREME-R's az, lt, pl, ro, uk. Throws listing them.
const std::string& tatoeba_iso3(const std::string& lang);

// Two line-aligned files as SentencePairs (source_language/target_language given); throws naming
// both files when their line counts differ.
SentencePairs read_line_pairs(const std::string& source_path, const std::string& target_path,
                              const std::string& source_language,
                              const std::string& target_language, bool aligned);

// LASER's originals `<dir>/tatoeba.{xxx}-eng.{xxx}` and `.eng`: source = lang, target = en,
// aligned (line i translates line i).
SentencePairs read_tatoeba_laser(const std::string& dir, const std::string& lang);

// XTREME's copy `<download_dir>/tatoeba/{xx}-en.{xx}` and `{xx}-en.en` (the English side sorted,
// so not aligned).
SentencePairs read_tatoeba_xtreme(const std::string& download_dir, const std::string& lang);

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

// ---- XTREME's processed layout from the downloads -----------------------------------------------

// A file prepare_udpos / prepare_panx wrote.
struct PreparedFile {
  std::string path;
  int64_t sentences = 0;
};

// `<out_dir>/<task>/{split}-{lang}.tsv` as XTREME's utils_preprocess.py writes them: `word TAB tag`
// lines, a blank line between sentences (none after the last); test files hold the word only
// (XTREME removes test labels: score test with finetune.gold_dir). Replaces the file atomically.
void write_tagged_tsv(const std::string& path, const std::vector<TaggedSentence>& sentences,
                      bool with_tags);

// udpos from a UD release folder (e.g. ud-treebanks-v2.5), as download_data.sh does with
// conllu_to_conll.py and udpos_preprocess: per language and split, every treebank whose file name
// starts with "<lang>_" and contains the split, concatenated in file-name order and read by
// read_conllu (multi-word tokens fused, empty nodes and comments skipped). `languages` empty =
// udpos's 33; a language without files of a split gets no file. Throws naming the folder when no
// file is found at all.
std::vector<PreparedFile> prepare_udpos(const std::string& ud_dir, const std::string& out_dir,
                                        const std::vector<std::string>& languages);

// panx from the unpacked WikiAnn archives `<panx_dir>/<lang>/{train,dev,test}` (raw `lang:token
// TAB tag` lines, read by read_panx_raw), as panx_preprocess. `languages` empty = panx's 40; a
// missing file is skipped. Throws naming the folder when none is found.
std::vector<PreparedFile> prepare_panx(const std::string& panx_dir, const std::string& out_dir,
                                       const std::vector<std::string>& languages);

// ---- Submission layout -------------------------------------------------------------------------

// `<dir>/<task>/test-<lang>.json` for QA tasks, `.tsv` otherwise (XTREME's evaluate.py layout;
// `dir` is the `predictions` folder).
std::string prediction_path(const std::string& dir, const std::string& task,
                            const std::string& lang);

// One label per line (xnli, pawsx). All writers replace the file atomically.
void write_label_predictions(const std::string& path, const std::vector<std::string>& labels);
// One tag per line, a blank line between sentences (udpos, panx).
void write_tag_predictions(const std::string& path,
                           const std::vector<std::vector<std::string>>& sentences);
// A JSON object {question id: answer text} (xquad, mlqa, tydiqa).
void write_qa_predictions(const std::string& path,
                          const std::map<std::string, std::string>& answers);
// One integer per line (tatoeba: the retrieved index for each sentence in the file's order).
void write_index_predictions(const std::string& path, const std::vector<int64_t>& indices);
// `srcID TAB enID` lines (bucc).
void write_pair_predictions(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& pairs);

}  // namespace xlme::finetune
