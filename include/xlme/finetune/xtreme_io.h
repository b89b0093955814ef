// What every XTREME reader and writer shares: paths kept under their root folder, TSV as
// XTREME's Python writes and reads it, and XTREME's submission layout
// (`predictions/<task>/test-<lang>.{tsv,json}`). The readers, one file per task family:
// pair_io.h (xnli, pawsx), tagging_io.h (udpos, panx), qa_io.h (squad, xquad, mlqa, tydiqa),
// retrieval_io.h (tatoeba, bucc, held-out pairs, word alignment); the tasks: task_registry.h.
// Every error names the file and the 1-based line (or the JSON key) and says what to do.
#pragma once

#include "xlme/finetune/examples.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace xlme::finetune {

// ---- Paths -------------------------------------------------------------------------------------

// `root`/`relative`, checked to stay under `root` after resolving "." and ".." (lexically): every
// path fine-tuning builds from config values (a language code, a pair name, a file name) under
// finetune.data_dir, finetune.gold_dir or run.out_dir goes through here. Throws naming both
// otherwise.
std::string path_under(const std::string& root, const std::string& relative);

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

// ---- Test files against their gold -------------------------------------------------------------

// An example as a processed test file and the upstream gold it was made from must both hold it:
// where it is, and the strings they must agree on (a sentence's words; a pair's two sentences; a
// question's id, question and context).
struct ExampleKey {
  Source source;
  std::vector<std::string> fields;
};

// How a test file's value and the gold's value are compared (exact by default).
using SameValue = std::function<bool(const std::string& test, const std::string& gold)>;

// Throws unless `test` (XTREME's processed test file `test_file`, without labels) and `gold` (the
// upstream file(s) `gold_files` that carry them) hold the same examples in the same order: the
// error names both files, both counts and the first difference (its lines in both files and the
// differing value). `what` starts the message ("udpos test set of de"); `unit` names an example
// ("sentence"); `field_names` the fields (one name: "word" -> "word 3"); `kind` what `test_file`
// is ("test file"; "dev file" when a dev set checks the gold's release).
void check_test_matches_gold(const std::string& what, const std::vector<ExampleKey>& test,
                             const std::string& test_file, const std::vector<ExampleKey>& gold,
                             const std::string& gold_files, const std::string& unit,
                             const std::vector<std::string>& field_names,
                             const SameValue& same = {}, const std::string& kind = "test file");

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
// A JSON object {question id: answer text}, keys sorted, indented by 2 (xquad, mlqa, tydiqa).
void write_qa_predictions(const std::string& path,
                          const std::map<std::string, std::string>& answers);
// One integer per line (tatoeba: the retrieved index for each sentence in the file's order).
void write_index_predictions(const std::string& path, const std::vector<int64_t>& indices);
// `srcID TAB enID` lines (bucc).
void write_pair_predictions(const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& pairs);

}  // namespace xlme::finetune
