#include "xlme/finetune/tasks.h"

#include "xlme/common/error.h"
#include "xlme/config/task_registry.h"
#include "xlme/finetune/features.h"
#include "xlme/finetune/metrics.h"
#include "xlme/finetune/pair_io.h"
#include "xlme/finetune/qa_io.h"
#include "xlme/finetune/tagging_io.h"
#include "xlme/finetune/text.h"
#include "xlme/finetune/xtreme_io.h"
#include "xtreme_files.h"

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

// The part of a reader's error before its remedy ("udpos test split for language 'af':
// 'download/udpos/test-af.tsv' does not exist"): what a skipped language lacked.
std::string lacked(const std::string& message) {
  const size_t semicolon = message.find("; ");
  return semicolon == std::string::npos ? message : message.substr(0, semicolon);
}

// Shared by the tasks: which languages have evaluation data, found once per split.
class EvalSets {
 public:
  explicit EvalSets(const config::FinetuneConfig& settings) : settings_(settings) {}

  // Languages of `split` for which `exists(language, missing)` holds; an xlme::Error from it
  // (a reader that finds no file) counts as missing, with its message. A test set of a language
  // named in finetune.languages must exist (the error says which file is missing); other missing
  // sets are skipped (XTREME has no dev set for most languages), each logged at info level with
  // the file it lacked. The answer is kept: the runner asks several times.
  template <class Exists>
  const std::vector<std::string>& available(Split split, const Exists& exists) const {
    auto cached = found_.find(split);
    if (cached != found_.end()) return cached->second;
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
        XLME_FAIL(
            "finetune.languages names {} but its {} data is missing: {}; or drop {} from "
            "finetune.languages",
            language, split_name(split), missing, language);
      } else {
        spdlog::info("{} {} {}: skipped, no data: {}", settings_.task, split_name(split), language,
                     lacked(missing));
      }
    }
    return found_.emplace(split, std::move(out)).first->second;
  }

  // `languages` for `split` whatever the data folder holds, and why, said once (xquad and tydiqa
  // have no dev set; finetune.dev_file names the train language's).
  const std::vector<std::string>& fixed(Split split, std::vector<std::string> languages,
                                        const std::string& why) const {
    auto cached = found_.find(split);
    if (cached != found_.end()) return cached->second;
    spdlog::info("{} {}: {}", settings_.task, split_name(split), why);
    return found_.emplace(split, std::move(languages)).first->second;
  }

 private:
  const config::FinetuneConfig& settings_;
  mutable std::map<Split, std::vector<std::string>> found_;
};

// Logs where a language's evaluation set came from: `files` without a gold folder, or the gold
// `files` alone or checked against XTREME's processed test file.
// `compared` says what was compared with the test file ("" = whole examples; "words" for
// tagging, whose test files hold words only), `note` what else was checked.
void log_source(const config::FinetuneConfig& settings, const std::string& language, Split split,
                size_t count, const std::string& unit, const std::string& files,
                const std::string& test_file, bool gold, const std::string& compared = "",
                const std::string& note = "") {
  const std::string head =
      fmt::format("{} {} {}: {} {}s", settings.task, split_name(split), language, count, unit);
  if (!gold) {
    spdlog::info("{} from {}", head, files);
  } else if (!test_file.empty()) {
    spdlog::info("{} from the gold {}, the same {}as the test file '{}'{}", head, files,
                 compared.empty() ? "" : compared + " ", test_file, note);
  } else {
    spdlog::info(
        "{} from the gold {} alone (finetune.data_dir has no test file of {} to check it "
        "against)",
        head, files, language);
  }
}

// XTREME's processed test file of a language, or "" when there is none (a gold file alone is
// allowed).
template <class Locate>
std::string optional_test_file(const Locate& locate) {
  try {
    return locate();
  } catch (const Error&) {
    return "";
  }
}

std::string quoted_list(const std::vector<std::string>& paths) {
  std::vector<std::string> quoted;
  for (const auto& p : paths) quoted.push_back("'" + p + "'");
  return io::join(quoted, ", ");
}

