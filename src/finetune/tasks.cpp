#include "xlme/finetune/tasks.h"

#include "xlme/common/error.h"
#include "xlme/finetune/features.h"
#include "xlme/finetune/metrics.h"
#include "xlme/finetune/pair_io.h"
#include "xlme/finetune/qa_io.h"
#include "xlme/finetune/tagging_io.h"
#include "xlme/finetune/task_registry.h"
#include "xlme/finetune/xtreme_io.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

namespace xlme::finetune {

namespace fs = std::filesystem;

namespace {

template <class T>
void keep_first(std::vector<T>& items, int64_t limit) {
  if (limit > 0 && static_cast<int64_t>(items.size()) > limit) {
    items.resize(static_cast<size_t>(limit));
  }
}

// The row-by-row evaluation batches of `count` features.
std::vector<std::vector<int64_t>> eval_batches(int64_t count, int64_t batch_size) {
  std::vector<std::vector<int64_t>> batches;
  for (int64_t first = 0; first < count; first += batch_size) {
    std::vector<int64_t> batch;
    for (int64_t i = first; i < std::min(count, first + batch_size); ++i) batch.push_back(i);
    batches.push_back(std::move(batch));
  }
  return batches;
}

torch::Tensor run_model(FinetuneModel& model, const PaddedBatch& batch,
                        const torch::Device& device) {
  return model->forward_host(batch.input_ids, batch.positions, batch.padding, device);
}

// Shared by the tasks: where each language's evaluation data is and whether it exists.
class EvalSets {
 public:
  explicit EvalSets(const config::FinetuneConfig& settings) : settings_(settings) {}

  // Languages of `split` for which `exists(language, missing)` holds; an xlme::Error from it
  // (a reader that finds no file) counts as missing, with its message. A test set of a language
  // named in finetune.languages must exist (the error says which file is missing); other missing
  // sets are skipped (XTREME has no dev set for some tasks and languages).
  template <class Exists>
  std::vector<std::string> available(Split split, const Exists& exists) const {
    std::vector<std::string> out;
    for (const auto& language : evaluated_languages(settings_)) {
      std::string missing;
      bool found = false;
      try {
        found = exists(language, missing);
      } catch (const Error& e) {
        missing = e.what();
      }
      if (found) {
        out.push_back(language);
      } else if (!settings_.languages.empty() && split == Split::kTest) {
        XLME_FAIL("finetune.languages names {} but its {} data is missing: {}", language,
                  split_name(split), missing);
      } else {
        spdlog::debug("{} {} {}: no data ({}), skipped", settings_.task, split_name(split),
                      language, missing);
      }
    }
    return out;
  }

 private:
  const config::FinetuneConfig& settings_;
};

bool file_exists(const std::string& path) {
  return fs::is_regular_file(path);
}

// Evaluation sets by (language, split), read and featurized once: dev is evaluated every
// finetune.eval_every steps.
template <class Example, class Features>
class EvalCache {
 public:
  struct Set {
    std::vector<Example> examples;  // the first finetune.max_eval_examples
    Features features;
  };

  template <class Read, class Featurize>
  const Set& get(const std::string& language, Split split, int64_t max_examples, const Read& read,
                 const Featurize& featurize) {
    const auto key = std::make_pair(language, split);
    auto it = sets_.find(key);
    if (it != sets_.end()) return it->second;
    Set set;
    set.examples = read();
    keep_first(set.examples, max_examples);
    set.features = featurize(set.examples);
    return sets_.emplace(key, std::move(set)).first->second;
  }

 private:
  std::map<std::pair<std::string, Split>, Set> sets_;
};

// ---- Sentence pairs --------------------------------------------------------------------------

class PairTask : public TrainableTask {
 public:
  PairTask(const config::FinetuneConfig& settings, const data::Tokenizer& tokenizer)
      : settings_(settings),
        tokenizer_(tokenizer),
        labels_(task_labels(settings.task)),
        quoting_(parse_tsv_quoting(settings.tsv_quotes)) {
    auto examples = read_pair_split(settings.data_dir, settings.task, "train",
                                    settings.train_language, quoting_);
    keep_first(examples, settings.max_train_examples);
    train_ = featurize_pairs(examples, labels_, tokenizer_, settings.max_len);
  }

  HeadKind head_kind() const override { return task_info(settings_.task).head; }
  int64_t classes() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }

  torch::Tensor loss(FinetuneModel& model, const std::vector<int64_t>& indices,
                     const torch::Device& device) override {
    auto batch = collate(train_, indices, tokenizer_.special_ids().pad);
    return torch::nn::functional::cross_entropy(run_model(model, batch, device),
                                                batch.labels.to(device));
  }

