// Readers of the QA tasks (xquad, mlqa, tydiqa, and squad, which trains xquad and mlqa;
// task_registry.h): where XTREME keeps each SQuAD-format file, and the JSON reader
// (docs/finetuning.md#question-answering).
#pragma once

#include "xlme/finetune/examples.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::finetune {

// The SQuAD-format file of QA dataset `dataset` (squad: train/dev; xquad: test; mlqa: dev/test,
// context = question language; tydiqa: train/test, test being TyDiQA-GoldP dev; a task's
// train_data names its training dataset) under `download_dir`, trying the names XTREME's scripts
// and preprocessing use (docs/finetuning.md#where-gold-comes-from; one table in qa_io.cpp). Throws
// listing every path tried, the dataset and the language when none exists, or the datasets' splits
// for a split XTREME does not have.
std::string qa_file(const std::string& download_dir, const std::string& dataset,
                    const std::string& split, const std::string& lang);

// The same file with its answers in a flat `gold_dir` (finetune.gold_dir): the name qa_file
// finds, without its folders. Throws listing every path tried.
std::string qa_gold_file(const std::string& gold_dir, const std::string& dataset,
                         const std::string& split, const std::string& lang);

// The file a QA config key (finetune.train_file, finetune.dev_file) names: `file` relative to
// `data_dir` or absolute. The key's default when empty is XTREME's file of `dataset`'s `split`
// for `lang` (none when `dataset` is empty). Throws when the file does not exist, naming the key,
// the value, the path, the default, and what to download (SQuAD v1.1's files by name).
std::string qa_config_file(const std::string& data_dir, const std::string& file,
                           const std::string& key, const std::string& dataset,
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
// kept with start = -1. Read by common/json.h's parse_json (nesting limited to kMaxJsonDepth).
// Throws naming the file and the JSON path (data[0].paragraphs[2].qas[1].id) and the value found
// for a missing or mistyped field, the file and the parser's line and column for invalid JSON.
// Question ids must be unique in gold (without skip_mismatched): a repeated id is an error naming
// both questions; in training data it is counted and logged.
QaData read_squad_json(const std::string& path, bool skip_mismatched = true);

}  // namespace xlme::finetune