bool file_exists(const std::string& path) {
  return fs::is_regular_file(path);
}

// A task that trains a head, with what every such task shares: its settings and tokenizer, the
// languages that have evaluation sets, and each evaluation set by (language, split), read and
// featurized once by load() (dev is evaluated every finetune.eval_every steps). A task says how
// to read a set (read_set) and featurize it (featurize).
template <class Example, class Features>
class EvalSetTask : public TrainableTask {
 public:
  HeadKind head_kind() const override { return task_info(settings_.task).head; }

  void read(const std::string& language, Split split) override { load(language, split); }

  std::string prediction_file(const std::string& language, Split split) const override {
    return fmt::format("{}/{}-{}.{}", settings_.task, split_name(split), language, extension_);
  }

 protected:
  struct Set {
    std::vector<Example> examples;  // the first finetune.max_eval_examples
    Features features;
    int64_t total = 0;  // examples in the set before the cut
  };

  // `unit`: what an example is ("pair", "sentence", "question"), in logs and scores;
  // `extension`: of the prediction files.
  EvalSetTask(const config::FinetuneConfig& settings, const data::Tokenizer& tokenizer,
              std::string unit, std::string extension)
      : settings_(settings),
        tokenizer_(tokenizer),
        unit_(std::move(unit)),
        extension_(std::move(extension)) {}

  // The set of `language`'s `split`, read and featurized on the first call; a cut to
  // finetune.max_eval_examples is logged.
  const Set& load(const std::string& language, Split split) {
    const auto key = std::make_pair(language, split);
    auto it = loaded_.find(key);
    if (it != loaded_.end()) return it->second;
    Set set;
    set.examples = read_set(language, split);
    set.total = static_cast<int64_t>(set.examples.size());
    keep_first(set.examples, settings_.max_eval_examples);
    if (static_cast<int64_t>(set.examples.size()) < set.total) {
      spdlog::info("{} {} {}: scored {} of {} {}s (the first; finetune.max_eval_examples)",
                   settings_.task, split_name(split), language, set.examples.size(), set.total,
                   unit_);
    }
    set.features = featurize(set.examples);
    return loaded_.emplace(key, std::move(set)).first->second;
  }

  // `scores` with the examples scored and in `set`.
  Scores with_counts(Scores scores, const Set& set) const {
    scores.scored = static_cast<int64_t>(set.examples.size());
    scores.total = set.total;
    scores.unit = unit_;
    return scores;
  }

  // `language`'s `split` set as its files hold it; logs where it came from.
  virtual std::vector<Example> read_set(const std::string& language, Split split) const = 0;
  virtual Features featurize(const std::vector<Example>& examples) const = 0;

  const config::FinetuneConfig& settings_;
  const data::Tokenizer& tokenizer_;
  EvalSets sets_{settings_};

 private:
  std::string unit_;
  std::string extension_;
  std::map<std::pair<std::string, Split>, Set> loaded_;
};

// ---- Sentence pairs --------------------------------------------------------------------------

