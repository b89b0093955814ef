// config/task_registry: the one table of fine-tuning tasks, and what asks it (the config check
// of finetune.task, the readers, the submission layout, xlme-data xtreme).
#include "xlme/config/task_registry.h"

#include "xlme/config/config.h"
#include "xlme/finetune/pair_io.h"
#include "xlme/finetune/tagging_io.h"
#include "xlme/finetune/xtreme_io.h"

#include "test_util.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace xlme::finetune {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::TempDir;
using xlme::testing::write_file;

TEST(TaskRegistry, LanguageListsOfTheOriginalRelease) {
  const std::map<std::string, size_t> counts = {{"udpos", 33}, {"panx", 40},    {"xnli", 15},
                                                {"pawsx", 7},  {"xquad", 11},   {"mlqa", 7},
                                                {"tydiqa", 9}, {"tatoeba", 36}, {"bucc", 4}};
  for (const auto& [task, n] : counts) EXPECT_EQ(task_languages(task).size(), n) << task;
  EXPECT_EQ(task_labels("udpos").size(), 18u);
  EXPECT_EQ(task_labels("udpos").front(), "O");
  EXPECT_EQ(task_labels("panx").size(), 7u);
  EXPECT_TRUE(contains_all(error_message([] { task_languages("ner"); }),
                           {"'ner'", "xnli pawsx udpos panx"}));
}

// An unknown name lists the table, from the registry and from the config check alike.
TEST(TaskRegistry, UnknownNameListsTheKnownOnes) {
  EXPECT_TRUE(contains_all(error_message([] { task_info("ner"); }),
                           {"unknown fine-tuning task 'ner' (finetune.task)",
                            "the tasks are: xnli pawsx udpos panx xquad mlqa tydiqa tatoeba bucc "
                            "retrieval alignment"}));
  EXPECT_TRUE(contains_all(error_message([] { config::load_config("", {"finetune.task=ner"}); }),
                           {"finetune.task", "ner",
                            "one of: xnli, pawsx, udpos, panx, xquad, mlqa, tydiqa, tatoeba, bucc, "
                            "retrieval, alignment"}));
  EXPECT_EQ(config::load_config("", {"finetune.task=tydiqa"}).finetune.task, "tydiqa");
  EXPECT_TRUE(
      contains_all(error_message([] { task_labels("xquad"); }), {"task 'xquad' has no label set",
                                                                 "labelled tasks are: xnli pawsx "
                                                                 "udpos panx"}));
}

// What each row says, against docs/finetuning.md: the readers, heads, metrics and training data.
TEST(TaskRegistry, RowsSayWhatEachTaskDoes) {
  std::set<std::string> names;
  for (const auto& task : task_table()) {
    EXPECT_TRUE(names.insert(task.name).second) << task.name << " twice";
    EXPECT_EQ(&task_info(task.name), &task);
    // Trained tasks are the sentence-pair, tagging and QA families; the rest are probes.
    const bool trained_family = task.family == TaskFamily::kSentencePair ||
                                task.family == TaskFamily::kTagging ||
                                task.family == TaskFamily::kQa;
    EXPECT_EQ(task.trains, trained_family) << task.name;
    EXPECT_EQ(!task.labels.empty(),
              task.family == TaskFamily::kSentencePair || task.family == TaskFamily::kTagging)
        << task.name;
  }
  EXPECT_EQ(task_info("xnli").head, HeadKind::kSequence);
  EXPECT_EQ(task_info("panx").head, HeadKind::kToken);
  EXPECT_EQ(task_info("xquad").train_data, "squad");
  EXPECT_EQ(task_info("mlqa").train_data, "squad");
  EXPECT_EQ(task_info("tydiqa").train_data, "tydiqa");
  EXPECT_EQ(task_info("mlqa").metric, TaskMetric::kMlqaF1);
  EXPECT_EQ(task_info("xquad").metric, TaskMetric::kSquadF1);
  EXPECT_TRUE(task_info("mlqa").has_dev);
  EXPECT_FALSE(task_info("xquad").has_dev);
  EXPECT_EQ(canonical_label(task_info("xnli"), "contradictory"), "contradiction");
  EXPECT_EQ(canonical_label(task_info("pawsx"), "contradictory"), "contradictory");
  EXPECT_EQ(task_names(TaskFamily::kTagging), (std::vector<std::string>{"udpos", "panx"}));
  EXPECT_EQ(task_names(TaskFamily::kQa), (std::vector<std::string>{"xquad", "mlqa", "tydiqa"}));
}

// The code that asked for names before asks the rows now.
TEST(TaskRegistry, ReadersAskTheRows) {
  TempDir dir;
  EXPECT_EQ(prediction_path("p", "tydiqa", "sw"), "p/tydiqa/test-sw.json");
  EXPECT_EQ(prediction_path("p", "panx", "sw"), "p/panx/test-sw.tsv");
  EXPECT_EQ(pair_gold_file("g", "xnli", "de"), "g/XNLI-1.0/xnli.test.tsv");
  EXPECT_EQ(pair_gold_file("g", "pawsx", "de"), "g/x-final/de/test_2k.tsv");
  EXPECT_TRUE(contains_all(error_message([] { pair_gold_file("g", "udpos", "de"); }),
                           {"'udpos' is not a sentence-pair task", "xnli, pawsx"}));
  write_file(dir / "gold/de/test", "de:Berlin\tB-LOC\nde:liegt\tO\n\nde:Bonn\tB-LOC\n");
  EXPECT_EQ(tagging_gold_files(dir / "gold", "panx", "de"),
            (std::vector<std::string>{dir / "gold/de/test"}));
  EXPECT_EQ(read_tagging_gold(dir / "gold", "panx", "de").size(), 2u);
  EXPECT_TRUE(contains_all(error_message([&] { tagging_gold_files(dir / "gold", "panx", "fr"); }),
                           {"panx test gold for language 'fr'", dir / "gold/fr/test"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { prepare_tagging("xnli", dir / "gold", dir / "out", {}); }),
                   {"'xnli' is not a tagging task", "udpos panx"}));
}

}  // namespace
}  // namespace xlme::finetune