  Scores evaluate(FinetuneModel& model, const std::string& language, Split split,
                  const torch::Device& device, const std::string& predictions_path) override {
    const auto& [examples, features] = load(language, split);
    std::vector<std::string> predicted, gold;
    for (const auto& indices :
         eval_batches(static_cast<int64_t>(features.size()), settings_.eval_batch_size)) {
      auto batch = collate(features, indices, tokenizer_.special_ids().pad);
      auto best = run_model(model, batch, device).argmax(1).cpu().contiguous();  // [B]
      const int64_t* ids = best.data_ptr<int64_t>();
      for (size_t i = 0; i < indices.size(); ++i) {
        predicted.push_back(labels_.at(static_cast<size_t>(ids[i])));
      }
    }
    if (!predictions_path.empty()) write_label_predictions(predictions_path, predicted);
    for (const auto& e : examples) gold.push_back(e.label);
    if (!has_gold(examples)) return {};
    return {{{"accuracy", accuracy(gold, predicted)}}, "accuracy"};
  }

  void read(const std::string& language, Split split) override { load(language, split); }

  std::vector<std::string> languages(Split split) const override {
    return EvalSets(settings_).available(
        split, [&](const std::string& language, std::string& missing) {
          if (split == Split::kTest && !settings_.gold_dir.empty()) {
            missing = pair_gold_file(settings_.gold_dir, settings_.task, language);
            return file_exists(missing);
          }
          missing = pair_file(settings_.data_dir, settings_.task, split_name(split), language);
          return true;
        });
  }

  std::string prediction_file(const std::string& language, Split split) const override {
    return fmt::format("{}/{}-{}.tsv", settings_.task, split_name(split), language);
  }

 private:
  static bool has_gold(const std::vector<PairExample>& examples) {
    return !examples.empty() && std::all_of(examples.begin(), examples.end(),
                                            [](const PairExample& e) { return !e.label.empty(); });
  }

  using Cache = EvalCache<PairExample, std::vector<ClassificationFeature>>;

  const Cache::Set& load(const std::string& language, Split split) {
    auto read = [&] {
      if (split == Split::kTest && !settings_.gold_dir.empty()) {
        return read_pair_gold(settings_.gold_dir, settings_.task, language);
      }
      return read_pair_split(settings_.data_dir, settings_.task, split_name(split), language,
                             quoting_);
    };
    return cache_.get(language, split, settings_.max_eval_examples, read, [&](const auto& e) {
      return featurize_pairs(e, labels_, tokenizer_, settings_.max_len);
    });
  }

  const config::FinetuneConfig& settings_;
  const data::Tokenizer& tokenizer_;
  std::vector<std::string> labels_;
  TsvQuoting quoting_;
  std::vector<ClassificationFeature> train_;
  Cache cache_;
};

// ---- Tagging ---------------------------------------------------------------------------------

class TaggingTask : public TrainableTask {
 public:
  TaggingTask(const config::FinetuneConfig& settings, const data::Tokenizer& tokenizer)
      : settings_(settings), tokenizer_(tokenizer), labels_(task_labels(settings.task)) {
    options_.max_len = settings.max_len;
    auto sentences = read_conll_tsv(
        tagging_file(settings.data_dir, settings.task, "train", settings.train_language),
        settings.task);
    keep_first(sentences, settings.max_train_examples);
    train_ = featurize_tagging(sentences, labels_, tokenizer_, options_);
  }

  HeadKind head_kind() const override { return task_info(settings_.task).head; }
  int64_t classes() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }

  torch::Tensor loss(FinetuneModel& model, const std::vector<int64_t>& indices,
                     const torch::Device& device) override {
    auto batch = collate(train_, indices, tokenizer_.special_ids().pad);
    auto logits = run_model(model, batch, device);  // [B, T, C]
    return torch::nn::functional::cross_entropy(
        logits.flatten(0, 1), batch.labels.to(device).flatten(),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreLabel));
  }

  Scores evaluate(FinetuneModel& model, const std::string& language, Split split,
                  const torch::Device& device, const std::string& predictions_path) override {
    const auto& [sentences, features] = load(language, split);
    std::vector<std::vector<int64_t>> per_token(features.size());
    for (const auto& indices :
         eval_batches(static_cast<int64_t>(features.size()), settings_.eval_batch_size)) {
      auto batch = collate(features, indices, tokenizer_.special_ids().pad);
      auto best = run_model(model, batch, device).argmax(2).cpu().contiguous();  // [B, T]
      for (size_t i = 0; i < indices.size(); ++i) {
        auto row = best[static_cast<int64_t>(i)];
        per_token[static_cast<size_t>(indices[i])] =
            std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.size(0));
      }
    }
    const auto ids = stitch_tags(features, per_token, sentences);
    std::vector<std::vector<std::string>> predicted, gold;
    bool tagged = !sentences.empty();
    for (size_t s = 0; s < sentences.size(); ++s) {
      std::vector<std::string> tags;
      for (int64_t id : ids[s]) tags.push_back(labels_.at(static_cast<size_t>(id)));
      predicted.push_back(std::move(tags));
      gold.push_back(sentences[s].tags);
      tagged = tagged && !sentences[s].tags.empty();
    }
    if (!predictions_path.empty()) write_tag_predictions(predictions_path, predicted);
    if (!tagged) return {};
    const auto scores = seqeval_scores(gold, predicted);
    return {{{"f1", scores.f1},
             {"precision", scores.precision},
             {"recall", scores.recall},
             {"token_accuracy", scores.accuracy}},
            "f1"};
  }

  void read(const std::string& language, Split split) override { load(language, split); }

  std::vector<std::string> languages(Split split) const override {
    return EvalSets(settings_).available(
        split, [&](const std::string& language, std::string& missing) {
          if (split == Split::kTest && !settings_.gold_dir.empty()) {
            missing = settings_.gold_dir;
            return !tagging_gold_files(settings_.gold_dir, settings_.task, language).empty();
          }
          missing = tagging_file(settings_.data_dir, settings_.task, split_name(split), language);
          return true;
        });
  }

  std::string prediction_file(const std::string& language, Split split) const override {
    return fmt::format("{}/{}-{}.tsv", settings_.task, split_name(split), language);
  }

 private:
  using Cache = EvalCache<TaggedSentence, std::vector<TaggingFeature>>;

  const Cache::Set& load(const std::string& language, Split split) {
    auto read = [&] {
      if (split != Split::kTest || settings_.gold_dir.empty()) {
        return read_conll_tsv(
            tagging_file(settings_.data_dir, settings_.task, split_name(split), language),
            settings_.task);
      }
      return read_tagging_gold(settings_.gold_dir, settings_.task, language);
    };
    return cache_.get(language, split, settings_.max_eval_examples, read, [&](const auto& e) {
      return featurize_tagging(e, labels_, tokenizer_, options_);
    });
  }

  const config::FinetuneConfig& settings_;
  const data::Tokenizer& tokenizer_;
  std::vector<std::string> labels_;
  TaggingOptions options_;
  std::vector<TaggingFeature> train_;
  Cache cache_;
};

// ---- Extractive QA ---------------------------------------------------------------------------

class QaTask : public TrainableTask {
 public:
  QaTask(const config::FinetuneConfig& settings, const data::Tokenizer& tokenizer)
      : settings_(settings), tokenizer_(tokenizer) {
    options_.max_len = settings.max_len;
    options_.doc_stride = settings.doc_stride;
    options_.max_query_len = settings.max_query_len;
    // XQuAD and MLQA are predicted by a model trained on SQuAD v1.1; TyDiQA by one trained on
    // its English GoldP train set (docs/finetuning.md#fine-tuning-recipe-xtremes-scripts).
    const std::string& train_task = task_info(settings.task).train_data;
    auto data =
        read_squad_json(qa_file(settings.data_dir, train_task, "train", settings.train_language),
                        /*skip_mismatched=*/true);
    keep_first(data.examples, settings.max_train_examples);
    auto features = featurize_qa(data.examples, tokenizer_, options_, /*training=*/true);
    spdlog::info("{} train: {} questions ({} skipped: answer not in its context), {} windows",
                 train_task, data.examples.size(),
                 data.skipped + static_cast<int64_t>(features.skipped.size()),
                 features.features.size());
    train_ = std::move(features.features);
  }