class PairTask : public EvalSetTask<PairExample, std::vector<ClassificationFeature>> {
 public:
  PairTask(const config::FinetuneConfig& settings, const data::Tokenizer& tokenizer)
      : EvalSetTask(settings, tokenizer, "pair", "tsv"),
        labels_(task_labels(settings.task)),
        quoting_(parse_tsv_quoting(settings.tsv_quotes)) {
    auto examples = read_pair_split(settings.data_dir, settings.task, "train",
                                    settings.train_language, quoting_);
    keep_first(examples, settings.max_train_examples);
    train_ = featurize_pairs(examples, labels_, tokenizer_, settings.max_len);
  }

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
    const auto& set = load(language, split);
    const auto& [examples, features, total] = set;
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
    return with_counts({{{"accuracy", accuracy(gold, predicted)}}, "accuracy"}, set);
  }

  std::vector<std::string> languages(Split split) const override {
    return sets_.available(split, [&](const std::string& language, std::string& missing) {
      if (split == Split::kTest && !settings_.gold_dir.empty()) {
        const auto path = pair_gold_file(settings_.gold_dir, settings_.task, language);
        missing = fmt::format("'{}' does not exist; {}", path,
                              io::gold_remedy(task_info(settings_.task).gold));
        return file_exists(path);
      }
      pair_file(settings_.data_dir, settings_.task, split_name(split), language);
      return true;
    });
  }

 private:
  static bool has_gold(const std::vector<PairExample>& examples) {
    return !examples.empty() && std::all_of(examples.begin(), examples.end(),
                                            [](const PairExample& e) { return !e.label.empty(); });
  }

  // The two sentences of each pair, as XTREME's preprocessing writes them from the gold (stripped;
  // the test file read with its CSV quoting undone).
  static std::vector<ExampleKey> keys(const std::vector<PairExample>& examples) {
    std::vector<ExampleKey> out;
    for (const auto& e : examples) {
      out.push_back({e.source, {text::strip_ascii(e.text_a), text::strip_ascii(e.text_b)}});
    }
    return out;
  }

  std::vector<PairExample> read_set(const std::string& language, Split split) const override {
    const bool gold = split == Split::kTest && !settings_.gold_dir.empty();
    if (!gold) {
      const auto path = pair_file(settings_.data_dir, settings_.task, split_name(split), language);
      auto examples = read_pair_tsv(path, settings_.task, split_name(split), quoting_);
      log_source(settings_, language, split, examples.size(), "pair", "'" + path + "'", "", false);
      return examples;
    }
    auto examples = read_pair_gold(settings_.gold_dir, settings_.task, language);
    const auto gold_file = pair_gold_file(settings_.gold_dir, settings_.task, language);
    const auto test_file = optional_test_file(
        [&] { return pair_file(settings_.data_dir, settings_.task, "test", language); });
    if (!test_file.empty()) {
      check_test_matches_gold(
          fmt::format("{} test set of {}", settings_.task, language),
          keys(read_pair_tsv(test_file, settings_.task, "test", TsvQuoting::kUnquoted)), test_file,
          keys(examples), "'" + gold_file + "'", "pair", {"sentence1", "sentence2"});
    }
    log_source(settings_, language, split, examples.size(), "pair", "'" + gold_file + "'",
               test_file, true);
    return examples;
  }

  std::vector<ClassificationFeature> featurize(
      const std::vector<PairExample>& examples) const override {
    return featurize_pairs(examples, labels_, tokenizer_, settings_.max_len);
  }

  std::vector<std::string> labels_;
  TsvQuoting quoting_;
  std::vector<ClassificationFeature> train_;
};

// ---- Tagging ---------------------------------------------------------------------------------

