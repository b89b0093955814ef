// Fine-tuning as XTREME does it (docs/finetuning.md#fine-tuning-recipe-xtremes-scripts): train on
// one language, keep the weights with the best dev score of that language (or the last ones),
// evaluate every language, once per seed; then mean and standard deviation over seeds.
#pragma once

#include "xlme/config/config.h"
#include "xlme/finetune/model.h"

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace xlme::finetune {

enum class Split { kDev, kTest };
const char* split_name(Split split);

// Named scores of one evaluation (x100 where the official script reports x100) and the name of
// the one that selects checkpoints and averages into the task score.
struct Scores {
  std::map<std::string, double> values;
  std::string main;
  // The examples scored and the examples in the set ("sentence", "pair", "question"): fewer are
  // scored under finetune.max_eval_examples. 0 when the task does not say.
  int64_t scored = 0;
  int64_t total = 0;
  std::string unit{};

  double main_value() const;
};

// A task that trains a head: its data, its loss and its evaluation. Implementations hold the
// featurized training set and read evaluation sets on demand.
class TrainableTask {
 public:
  virtual ~TrainableTask() = default;

  virtual HeadKind head_kind() const = 0;
  virtual int64_t classes() const = 0;
  virtual int64_t train_size() const = 0;  // training features

  // Mean loss of the training features `indices` (the model is in training mode).
  virtual torch::Tensor loss(FinetuneModel& model, const std::vector<int64_t>& indices,
                             const torch::Device& device) = 0;

  // Scores on `language`'s `split` (the model is in eval mode, without gradients); no values when
  // the set has no gold. With a `predictions_path`, also writes the predictions there in XTREME's
  // submission layout (xtreme_io.h's writers).
  virtual Scores evaluate(FinetuneModel& model, const std::string& language, Split split,
                          const torch::Device& device, const std::string& predictions_path) = 0;

  // Reads and featurizes `language`'s `split` set now, for evaluate() to reuse; throws naming the
  // file when it is missing or damaged.
  virtual void read(const std::string& language, Split split) = 0;

  // The languages that have a `split` set to evaluate.
  virtual std::vector<std::string> languages(Split split) const = 0;

  // File name of a language's predictions under predictions/<task>/ ("test-de.tsv").
  virtual std::string prediction_file(const std::string& language, Split split) const = 0;
};

// Builds the model to fine-tune for one seed: the pre-trained encoder (fresh copy) plus the head.
using ModelFactory = std::function<FinetuneModel(HeadKind kind, int64_t classes)>;

// What one seed produced.
struct SeedResult {
  int64_t seed = 0;
  int64_t steps = 0;
  int64_t best_step = 0;                                    // step of the kept weights
  double best_dev = 0.0;                                    // its train-language dev score
  std::string precision;                                    // "bf16" (autocast) or "fp32"
  std::map<std::string, std::map<std::string, Scores>> by;  // split -> language -> scores
  // split -> the languages predicted but not scored (their set has no labels)
  std::map<std::string, std::vector<std::string>> unscored;
};

// One seed: reads every evaluation set (a missing or damaged file fails before the first step),
// trains `task` (finetune.* settings), selects, evaluates every language of both splits, and
// writes predictions under `predictions_dir` (empty = none).
SeedResult train_and_evaluate(const config::FinetuneConfig& settings, TrainableTask& task,
                              const ModelFactory& factory, int64_t seed,
                              const torch::Device& device, const std::string& predictions_dir);

// results.json: per split, language and score the mean and std over seeds, each seed's values,
// the task average of the main score with the languages it covers and those of `languages` (the
// evaluated list) it lacks, the subset scored where finetune.max_eval_examples cut a set
// ("subset"), and the resolved config.
std::string results_json(const config::Config& config, const std::vector<SeedResult>& seeds,
                         const std::vector<std::string>& languages);

// The console's section of `split`: one row per language, "de  81.20 ± 0.35" of the main score,
// then the average and what it covers: "average  18.30 ± 0.00 over 2 of 33 languages; no data
// for: af ar ...", `languages` being the evaluated list. Languages predicted without gold are
// named with `unscored_why` ("test: predictions for de en written but not scored: <why>"), also
// when nothing was scored. A set cut by finetune.max_eval_examples says so on its row ("scored
// 300 of 2077 sentences"). Empty when `split` has neither.
std::string results_table(const std::vector<SeedResult>& seeds, Split split,
                          const std::vector<std::string>& languages,
                          const std::string& unscored_why);

// Mean and sample standard deviation (0 for a single value).
std::pair<double, double> mean_std(const std::vector<double>& values);

}  // namespace xlme::finetune