  HeadKind head_kind() const override { return task_info(settings_.task).head; }
  int64_t classes() const override { return 2; }
  int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }

  torch::Tensor loss(FinetuneModel& model, const std::vector<int64_t>& indices,
                     const torch::Device& device) override {
    auto batch = collate(train_, indices, tokenizer_.special_ids().pad);
    auto logits = run_model(model, batch, device);  // [B, T, 2]
    auto targets = batch.labels.to(device);         // [B, 2]: start, end
    // The mean of the start and end cross-entropies, as BertForQuestionAnswering.
    return (torch::nn::functional::cross_entropy(logits.select(2, 0), targets.select(1, 0)) +
            torch::nn::functional::cross_entropy(logits.select(2, 1), targets.select(1, 1))) /
           2.0;
  }

  Scores evaluate(FinetuneModel& model, const std::string& language, Split split,
                  const torch::Device& device, const std::string& predictions_path) override {
    const auto& [gold, features] = load(language, split);
    std::vector<QaLogits> logits(features.features.size());
    for (const auto& indices :
         eval_batches(static_cast<int64_t>(features.features.size()), settings_.eval_batch_size)) {
      auto batch = collate(features.features, indices, tokenizer_.special_ids().pad);
      auto out = run_model(model, batch, device).to(torch::kFloat).cpu().contiguous();
      for (size_t i = 0; i < indices.size(); ++i) {
        auto row = out[static_cast<int64_t>(i)];  // [T, 2]
        auto start = row.select(1, 0).contiguous(), end = row.select(1, 1).contiguous();
        auto& l = logits[static_cast<size_t>(indices[i])];
        l.start.assign(start.data_ptr<float>(), start.data_ptr<float>() + start.size(0));
        l.end.assign(end.data_ptr<float>(), end.data_ptr<float>() + end.size(0));
      }
    }
    QaDecodeOptions decode;
    decode.n_best = settings_.n_best;
    decode.max_answer_len = settings_.max_answer_len;
    auto decoded = decode_qa(gold, features, logits, tokenizer_, decode);
    if (!predictions_path.empty()) write_qa_predictions(predictions_path, decoded.text);
    const bool answered = std::any_of(gold.begin(), gold.end(), [](const QaExample& e) {
      return std::any_of(e.answers.begin(), e.answers.end(),
                         [](const QaAnswer& a) { return !a.text.empty(); });
    });
    if (!answered) return {};
    // MLQA normalizes answers by their language; SQuAD's English rules serve the others.
    const bool by_language = task_info(settings_.task).metric == TaskMetric::kMlqaF1;
    const auto scores = qa_scores(gold, decoded.text, by_language ? language : std::string());
    return {{{"f1", scores.f1}, {"exact_match", scores.exact_match}}, "f1"};
  }

  void read(const std::string& language, Split split) override { load(language, split); }

  std::vector<std::string> languages(Split split) const override {
    return EvalSets(settings_).available(split,
                                         [&](const std::string& language, std::string& missing) {
                                           missing = path(language, split);
                                           return file_exists(missing);
                                         });
  }

  std::string prediction_file(const std::string& language, Split split) const override {
    return fmt::format("{}/{}-{}.json", settings_.task, split_name(split), language);
  }

 private:
  std::string path(const std::string& language, Split split) const {
    // XQuAD and TyDiQA have no dev set in XTREME (their models are not selected on one).
    if (split == Split::kDev && !task_info(settings_.task).has_dev) {
      XLME_FAIL("{} has no dev set in XTREME", settings_.task);
    }
    // With a gold folder the answer-stripped copy under data_dir is not needed.
    if (split == Split::kTest && !settings_.gold_dir.empty()) {
      return qa_gold_file(settings_.gold_dir, settings_.task, split_name(split), language);
    }
    return qa_file(settings_.data_dir, settings_.task, split_name(split), language);
  }

  using Cache = EvalCache<QaExample, QaFeatures>;

  const Cache::Set& load(const std::string& language, Split split) {
    auto read = [&] {
      return read_squad_json(path(language, split), /*skip_mismatched=*/false).examples;
    };
    return cache_.get(language, split, settings_.max_eval_examples, read, [&](const auto& e) {
      return featurize_qa(e, tokenizer_, options_, /*training=*/false);
    });
  }

  const config::FinetuneConfig& settings_;
  const data::Tokenizer& tokenizer_;
  QaOptions options_;
  std::vector<QaFeature> train_;
  Cache cache_;
};

}  // namespace

std::vector<std::string> evaluated_languages(const config::FinetuneConfig& settings) {
  return settings.languages.empty() ? task_languages(settings.task) : settings.languages;
}

std::unique_ptr<TrainableTask> make_task(const config::FinetuneConfig& settings,
                                         const data::Tokenizer& tokenizer) {
  switch (task_info(settings.task).family) {
    case TaskFamily::kSentencePair:
      return std::make_unique<PairTask>(settings, tokenizer);
    case TaskFamily::kTagging:
      return std::make_unique<TaggingTask>(settings, tokenizer);
    case TaskFamily::kQa:
      return std::make_unique<QaTask>(settings, tokenizer);
    case TaskFamily::kRetrieval:
    case TaskFamily::kAlignment:
      break;
  }
  XLME_FAIL("finetune.task {} trains no head; it is evaluated by the retrieval/alignment runner",
            settings.task);
}

}  // namespace xlme::finetune