class TaggingTask : public EvalSetTask<TaggedSentence, std::vector<TaggingFeature>> {
 public:
  TaggingTask(const config::FinetuneConfig& settings, const data::Tokenizer& tokenizer)
      : EvalSetTask(settings, tokenizer, "sentence", "tsv"), labels_(task_labels(settings.task)) {
    options_.max_len = settings.max_len;
    auto sentences = read_conll_tsv(
        tagging_file(settings.data_dir, settings.task, "train", settings.train_language),
        settings.task);
    keep_first(sentences, settings.max_train_examples);
    train_ = featurize_tagging(sentences, labels_, tokenizer_, options_);
  }

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
    const auto& set = load(language, split);
    const auto& [sentences, features, total] = set;
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
    return with_counts({{{"f1", scores.f1},
                         {"precision", scores.precision},
                         {"recall", scores.recall},
                         {"token_accuracy", scores.accuracy}},
                        "f1"},
                       set);
  }

  std::vector<std::string> languages(Split split) const override {
    return sets_.available(split, [&](const std::string& language, std::string&) {
      if (split == Split::kTest && !settings_.gold_dir.empty()) {
        return !tagging_gold_files(settings_.gold_dir, settings_.task, language).empty();
      }
      tagging_file(settings_.data_dir, settings_.task, split_name(split), language);
      return true;
    });
  }

 private:
  static std::vector<ExampleKey> keys(const std::vector<TaggedSentence>& sentences) {
    std::vector<ExampleKey> out;
    for (const auto& s : sentences) {
      ExampleKey key{s.source, {}};
      for (const auto& w : s.words) key.fields.push_back(text::strip_ascii(w));
      out.push_back(std::move(key));
    }
    return out;
  }

  std::vector<TaggedSentence> read_set(const std::string& language, Split split) const override {
    const bool gold = split == Split::kTest && !settings_.gold_dir.empty();
    if (!gold) {
      const auto path =
          tagging_file(settings_.data_dir, settings_.task, split_name(split), language);
      auto sentences = read_conll_tsv(path, settings_.task);
      log_source(settings_, language, split, sentences.size(), "sentence", "'" + path + "'", "",
                 false);
      return sentences;
    }
    auto sentences = read_tagging_gold(settings_.gold_dir, settings_.task, language);
    const auto gold_files =
        quoted_list(tagging_gold_files(settings_.gold_dir, settings_.task, language));
    const auto test_file = optional_test_file(
        [&] { return tagging_file(settings_.data_dir, settings_.task, "test", language); });
    if (!test_file.empty()) {
      // XTREME's original panx_preprocess kept a token only up to its second ':' ("en:a:b" ->
      // "a"); the later one, as read_panx_raw, keeps "a:b". A test file of either release matches.
      const bool panx = task_info(settings_.task).gold == TaskGold::kPanxRaw;
      const SameValue same = [panx](const std::string& test, const std::string& gold) {
        return test == gold || (panx && test == gold.substr(0, gold.find(':')));
      };
      check_test_matches_gold(fmt::format("{} test set of {}", settings_.task, language),
                              keys(read_conll_tsv(test_file, settings_.task)), test_file,
                              keys(sentences), gold_files, "sentence", {"word"}, same);
    }
    const std::string note = test_file.empty() ? "" : check_release(language);
    log_source(settings_, language, split, sentences.size(), "sentence", gold_files, test_file,
               true, "words", note);
    return sentences;
  }

  std::string check_release(const std::string& language) const {
    if (task_info(settings_.task).gold != TaskGold::kUdRelease) return "";
    const auto dev_file = optional_test_file(
        [&] { return tagging_file(settings_.data_dir, settings_.task, "dev", language); });
    return check_ud_release(settings_.gold_dir, dev_file, language);
  }

  std::vector<TaggingFeature> featurize(
      const std::vector<TaggedSentence>& sentences) const override {
    return featurize_tagging(sentences, labels_, tokenizer_, options_);
  }

  std::vector<std::string> labels_;
  TaggingOptions options_;
  std::vector<TaggingFeature> train_;
};

// ---- Extractive QA ---------------------------------------------------------------------------

