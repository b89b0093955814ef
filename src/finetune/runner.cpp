#include "xlme/finetune/runner.h"

#include "xlme/checkpoint/weights.h"
#include "xlme/common/error.h"
#include "xlme/common/precision.h"
#include "xlme/finetune/xtreme_io.h"
#include "xlme/optim/optimizer.h"
#include "xlme/optim/transformers_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

namespace xlme::finetune {

namespace {

// Parameters and buffers by name, copied to the host: the weights kept by model selection.
std::map<std::string, torch::Tensor> snapshot_weights(const torch::nn::Module& model) {
  auto out = checkpoint::named_weights(model);
  for (auto& [name, tensor] : out) {
    tensor = tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  }
  return out;
}

void restore_weights(torch::nn::Module& model, const std::map<std::string, torch::Tensor>& saved) {
  checkpoint::copy_weights(model, saved, checkpoint::match_weights(model, saved));
}

Scores evaluate_without_grad(TrainableTask& task, FinetuneModel& model, const std::string& language,
                             Split split, const torch::Device& device, bool bf16,
                             const std::string& predictions_path) {
  torch::NoGradGuard no_grad;
  model->eval();
  AutocastScope autocast(device, bf16);
  auto scores = task.evaluate(model, language, split, device, predictions_path);
  model->train();
  return scores;
}

// The step counts of one seed: an epoch of finetune.batch_size batches, the run (finetune.epochs,
// cut at finetune.max_steps), the warm-up and the dev evaluations' period.
struct StepPlan {
  int64_t per_epoch = 0;
  int64_t total = 0;
  int64_t warmup = 0;
  int64_t eval_every = 0;
};

// Warns when the warm-up is not shorter than the run.
StepPlan plan_steps(const config::FinetuneConfig& settings, int64_t examples) {
  StepPlan plan;
  plan.per_epoch = (examples + settings.batch_size - 1) / settings.batch_size;
  plan.total = plan.per_epoch * settings.epochs;
  if (settings.max_steps > 0) plan.total = std::min(plan.total, settings.max_steps);
  // XTREME's schedule: a warm-up longer than the run is kept, as transformers keeps it.
  plan.warmup = settings.warmup_steps > 0
                    ? settings.warmup_steps
                    : static_cast<int64_t>(
                          std::llround(settings.warmup_ratio * static_cast<double>(plan.total)));
  plan.eval_every = settings.eval_every > 0 ? settings.eval_every : plan.per_epoch;
  if (plan.warmup >= plan.total) {
    const optim::TransformersLinearSchedule schedule(settings.lr, plan.warmup, plan.total);
    const bool steps = settings.warmup_steps > 0;
    spdlog::warn(
        "the warm-up ({} steps, {} {}) is not shorter than the run ({} steps): the whole run is "
        "warm-up and the learning rate never reaches finetune.lr ({}); the last step runs at "
        "{:.3g} (XTREME's schedule, transformers' get_linear_schedule_with_warmup, does not cut "
        "the warm-up); lower {} or set it to fit the run",
        plan.warmup, steps ? "finetune.warmup_steps" : "finetune.warmup_ratio",
        steps ? fmt::format("{}", settings.warmup_steps) : fmt::format("{}", settings.warmup_ratio),
        plan.total, settings.lr, schedule.lr(plan.total - 1),
        steps ? "finetune.warmup_steps" : "finetune.warmup_ratio");
  }
  return plan;
}

// Whether the train language has a dev set to select on; throws when finetune.select best_dev
// needs one that is missing or not read.
bool can_select_on_dev(const config::FinetuneConfig& settings, const TrainableTask& task) {
  const bool select_best = settings.select == "best_dev";
  const auto dev_languages = task.languages(Split::kDev);
  const bool can_select = std::find(dev_languages.begin(), dev_languages.end(),
                                    settings.train_language) != dev_languages.end();
  const auto& named = settings.languages;
  XLME_CHECK(!select_best || can_select || named.empty() ||
                 std::find(named.begin(), named.end(), settings.train_language) != named.end(),
             "finetune.select best_dev selects on the {} dev set (finetune.train_language), but "
             "finetune.languages [{}] does not name {}, so its dev set is not read; add {} to "
             "finetune.languages or set finetune.select: last",
             settings.train_language, fmt::join(named, ", "), settings.train_language,
             settings.train_language);
  XLME_CHECK(!select_best || can_select,
             "finetune.select best_dev needs a {} dev set for {}; add it under "
             "finetune.data_dir or set finetune.select: last",
             settings.train_language, settings.task);
  return can_select;
}

// Every evaluation set, read before the first step: a missing or damaged dev, test or gold file
// stops the run now, not after the training it would lose.
void read_eval_sets(TrainableTask& task) {
  for (Split split : {Split::kDev, Split::kTest}) {
    for (const auto& language : task.languages(split)) task.read(language, split);
  }
}

// The mean training loss since the last log line, logged every 50 steps and at the last.
class LossLog {
 public:
  LossLog(int64_t seed, int64_t total) : seed_(seed), total_(total) {}

