// Readers of the sentence-pair classification tasks (xnli, pawsx; task_registry.h): XTREME's
// processed TSVs and the upstream release files that carry the test gold
// (docs/finetuning.md#where-gold-comes-from sections 3, 4 and 9).
#pragma once

#include "xlme/finetune/examples.h"
#include "xlme/finetune/xtreme_io.h"

#include <string>
#include <vector>

namespace xlme::finetune {

// ---- Sentence-pair classification (xnli, pawsx) ------------------------------------------------

// XTREME's processed file `<download_dir>/<task>/{split}-{lang}.tsv`, falling back to the original
// release's `{lang}-{split}.tsv`. Throws naming both paths, the task and the language when neither
// exists.
std::string pair_file(const std::string& download_dir, const std::string& task,
                      const std::string& split, const std::string& lang);

// Rows `text_a TAB text_b TAB label`; on the test split the label column may be missing (XTREME
// removed it), giving an empty label. The label is whitespace-stripped, renamed by the task's
// label_aliases (task_registry.h: xnli's "contradictory" is "contradiction"), and must be in
// task_labels(task). Throws naming file:line for a wrong column count or an unknown label (listing
// the label set).
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

// The upstream file with `task`'s test gold under `gold_dir` (finetune.gold_dir), as the task's
// row names it (task_registry.h): xnli `XNLI-1.0/xnli.test.tsv`, pawsx
// `x-final/<lang>/test_2k.tsv`.
std::string pair_gold_file(const std::string& gold_dir, const std::string& task,
                           const std::string& lang);

// The test pairs of `lang` from pair_gold_file, read by read_xnli_gold or read_pawsx_gold.
std::vector<PairExample> read_pair_gold(const std::string& gold_dir, const std::string& task,
                                        const std::string& lang);

}  // namespace xlme::finetune
