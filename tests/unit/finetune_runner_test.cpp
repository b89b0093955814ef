// Fine-tuning mechanics: layer-wise learning-rate groups, the train/select/evaluate loop on a
// synthetic task, and the results file.
#include "xlme/finetune/runner.h"

#include "xlme/common/io.h"

#include "test_util.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <set>
#include <sstream>

namespace xlme::finetune {
namespace {

using xlme::testing::contains_all;
using xlme::testing::TempDir;

config::ModelArgs tiny_encoder_options() {
  config::ModelArgs o;
  o.vocab_size = 16;
  o.max_positions = 16;
  o.embedding_size = 16;
  o.hidden_size = 16;
  o.layers = 2;
  o.heads = 2;
  o.ffn_size = 32;
  o.dropout = 0.0;
  o.attention_dropout = 0.0;
  o.relative_position.num_buckets = 8;
  o.relative_position.max_distance = 16;
  return o;
}

FinetuneModel tiny_model(HeadKind kind, int64_t classes) {
  const auto o = tiny_encoder_options();
  model::SharedEmbeddings embeddings(o);
  model::Encoder encoder(o, embeddings, std::make_shared<model::BucketCache>(8, 16));
  return FinetuneModel(embeddings, encoder, kind, classes, /*dropout=*/0.0);
}

TEST(FinetuneModel, ParameterDepthFollowsTheLayers) {
  EXPECT_EQ(parameter_depth("embeddings.token.weight", 12), 0);
  EXPECT_EQ(parameter_depth("discriminator.embedding_norm.weight", 12), 0);
  EXPECT_EQ(parameter_depth("discriminator.layers.0.attention.query.weight", 12), 1);
  EXPECT_EQ(parameter_depth("discriminator.layers.11.ffn.output.bias", 12), 12);
  EXPECT_EQ(parameter_depth("discriminator.final_norm.weight", 12), 13);
  EXPECT_EQ(parameter_depth("head.output.weight", 12), 13);
}

TEST(FinetuneModel, LayerwiseDecayScalesEachGroupsLearningRate) {
  auto model = tiny_model(HeadKind::kSequence, 3);
  std::vector<double> scales;
  auto optimizer =
      make_finetune_adamw(*model, 2, model::LayerSharing::kNone, 1e-3, 0.5, 0.01, scales);
  set_group_learning_rates(*optimizer, 1e-3, scales);
  // Each parameter's learning rate is 1e-3 * 0.5^(3 - depth); decay only on matrices.
  std::map<const void*, std::pair<double, double>> by_tensor;  // lr, weight decay
  for (auto& group : optimizer->param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) by_tensor[p.unsafeGetTensorImpl()] = {o.lr(), o.weight_decay()};
  }
  int64_t checked = 0;
  for (const auto& item : model->named_parameters()) {
    const auto [lr, decay] = by_tensor.at(item.value().unsafeGetTensorImpl());
    const double expected = 1e-3 * std::pow(0.5, 3 - parameter_depth(item.key(), 2));
    EXPECT_NEAR(lr, expected, 1e-15) << item.key();
    EXPECT_EQ(decay, item.value().dim() >= 2 ? 0.01 : 0.0) << item.key();
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int64_t>(by_tensor.size()));
}

TEST(FinetuneModel, HeadsHaveTheirShapes) {
  auto ids = torch::randint(4, 16, {3, 7});
  auto positions = torch::arange(7).repeat({3, 1});
  auto padding = torch::zeros({3, 7}, torch::kBool);
  EXPECT_EQ(tiny_model(HeadKind::kSequence, 3)->forward(ids, positions, padding).sizes(),
            (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(tiny_model(HeadKind::kToken, 5)->forward(ids, positions, padding).sizes(),
            (std::vector<int64_t>{3, 7, 5}));
}

// Label 1 iff token 5 occurs in the sequence: learnable by attention, not by a constant.
class ContainsTokenTask : public TrainableTask {
 public:
  ContainsTokenTask() {
    torch::manual_seed(3);
    for (auto* set : {&train_, &dev_}) {
      set->ids = torch::randint(6, 16, {64, 8});
      auto label = torch::rand({64}) < 0.5;
      auto where = torch::randint(1, 8, {64});
      for (int64_t i = 0; i < 64; ++i) {
        if (label[i].item<bool>()) set->ids[i][where[i].item<int64_t>()] = 5;
      }
      set->ids.select(1, 0).fill_(0);
      set->labels = label.to(torch::kInt64);
    }
  }
  HeadKind head_kind() const override { return HeadKind::kSequence; }
  int64_t classes() const override { return 2; }
  int64_t train_size() const override { return 64; }
  torch::Tensor loss(FinetuneModel& model, const std::vector<int64_t>& indices,
                     const torch::Device&) override {
    auto index = torch::tensor(indices);
    auto logits = run(model, train_.ids.index_select(0, index));
    training_dtypes.insert(logits.scalar_type());
    return torch::cross_entropy_loss(logits, train_.labels.index_select(0, index));
  }
  Scores evaluate(FinetuneModel& model, const std::string& language, Split split,
                  const torch::Device&, const std::string& predictions_path) override {
    const auto& set = split == Split::kDev && language == "en" ? dev_ : train_;
    auto logits = run(model, set.ids);
    evaluation_dtypes.insert(logits.scalar_type());
    auto predicted = logits.argmax(1);
    if (!predictions_path.empty()) {
      write_file_atomic(predictions_path, std::to_string(predicted.sum().item<int64_t>()) + "\n");
    }
    ++evaluations;
    return {
        {{"accuracy", 100.0 * predicted.eq(set.labels).to(torch::kDouble).mean().item<double>()},
         {"positives", predicted.sum().item<double>()}},
        "accuracy"};
  }
  void read(const std::string&, Split) override {}
  std::vector<std::string> languages(Split split) const override {
    return split == Split::kDev ? std::vector<std::string>{"en"}
                                : std::vector<std::string>{"de", "en"};
  }
  std::string prediction_file(const std::string& language, Split split) const override {
    return std::string(split_name(split)) + "-" + language + ".tsv";
  }
  int64_t evaluations = 0;
  std::set<torch::ScalarType> training_dtypes, evaluation_dtypes;  // of the logits seen

 private:
  struct Set {
    torch::Tensor ids, labels;
  };
  static torch::Tensor run(FinetuneModel& model, const torch::Tensor& ids) {
    return model->forward(ids, torch::arange(ids.size(1)).repeat({ids.size(0), 1}),
                          torch::zeros(ids.sizes(), torch::kBool));
  }
  Set train_, dev_;
};

config::FinetuneConfig synthetic_settings() {
  config::FinetuneConfig s;
  s.task = "xnli";
  s.batch_size = 16;
  s.epochs = 30;
  s.lr = 3e-3;
  s.warmup_ratio = 0.1;
  s.eval_every = 20;
  return s;
}

TEST(FinetuneRunner, TrainingAccuracyRisesAndBestDevIsKept) {
  ContainsTokenTask task;
  const auto settings = synthetic_settings();
  torch::manual_seed(1);
  auto untrained = tiny_model(HeadKind::kSequence, 2);
  const double before = task.evaluate(untrained, "de", Split::kTest, torch::kCPU, "").main_value();
  TempDir dir;
  auto result =
      train_and_evaluate(settings, task, tiny_model, /*seed=*/1, torch::kCPU, dir.path().string());
  EXPECT_EQ(result.steps, 120);  // 4 batches per epoch x 30 epochs
  const double after = result.by.at("test").at("de").main_value();  // the training set
  EXPECT_GT(after, 90.0) << "before " << before;
  EXPECT_GT(after, before + 20.0);
  // Dev checked at 20, 40, ..., 120; the kept step is one of them and its dev score is reported.
  EXPECT_EQ(result.best_step % 20, 0);
  EXPECT_DOUBLE_EQ(result.best_dev, result.by.at("dev").at("en").main_value());
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "test-de.tsv"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "dev-en.tsv"));
}

TEST(FinetuneRunner, SelectLastKeepsTheFinalWeightsAndMaxStepsStops) {
  ContainsTokenTask task;
  auto settings = synthetic_settings();
  settings.select = "last";
  settings.max_steps = 10;
  auto result = train_and_evaluate(settings, task, tiny_model, 2, torch::kCPU, "");
  EXPECT_EQ(result.steps, 10);
  EXPECT_EQ(result.best_step, 10);
}

// A recipe's warmup_steps (QA: 500) longer than a short run: as in XTREME's schedule the warm-up
// is not cut, so the whole run is warm-up; the warning says so with the numbers and the last
// step's rate (2 / 500 of lr). A warm-up that ends within the run says nothing.
TEST(FinetuneRunner, WarmupLongerThanTheRunIsAWarningWithBothNumbers) {
  ContainsTokenTask task;
  auto settings = synthetic_settings();
  settings.select = "last";
  settings.max_steps = 3;
  settings.warmup_steps = 500;
  settings.lr = 1e-3;
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  train_and_evaluate(settings, task, tiny_model, 2, torch::kCPU, "");
  settings.warmup_steps = 2;
  const auto long_warmup = log.str();
  train_and_evaluate(settings, task, tiny_model, 2, torch::kCPU, "");
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_TRUE(contains_all(long_warmup, {"[warning]",
                                         "the warm-up (500 steps, finetune.warmup_steps 500) is "
                                         "not shorter than the run (3 steps)",
                                         "never reaches finetune.lr (0.001); the last step runs "
                                         "at 4e-06",
                                         "step 3/3 lr 4e-06"}))
      << long_warmup;
  EXPECT_EQ(log.str().find("not shorter than the run", long_warmup.size()), std::string::npos);
}

TEST(FinetuneRunner, SameSeedSameResult) {
  ContainsTokenTask task;
  auto settings = synthetic_settings();
  settings.max_steps = 8;
  settings.select = "last";
  auto a = train_and_evaluate(settings, task, tiny_model, 5, torch::kCPU, "");
  auto b = train_and_evaluate(settings, task, tiny_model, 5, torch::kCPU, "");
  EXPECT_EQ(a.by.at("dev").at("en").values, b.by.at("dev").at("en").values);
  EXPECT_EQ(a.by.at("test").at("de").values, b.by.at("test").at("de").values);
}

// finetune.precision follows train.precision: auto is fp32 on the CPU (bf16 autocast on CUDA);
// bf16 runs the forward passes under autocast, which changes the result.
TEST(FinetuneRunner, PrecisionBf16RunsUnderAutocast) {
  auto settings = synthetic_settings();
  settings.max_steps = 4;
  settings.select = "last";
  ContainsTokenTask fp32_task;
  const auto fp32 = train_and_evaluate(settings, fp32_task, tiny_model, 5, torch::kCPU, "");
  EXPECT_EQ(fp32.precision, "fp32");
  EXPECT_EQ(fp32_task.training_dtypes, std::set<torch::ScalarType>{torch::kFloat});
  settings.precision = "bf16";
  ContainsTokenTask bf16_task;
  const auto bf16 = train_and_evaluate(settings, bf16_task, tiny_model, 5, torch::kCPU, "");
  EXPECT_EQ(bf16.precision, "bf16");
  EXPECT_EQ(bf16_task.training_dtypes, std::set<torch::ScalarType>{torch::kBFloat16});
  EXPECT_EQ(bf16_task.evaluation_dtypes, std::set<torch::ScalarType>{torch::kBFloat16});
}

TEST(FinetuneResults, MeanStdAndJson) {
  auto [mean, std] = mean_std({1.0, 2.0, 3.0, 4.0});
  EXPECT_DOUBLE_EQ(mean, 2.5);
  EXPECT_NEAR(std, std::sqrt(5.0 / 3.0), 1e-12);  // sample standard deviation
  EXPECT_EQ(mean_std({7.0}).second, 0.0);

  std::vector<SeedResult> seeds(2);
  seeds[0].seed = 1;
  seeds[1].seed = 2;
  seeds[0].by["test"]["de"] = {{{"accuracy", 80.0}}, "accuracy"};
  seeds[0].by["test"]["fr"] = {{{"accuracy", 70.0}}, "accuracy"};
  seeds[1].by["test"]["de"] = {{{"accuracy", 84.0}}, "accuracy"};
  seeds[1].by["test"]["fr"] = {{{"accuracy", 74.0}}, "accuracy"};
  config::Config config;
  seeds[0].unscored["test"] = seeds[1].unscored["test"] = {"ru"};
  auto json = nlohmann::json::parse(results_json(config, seeds, {"de", "en", "fr", "ru"}));
  EXPECT_EQ(json["seeds"], nlohmann::json::parse("[1, 2]"));
  EXPECT_DOUBLE_EQ(json["test"]["languages"]["de"]["accuracy"]["mean"].get<double>(), 82.0);
  EXPECT_NEAR(json["test"]["languages"]["de"]["accuracy"]["std"].get<double>(), std::sqrt(8.0),
              1e-12);
  // Average over languages per seed (75, 79), then over seeds.
  EXPECT_DOUBLE_EQ(json["test"]["average"]["mean"].get<double>(), 77.0);
  EXPECT_EQ(json["test"]["main"], "accuracy");
  EXPECT_FALSE(json.contains("dev"));
  // The average says what it covers: 2 of the 4 evaluated languages; en had no data, ru was
  // predicted without gold.
  EXPECT_EQ(json["test"]["average"]["covers"], nlohmann::json::parse(R"(["de", "fr"])"));
  EXPECT_EQ(json["test"]["average"]["lacks"], nlohmann::json::parse(R"(["en", "ru"])"));
  EXPECT_EQ(json["test"]["average"]["of"], 4);
  EXPECT_FALSE(json["test"].contains("subset"));
  const auto table = results_table(seeds, Split::kTest, {"de", "en", "fr", "ru"}, "no gold here");
  EXPECT_TRUE(
      contains_all(table, {"de", "82.00 ± 2.83",
                           "average    77.00 ± 2.83 over 2 of 4 languages; no data for: en; "
                           "not scored: ru",
                           "test: predictions for ru written but not scored: no gold here"}))
      << table;
  // finetune.max_eval_examples cut de's set: the row, the average and results.json say so.
  for (auto& seed : seeds) {
    auto& de = seed.by["test"]["de"];
    de.scored = 300, de.total = 2077, de.unit = "sentence";
    auto& fr = seed.by["test"]["fr"];
    fr.scored = fr.total = 150, fr.unit = "sentence";
  }
  config.finetune.max_eval_examples = 300;
  json = nlohmann::json::parse(results_json(config, seeds, {"de", "en", "fr", "ru"}));
  EXPECT_EQ(json["test"]["subset"],
            nlohmann::json::parse(R"({"max_eval_examples": 300, "languages": {"de": {"scored": 300,
                "of": 2077, "unit": "sentence"}}})"))
      << json["test"].dump();
  const auto cut = results_table(seeds, Split::kTest, {"de", "en", "fr", "ru"}, "no gold here");
  EXPECT_TRUE(contains_all(cut, {"82.00 ± 2.83 (scored 300 of 2077 sentences)\n", "72.00 ± 2.83\n",
                                 "not scored: ru; on subsets (finetune.max_eval_examples), not "
                                 "comparable to full-set scores"}))
      << cut;
  // Nothing scored: the section still says what was predicted and why it was not scored.
  seeds[0].by.clear();
  EXPECT_EQ(results_table(seeds, Split::kTest, {"ru"}, "no gold here"),
            "test: predictions for ru written but not scored: no gold here\n");
  EXPECT_EQ(results_table(seeds, Split::kDev, {"ru"}, "x"), "");
}

}  // namespace
}  // namespace xlme::finetune