  // One host read per step: fine-tuning batches are small and the log needs the value.
  void add(const torch::Tensor& loss, int64_t step, double lr) {
    sum_ += loss.item<double>();
    ++count_;
    if (step % 50 != 0 && step != total_) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    spdlog::info("seed {} step {}/{} lr {:.3g} loss {:.4f} ({:.1f} s)", seed_, step, total_, lr,
                 sum_ / static_cast<double>(count_), seconds);
    sum_ = 0.0;
    count_ = 0;
  }

 private:
  int64_t seed_;
  int64_t total_;
  double sum_ = 0.0;
  int64_t count_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The weights with the best train-language dev score so far (finetune.select best_dev).
struct BestDev {
  std::map<std::string, torch::Tensor> weights;
  double score = -std::numeric_limits<double>::infinity();
  int64_t step = 0;
};

// One update on the training features `indices`: the loss under autocast, its gradients,
// clipping to finetune.clip_norm, the optimizer's step at learning rate `lr`. Returns the loss.
torch::Tensor train_step(const config::FinetuneConfig& settings, TrainableTask& task,
                         FinetuneModel& model, torch::optim::Optimizer& optimizer,
                         const std::vector<int64_t>& indices, double lr,
                         const std::vector<double>& scales, const torch::Device& device,
                         bool bf16) {
  set_group_learning_rates(optimizer, lr, scales);
  optimizer.zero_grad();
  torch::Tensor loss;
  {
    AutocastScope autocast(device, bf16);
    loss = task.loss(model, indices, device);
  }
  loss.backward();
  if (settings.clip_norm > 0) {
    torch::nn::utils::clip_grad_norm_(model->parameters(), settings.clip_norm);
  }
  optimizer.step();
  return loss;
}

// Scores the train language's dev set after `step`; with finetune.select best_dev, keeps the
// weights in `best` when they score higher than any before.
void evaluate_dev(const config::FinetuneConfig& settings, TrainableTask& task, FinetuneModel& model,
                  int64_t seed, int64_t step, const torch::Device& device, bool bf16,
                  BestDev& best) {
  const auto dev =
      evaluate_without_grad(task, model, settings.train_language, Split::kDev, device, bf16, "");
  XLME_CHECK(!dev.values.empty(), "the {} dev set of {} has no labels to select with",
             settings.train_language, settings.task);
  spdlog::info("seed {} step {}: {} dev {} {:.2f}", seed, step, settings.train_language, dev.main,
               dev.main_value());
  if (settings.select == "best_dev" && dev.main_value() > best.score) {
    best.score = dev.main_value();
    best.step = step;
    best.weights = snapshot_weights(*model);
  }
}

// Evaluates every language of both splits with the final (or selected) weights; writes the
// predictions under `predictions_dir` (empty = none).
void evaluate_all(const config::FinetuneConfig& settings, TrainableTask& task, FinetuneModel& model,
                  const torch::Device& device, bool bf16, const std::string& predictions_dir,
                  SeedResult& result) {
  const bool select_best = settings.select == "best_dev";
  for (Split split : {Split::kDev, Split::kTest}) {
    for (const auto& language : task.languages(split)) {
      const std::string predictions =
          predictions_dir.empty()
              ? std::string()
              : path_under(predictions_dir, task.prediction_file(language, split));
      auto scores = evaluate_without_grad(task, model, language, split, device, bf16, predictions);
      if (scores.values.empty()) {  // predicted, but the set has no gold to score
        result.unscored[split_name(split)].push_back(language);
        continue;
      }
      if (split == Split::kDev && language == settings.train_language && !select_best) {
        result.best_dev = scores.main_value();
      }
      result.by[split_name(split)][language] = std::move(scores);
    }
  }
}

}  // namespace

const char* split_name(Split split) {
  return split == Split::kDev ? "dev" : "test";
}

double Scores::main_value() const {
  auto it = values.find(main);
  XLME_CHECK(it != values.end(), "scores have no '{}' (the task's main score)", main);
  return it->second;
}

std::pair<double, double> mean_std(const std::vector<double>& values) {
  if (values.empty()) return {0.0, 0.0};
  const double n = static_cast<double>(values.size());
  const double mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  if (values.size() == 1) return {mean, 0.0};
  double squares = 0.0;
  for (double v : values) squares += (v - mean) * (v - mean);
  return {mean, std::sqrt(squares / (n - 1.0))};
}

SeedResult train_and_evaluate(const config::FinetuneConfig& settings, TrainableTask& task,
                              const ModelFactory& factory, int64_t seed,
                              const torch::Device& device, const std::string& predictions_dir) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  std::mt19937_64 shuffle_rng(static_cast<uint64_t>(seed));
  SeedResult result;
  result.seed = seed;

