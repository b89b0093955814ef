#include "xlme/config/task_registry.h"

#include "xlme/common/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

namespace xlme::finetune {

const std::vector<TaskInfo>& task_table() {
  using F = TaskFamily;
  using M = TaskMetric;
  using G = TaskGold;
  constexpr bool kTrains = true, kProbe = false, kDev = true, kNoDev = false;
  auto words = [](const char* list) {
    std::istringstream in(list);
    std::vector<std::string> out;
    for (std::string word; in >> word;) out.push_back(word);
    return out;
  };
  // One row per task: name, family, metric, trains, head, train_data, has_dev, gold,
  // languages, labels, label_aliases.
  // clang-format off
  static const std::vector<TaskInfo> table = {
      {"xnli", F::kSentencePair, M::kAccuracy, kTrains, HeadKind::kSequence, "xnli", kDev,
       G::kXnliRelease, words("ar bg de el en es fr hi ru sw th tr ur vi zh"),
       {"contradiction", "entailment", "neutral"}, {{"contradictory", "contradiction"}}},
      {"pawsx", F::kSentencePair, M::kAccuracy, kTrains, HeadKind::kSequence, "pawsx", kDev,
       G::kPawsxRelease, words("de en es fr ja ko zh"), {"0", "1"}, {}},
      {"udpos", F::kTagging, M::kSeqevalF1, kTrains, HeadKind::kToken, "udpos", kDev,
       G::kUdRelease,
       words("af ar bg de el en es et eu fa fi fr he hi hu id it ja kk ko mr nl pt ru ta te th tl "
             "tr ur vi yo zh"),
       {"O", "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
        "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X"}, {}},
      {"panx", F::kTagging, M::kSeqevalF1, kTrains, HeadKind::kToken, "panx", kDev, G::kPanxRaw,
       words("ar he vi id jv ms tl eu ml ta te af nl en de el bn hi mr ur fa fr it pt es bg ru ja "
             "ka ko th sw yo my zh kk tr et fi hu"),
       {"B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"}, {}},
      {"xquad", F::kQa, M::kSquadF1, kTrains, HeadKind::kToken, "squad", kNoDev, G::kSquadJson,
       words("en es de el ru tr ar vi th zh hi"), {}, {}},
      {"mlqa", F::kQa, M::kMlqaF1, kTrains, HeadKind::kToken, "squad", kDev, G::kSquadJson,
       words("en es de ar hi vi zh"), {}, {}},
      {"tydiqa", F::kQa, M::kSquadF1, kTrains, HeadKind::kToken, "tydiqa", kNoDev, G::kSquadJson,
       words("en ar bn fi id ko ru sw te"), {}, {}},
      {"tatoeba", F::kRetrieval, M::kTatoebaAccuracy, kProbe, HeadKind::kSequence, "", kNoDev,
       G::kLaserTatoeba,
       words("ar he vi id jv tl eu ml ta te af nl de el bn hi mr ur fa fr it pt es bg ru ja ka ko "
             "th sw zh kk tr et fi hu"), {}, {}},
      {"bucc", F::kRetrieval, M::kBuccF1, kProbe, HeadKind::kSequence, "", kDev, G::kBucc,
       words("de fr ru zh"), {}, {}},
      {"retrieval", F::kRetrieval, M::kPairAccuracy, kProbe, HeadKind::kSequence, "", kNoDev,
       G::kNone, {}, {}, {}},
      {"alignment", F::kAlignment, M::kAlignmentErrorRate, kProbe, HeadKind::kToken, "", kNoDev,
       G::kNone, {}, {}, {}},
  };
  // clang-format on
  return table;
}

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& task : task_table()) names.push_back(task.name);
  return names;
}

std::vector<std::string> task_names(TaskFamily family) {
  std::vector<std::string> names;
  for (const auto& task : task_table()) {
    if (task.family == family) names.push_back(task.name);
  }
  return names;
}

const TaskInfo& task_info(std::string_view name) {
  const auto& table = task_table();
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const TaskInfo& task) { return task.name == name; });
  XLME_CHECK(it != table.end(), "unknown fine-tuning task '{}' (finetune.task); the tasks are: {}",
             name, fmt::join(task_names(), " "));
  return *it;
}

const std::vector<std::string>& task_languages(std::string_view task) {
  return task_info(task).languages;
}

const std::vector<std::string>& task_labels(std::string_view task) {
  const auto& info = task_info(task);
  if (info.labels.empty()) {
    std::vector<std::string> labelled;
    for (const auto& t : task_table()) {
      if (!t.labels.empty()) labelled.push_back(t.name);
    }
    XLME_FAIL("task '{}' has no label set; the labelled tasks are: {}", task,
              fmt::join(labelled, " "));
  }
  return info.labels;
}

const std::string& canonical_label(const TaskInfo& task, const std::string& label) {
  for (const auto& [alias, name] : task.label_aliases) {
    if (label == alias) return name;
  }
  return label;
}

}  // namespace xlme::finetune