class QaTask : public EvalSetTask<QaExample, QaFeatures> {
 public:
  QaTask(const config::FinetuneConfig& settings, const data::Tokenizer& tokenizer)
      : EvalSetTask(settings, tokenizer, "question", "json") {
    options_.max_len = settings.max_len;
    options_.doc_stride = settings.doc_stride;
    options_.max_query_len = settings.max_query_len;
    // XQuAD and MLQA are predicted by a model trained on SQuAD v1.1; TyDiQA by one trained on
    // its English GoldP train set (docs/finetuning.md#fine-tuning-recipe-xtremes-scripts).
    const std::string& train_task = task_info(settings.task).train_data;
    const std::string train_file =
        settings.train_file.empty()
            ? qa_file(settings.data_dir, train_task, "train", settings.train_language)
            : qa_config_file(settings.data_dir, settings.train_file, "finetune.train_file",
                             train_task, "train", settings.train_language);
    spdlog::info("{} train: {}", settings.task, train_file);
    auto data = read_squad_json(train_file, /*skip_mismatched=*/true);
    keep_first(data.examples, settings.max_train_examples);
    auto features = featurize_qa(data.examples, tokenizer_, options_, /*training=*/true);
    spdlog::info("{} train: {} questions ({} skipped: answer not in its context), {} windows",
                 train_task, data.examples.size(),
                 data.skipped + static_cast<int64_t>(features.skipped.size()),
                 features.features.size());
    train_ = std::move(features.features);
  }

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
    const auto& set = load(language, split);
    const auto& [gold, features, total] = set;
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
    return with_counts({{{"f1", scores.f1}, {"exact_match", scores.exact_match}}, "f1"}, set);
  }

  std::vector<std::string> languages(Split split) const override {
    if (split == Split::kDev && !task_info(settings_.task).has_dev) {
      if (settings_.dev_file.empty()) {
        return sets_.fixed(split, {},
                           "none; XTREME has no dev set for this task and keeps the final weights "
                           "(finetune.dev_file names a file to select on)");
      }
      return sets_.fixed(split, {settings_.train_language},
                         fmt::format("{} from finetune.dev_file '{}'", settings_.train_language,
                                     path(settings_.train_language, split)));
    }
    return sets_.available(split, [&](const std::string& language, std::string&) {
      return file_exists(path(language, split));
    });
  }

 private:
  std::string path(const std::string& language, Split split) const {
    if (split == Split::kDev && language == settings_.train_language &&
        !settings_.dev_file.empty()) {
      const auto& info = task_info(settings_.task);
      return qa_config_file(settings_.data_dir, settings_.dev_file, "finetune.dev_file",
                            info.has_dev ? settings_.task : "", "dev", language);
    }
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

  static std::vector<ExampleKey> keys(const std::vector<QaExample>& examples) {
    std::vector<ExampleKey> out;
    for (const auto& e : examples) out.push_back({e.source, {e.id, e.question, e.context}});
    return out;
  }

  std::vector<QaExample> read_set(const std::string& language, Split split) const override {
    const auto file = path(language, split);
    auto examples = read_squad_json(file, /*skip_mismatched=*/false).examples;
    const bool gold = split == Split::kTest && !settings_.gold_dir.empty();
    std::string test_file;
    if (gold) {
      // XTREME's answer-stripped copy makes each question its own paragraph, in the gold's order.
      test_file = optional_test_file(
          [&] { return qa_file(settings_.data_dir, settings_.task, "test", language); });
      if (!test_file.empty()) {
        check_test_matches_gold(
            fmt::format("{} test set of {}", settings_.task, language),
            keys(read_squad_json(test_file, /*skip_mismatched=*/false).examples), test_file,
            keys(examples), "'" + file + "'", "question", {"id", "question", "context"});
      }
    }
    log_source(settings_, language, split, examples.size(), "question", "'" + file + "'", test_file,
               gold);
    return examples;
  }

  QaFeatures featurize(const std::vector<QaExample>& examples) const override {
    return featurize_qa(examples, tokenizer_, options_, /*training=*/false);
  }

  QaOptions options_;
  std::vector<QaFeature> train_;
};

}  // namespace

std::vector<std::string> evaluated_languages(const config::FinetuneConfig& settings) {
  return settings.languages.empty() ? task_languages(settings.task) : settings.languages;
}

std::unique_ptr<TrainableTask> make_task(const config::FinetuneConfig& settings,
                                         const data::Tokenizer& tokenizer) {
  const auto family = task_info(settings.task).family;
  XLME_CHECK(
      family == TaskFamily::kQa || (settings.train_file.empty() && settings.dev_file.empty()),
      "finetune.train_file and finetune.dev_file name the SQuAD-format files of a QA task "
      "(xquad, mlqa, tydiqa); {} reads XTREME's {}/{{train,dev}}-<lang>.tsv under "
      "finetune.data_dir: leave them empty",
      settings.task, settings.task);
  switch (family) {
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