  auto model = factory(task.head_kind(), task.classes());
  model->to(device);
  model->train();
  // The pre-training policy: bf16 autocast with float32 weights and TF32 matmuls on a GPU.
  const bool bf16 = uses_bf16(settings.precision, device);
  enable_tf32(device);
  result.precision = bf16 ? "bf16" : "fp32";
  std::vector<double> scales;
  auto optimizer =
      make_finetune_adamw(*model, model->layers(), model->encoder->args().share_layers, settings.lr,
                          settings.layer_lr_decay, settings.weight_decay, scales);

  const int64_t examples = task.train_size();
  XLME_CHECK(examples > 0, "finetune.task {}: no training features for {}", settings.task,
             settings.train_language);
  const StepPlan plan = plan_steps(settings, examples);
  const int64_t total = plan.total;
  const optim::TransformersLinearSchedule schedule(settings.lr, plan.warmup, total);
  const bool select_best = settings.select == "best_dev";
  const bool can_select = can_select_on_dev(settings, task);
  read_eval_sets(task);
  spdlog::info("seed {}: {} training features, {} steps ({} per epoch), warm-up {}, dev every {}",
               seed, examples, total, plan.per_epoch, plan.warmup, plan.eval_every);

  BestDev best;
  LossLog loss_log(seed, total);
  std::vector<int64_t> order(static_cast<size_t>(examples));
  for (int64_t step = 0; step < total;) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (int64_t first = 0; first < examples && step < total; first += settings.batch_size) {
      const int64_t last = std::min(first + settings.batch_size, examples);
      std::vector<int64_t> indices(order.begin() + first, order.begin() + last);
      const auto loss = train_step(settings, task, model, *optimizer, indices, schedule.lr(step),
                                   scales, device, bf16);
      ++step;
      loss_log.add(loss, step, schedule.lr(step - 1));
      if (can_select && (step % plan.eval_every == 0 || step == total)) {
        evaluate_dev(settings, task, model, seed, step, device, bf16, best);
      }
    }
  }
  result.steps = total;
  if (select_best) {
    restore_weights(*model, best.weights);
    result.best_step = best.step;
    result.best_dev = best.score;
    spdlog::info("seed {}: kept step {} ({} dev {:.2f})", seed, result.best_step,
                 settings.train_language, best.score);
  } else {
    result.best_step = total;
  }

  evaluate_all(settings, task, model, device, bf16, predictions_dir, result);
  return result;
}

namespace {

using Json = nlohmann::ordered_json;

Json summary(const std::vector<double>& values) {
  auto [mean, std] = mean_std(values);
  return Json{{"mean", mean}, {"std", std}, {"values", values}};
}

// What a split's average covers: the scored languages, and those of `languages` (the evaluated
// list) without a score, each with why.
struct Coverage {
  std::vector<std::string> covers, without_data, unscored;

  std::vector<std::string> lacks() const {
    std::vector<std::string> out = without_data;
    out.insert(out.end(), unscored.begin(), unscored.end());
    std::sort(out.begin(), out.end());
    return out;
  }
  size_t of() const { return covers.size() + without_data.size() + unscored.size(); }
};

Coverage coverage(const SeedResult& front, const std::string& split,
                  const std::vector<std::string>& languages) {
  Coverage out;
  const auto unscored_it = front.unscored.find(split);
  if (unscored_it != front.unscored.end()) out.unscored = unscored_it->second;
  const auto by_it = front.by.find(split);
  if (by_it != front.by.end()) {
    for (const auto& [language, unused] : by_it->second) out.covers.push_back(language);
  }
  auto listed = [](const std::vector<std::string>& list, const std::string& language) {
    return std::find(list.begin(), list.end(), language) != list.end();
  };
  for (const auto& language : languages) {
    if (!listed(out.covers, language) && !listed(out.unscored, language)) {
      out.without_data.push_back(language);
    }
  }
  return out;
}

// " (scored 300 of 2077 sentences)" for a set cut by finetune.max_eval_examples, else "".
std::string subset_note(const Scores& scores) {
  if (scores.scored >= scores.total) return "";
  return fmt::format(" (scored {} of {} {}s)", scores.scored, scores.total, scores.unit);
}

}  // namespace

