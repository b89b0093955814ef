// The fine-tuning tasks (finetune.task) as rows of one table: which reader family serves each,
// whether it trains a head or probes the encoder, how it is scored, where its test gold is, its
// languages and labels. Code asks the table and never compares the name; a task of an existing
// family is one row in src/config/task_registry.cpp. The table is plain data that the config
// checks finetune.task against, so it sits in config/, below everything that reads it; its names
// are in namespace finetune, the area that serves the tasks.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xlme::finetune {

// The head a trained task puts on the encoder: one prediction per sequence (its first token) or
// per token.
enum class HeadKind { kSequence, kToken };

// The reader family and code path (tasks.cpp for trained tasks, probes.cpp for probes).
enum class TaskFamily {
  kSentencePair,  // pair_io.h; a sequence head over `labels`
  kTagging,       // tagging_io.h; a token head over `labels`, first sub-token of each word
  kQa,            // qa_io.h; a token head of start/end logits
  kRetrieval,     // retrieval_io.h; sentence embeddings of one layer, nearest neighbours
  kAlignment,     // retrieval_io.h; word vectors of one layer, aligned per sentence pair
};

// The official score (metrics.h).
enum class TaskMetric {
  kAccuracy,            // xnli, pawsx
  kSeqevalF1,           // udpos, panx: seqeval 0.0.12 chunk F1
  kSquadF1,             // xquad, tydiqa: SQuAD v1.1 F1 / EM, English normalization everywhere
  kMlqaF1,              // mlqa: MLQA's F1 / EM, normalized by the test language
  kTatoebaAccuracy,     // en -> xx nearest neighbour accuracy (LASER's aligned files)
  kBuccF1,              // margin mining, threshold tuned on dev
  kPairAccuracy,        // held-out line-aligned pairs, both directions
  kAlignmentErrorRate,  // AER against Pharaoh gold
};

// Where the test gold XTREME removed from its processed files is read from (finetune.gold_dir;
// tasks.h lists the layouts).
enum class TaskGold {
  kNone,          // retrieval, alignment: the data folder carries the gold
  kXnliRelease,   // XNLI-1.0/xnli.test.tsv
  kPawsxRelease,  // x-final/<lang>/test_2k.tsv
  kUdRelease,     // a UD release folder, <lang>_*-test.conllu
  kPanxRaw,       // unpacked WikiAnn, <lang>/test
  kSquadJson,     // the SQuAD-format file of the processed file's name, with answers
  kLaserTatoeba,  // LASER's tatoeba.<xxx>-eng.{<xxx>,eng}
  kBucc,          // bucc2018/<lang>-en.test.gold beside the sentences
};

struct TaskInfo {
  std::string name;
  TaskFamily family;
  TaskMetric metric;
  bool trains;    // fine-tunes a head (tasks.h make_task); false: probes the encoder (probes.h)
  HeadKind head;  // of a trained task
  // The dataset whose train split trains the head: the task itself, or squad for xquad and mlqa
  // (docs/finetuning.md#fine-tuning-recipe-xtremes-scripts).
  std::string train_data;
  bool has_dev;  // XTREME evaluates a dev set (not xquad, tydiqa: their models are not selected)
  TaskGold gold;
  std::vector<std::string> languages;  // XTREME's evaluation languages, in its order
  std::vector<std::string> labels;     // class order of the head (sentence pair, tagging)
  // Labels that files spell differently, read as the second (xnli's "contradictory").
  std::vector<std::pair<std::string, std::string>> label_aliases;
};

// Every task, in the order of task_names().
const std::vector<TaskInfo>& task_table();

// The task called `name`; throws xlme::Error naming it and listing task_names() otherwise.
const TaskInfo& task_info(std::string_view name);

// xnli pawsx udpos panx xquad mlqa tydiqa tatoeba bucc retrieval alignment: the values of
// finetune.task.
std::vector<std::string> task_names();

// The tasks of one family, in table order (kTagging: udpos panx).
std::vector<std::string> task_names(TaskFamily family);

// The languages XTREME evaluates for `task`, in XTREME's order (the original release: udpos 33,
// panx 40, xnli 15, pawsx 7, xquad 11, mlqa 7, tydiqa 9, tatoeba 36 without en, bucc 4; none for
// retrieval and alignment, whose pairs are the data folder's). Throws for an unknown task.
const std::vector<std::string>& task_languages(std::string_view task);

// The label set of a sentence-pair or tagging task, in the model's class order: xnli
// contradiction/entailment/neutral, pawsx 0/1, udpos "O" + the 17 sorted UPOS tags (XTREME's
// get_labels prepends O: 18 classes), panx the 7 sorted IOB2 tags. Throws for other tasks, listing
// the labelled ones.
const std::vector<std::string>& task_labels(std::string_view task);

// `label` as `task` names it: an alias (label_aliases) replaced, anything else unchanged.
const std::string& canonical_label(const TaskInfo& task, const std::string& label);

}  // namespace xlme::finetune
