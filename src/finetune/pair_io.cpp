#include "xlme/finetune/pair_io.h"

#include "xlme/common/error.h"
#include "xlme/config/task_registry.h"
#include "xlme/finetune/text.h"
#include "xtreme_files.h"

#include <fmt/format.h>

#include <filesystem>
#include <functional>

namespace xlme::finetune {

namespace fs = std::filesystem;

// ---- Sentence-pair classification --------------------------------------------------------------

std::string pair_file(const std::string& download_dir, const std::string& task,
                      const std::string& split, const std::string& lang) {
  const std::string current =
      path_under(download_dir, fmt::format("{}/{}-{}.tsv", task, split, lang));
  const std::string original =
      path_under(download_dir, fmt::format("{}/{}-{}.tsv", task, lang, split));
  if (fs::is_regular_file(current)) return current;
  if (fs::is_regular_file(original)) return original;
  XLME_FAIL("{} {} split for language '{}': neither '{}' nor '{}' exists; {}", task, split, lang,
            current, original, io::data_remedy(task, download_dir));
}

std::vector<PairExample> read_pair_tsv(const std::string& path, const std::string& task,
                                       const std::string& split, TsvQuoting quoting) {
  const TaskInfo& info = task_info(task);
  task_labels(task);  // a sentence-pair task has labels
  std::vector<PairExample> examples;
  for (auto& row : read_tsv(path, quoting)) {
    const std::string at = io::where(path, row.line);
    const size_t n = row.fields.size();
    XLME_CHECK(n == 3 || (split == "test" && n == 2),
               "{}: expected {} TAB-separated columns (text_a, text_b, label{}), found {}", at,
               split == "test" ? "2 or 3" : "3", split == "test" ? " absent on test" : "", n);
    PairExample ex;
    ex.text_a = std::move(row.fields[0]);
    ex.text_b = std::move(row.fields[1]);
    if (n == 3) {
      ex.label = io::check_label(canonical_label(info, text::strip_ascii(row.fields[2])), task, at);
    }
    ex.source = {path, row.line};
    examples.push_back(std::move(ex));
  }
  io::require_content(!examples.empty(), path, "sentence pair ('text_a TAB text_b TAB label')");
  return examples;
}

std::vector<PairExample> read_pair_split(const std::string& download_dir, const std::string& task,
                                         const std::string& split, const std::string& lang,
                                         TsvQuoting quoting) {
  return read_pair_tsv(pair_file(download_dir, task, split, lang), task, split, quoting);
}

namespace {

// Reads one row of a gold release: checks the TAB-separated `fields` of the line at `at`
// ("path:line") and fills the pair; false skips the row.
using GoldRowReader = std::function<bool(const std::vector<std::string>& fields,
                                         const std::string& at, PairExample& ex)>;

// The pairs of a gold release's TSV `path` (`what` names it, and `task`'s gold_remedy says what to
// do, when it is missing): a header line,
// then one pair a line, empty lines skipped, each row read by `read_row`.
std::vector<PairExample> read_gold_tsv(const std::string& path, const std::string& what,
                                       const std::string& task, const GoldRowReader& read_row) {
  io::require_file(path, what, io::gold_remedy(task_info(task).gold));
  io::Lines reader(path);
  std::vector<PairExample> examples;
  std::string line;
  reader.next(line);  // header
  while (reader.next(line)) {
    if (line.empty()) continue;
    PairExample ex;
    if (!read_row(text::split_tabs(line), io::where(path, reader.lines_read()), ex)) continue;
    ex.source = {path, reader.lines_read()};
    examples.push_back(std::move(ex));
  }
  return examples;
}

}  // namespace

std::vector<PairExample> read_xnli_gold(const std::string& path, const std::string& lang) {
  auto examples =
      read_gold_tsv(path, "XNLI-1.0 gold for language '" + lang + "'", "xnli",
                    [&](const std::vector<std::string>& f, const std::string& at, PairExample& ex) {
                      XLME_CHECK(f.size() >= 8,
                                 "{}: expected XNLI-1.0's columns (language, gold_label, ..., "
                                 "sentence1 at 6, sentence2 at 7), found {} columns",
                                 at, f.size());
                      if (text::strip_ascii(f[0]) != lang) return false;
                      ex.label = io::check_label(
                          canonical_label(task_info("xnli"), text::strip_ascii(f[1])), "xnli", at);
                      ex.text_a = text::strip_ascii(f[6]);
                      ex.text_b = text::strip_ascii(f[7]);
                      return true;
                    });
  XLME_CHECK(!examples.empty(), "{}: no pairs for language '{}'; is it an XNLI language ({})?",
             path, lang, io::join(task_languages("xnli")));
  return examples;
}

std::vector<PairExample> read_pawsx_gold(const std::string& path) {
  return read_gold_tsv(
      path, "PAWS-X gold", "pawsx",
      [](const std::vector<std::string>& f, const std::string& at, PairExample& ex) {
        XLME_CHECK(f.size() == 4,
                   "{}: expected 4 columns (id, sentence1, sentence2, label), found {}", at,
                   f.size());
        ex.text_a = text::strip_ascii(f[1]);
        ex.text_b = text::strip_ascii(f[2]);
        ex.label = io::check_label(text::strip_ascii(f[3]), "pawsx", at);
        return true;
      });
}

std::string pair_gold_file(const std::string& gold_dir, const std::string& task,
                           const std::string& lang) {
  switch (task_info(task).gold) {
    case TaskGold::kXnliRelease:
      return path_under(gold_dir, "XNLI-1.0/xnli.test.tsv");
    case TaskGold::kPawsxRelease:
      return path_under(gold_dir, "x-final/" + lang + "/test_2k.tsv");
    default:
      XLME_FAIL("task '{}' is not a sentence-pair task with upstream gold (xnli, pawsx)", task);
  }
}

std::vector<PairExample> read_pair_gold(const std::string& gold_dir, const std::string& task,
                                        const std::string& lang) {
  const std::string path = pair_gold_file(gold_dir, task, lang);
  return task_info(task).gold == TaskGold::kXnliRelease ? read_xnli_gold(path, lang)
                                                        : read_pawsx_gold(path);
}

}  // namespace xlme::finetune