std::string results_json(const config::Config& config, const std::vector<SeedResult>& seeds,
                         const std::vector<std::string>& languages) {
  XLME_CHECK(!seeds.empty(), "no fine-tuning results to write");
  Json out;
  out["task"] = config.finetune.task;
  out["init"] = config.finetune.init;
  out["train_language"] = config.finetune.train_language;
  out["precision"] = seeds.front().precision;
  std::vector<int64_t> seed_ids;
  Json selection = Json::array();
  for (const auto& s : seeds) {
    seed_ids.push_back(s.seed);
    selection.push_back(
        {{"seed", s.seed}, {"steps", s.steps}, {"kept_step", s.best_step}, {"dev", s.best_dev}});
  }
  out["seeds"] = seed_ids;
  out["selection"] = selection;
  for (Split split : {Split::kDev, Split::kTest}) {
    const std::string name = split_name(split);
    const auto& first = seeds.front().by;
    if (!first.count(name) || first.at(name).empty()) continue;
    Json block;
    Json per_language = Json::object();
    Json subset = Json::object();
    std::string main;
    std::vector<double> averages(seeds.size(), 0.0);
    for (const auto& [language, scores] : first.at(name)) {
      main = scores.main;
      Json per_score = Json::object();
      for (const auto& [key, unused] : scores.values) {
        std::vector<double> values;
        for (const auto& s : seeds) values.push_back(s.by.at(name).at(language).values.at(key));
        per_score[key] = summary(values);
      }
      per_language[language] = per_score;
      for (size_t i = 0; i < seeds.size(); ++i) {
        averages[i] += seeds[i].by.at(name).at(language).main_value() /
                       static_cast<double>(first.at(name).size());
      }
      if (scores.scored < scores.total) {
        subset[language] = {{"scored", scores.scored}, {"of", scores.total}, {"unit", scores.unit}};
      }
    }
    const auto covered = coverage(seeds.front(), name, languages);
    block["main"] = main;
    block["average"] = summary(averages);
    block["average"]["covers"] = covered.covers;
    block["average"]["lacks"] = covered.lacks();
    block["average"]["of"] = covered.of();
    if (!subset.empty()) {
      block["subset"] = {{"max_eval_examples", config.finetune.max_eval_examples},
                         {"languages", subset}};
    }
    block["languages"] = per_language;
    out[name] = block;
  }
  out["config"] = to_yaml(config, /*docs=*/false);
  return out.dump(2) + "\n";
}

std::string results_table(const std::vector<SeedResult>& seeds, Split split,
                          const std::vector<std::string>& languages,
                          const std::string& unscored_why) {
  if (seeds.empty()) return "";
  const std::string name = split_name(split);
  const auto& front = seeds.front();
  const auto covered = coverage(front, name, languages);
  const std::string unscored_line =
      covered.unscored.empty() ? ""
                               : fmt::format("{}: predictions for {} written but not scored: {}\n",
                                             name, fmt::join(covered.unscored, " "), unscored_why);
  if (!front.by.count(name)) return unscored_line;
  const auto& first = front.by.at(name);
  std::string out;
  std::vector<double> averages(seeds.size(), 0.0);
  std::string main;
  bool cut = false;
  for (const auto& [language, scores] : first) {
    main = scores.main;
    std::vector<double> values;
    for (size_t i = 0; i < seeds.size(); ++i) {
      const double v = seeds[i].by.at(name).at(language).main_value();
      values.push_back(v);
      averages[i] += v / static_cast<double>(first.size());
    }
    auto [mean, std] = mean_std(values);
    const std::string note = subset_note(scores);
    cut = cut || !note.empty();
    out += fmt::format("  {:<8} {:>7.2f} ± {:.2f}{}\n", language, mean, std, note);
  }
  auto [mean, std] = mean_std(averages);
  std::string over = fmt::format("over {} of {} languages", covered.covers.size(), covered.of());
  if (!covered.without_data.empty())
    over += fmt::format("; no data for: {}", fmt::join(covered.without_data, " "));
  if (!covered.unscored.empty())
    over += fmt::format("; not scored: {}", fmt::join(covered.unscored, " "));
  if (cut) over += "; on subsets (finetune.max_eval_examples), not comparable to full-set scores";
  return fmt::format("{} {} per language:\n", name, main) + out +
         fmt::format("  {:<8} {:>7.2f} ± {:.2f} {}\n", "average", mean, std, over) + unscored_line;
}

}  // namespace xlme::finetune
