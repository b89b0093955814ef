// The XTREME tasks that train a head (xnli, pawsx, udpos, panx, xquad, mlqa, tydiqa) as
// TrainableTasks, as their rows in config/task_registry.h say: reading (pair_io.h,
// tagging_io.h, qa_io.h), featurization (finetune/features.h), loss, the official metric
// (finetune/metrics.h) and the submission files (xtreme_io.h's writers).
//
// Where gold comes from (XTREME removed test labels from its processed files,
// docs/finetuning.md#conventions-shared-by-all-tasks, #where-gold-comes-from): dev sets from
// finetune.data_dir; test sets from the processed file when it carries labels, otherwise from
// finetune.gold_dir in the upstream layout: xnli `XNLI-1.0/xnli.test.tsv`, pawsx
// `x-final/<lang>/test_2k.tsv`, udpos a UD release folder (`<lang>_*-test.conllu`), panx the
// unpacked WikiAnn folders (`<lang>/test`), QA the SQuAD-format file of the same name as the
// processed one, with its answers. A test set without gold is still predicted (the submission
// file) but not scored.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/tokenizer.h"
#include "xlme/finetune/runner.h"

#include <memory>
#include <string>
#include <vector>

namespace xlme::finetune {

// The languages to evaluate: finetune.languages, or the task's XTREME list.
std::vector<std::string> evaluated_languages(const config::FinetuneConfig& settings);

// Reads and featurizes the training set now; evaluation sets when first asked for.
std::unique_ptr<TrainableTask> make_task(const config::FinetuneConfig& settings,
                                         const data::Tokenizer& tokenizer);

}  // namespace xlme::finetune
