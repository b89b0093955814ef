#include "xlme/train/pretrain.h"

#include "xlme/common/app.h"
#include "xlme/common/error.h"
#include "xlme/data/batches.h"
#include "xlme/data/tokenizer.h"
#include "xlme/train/checkpoint.h"
#include "xlme/train/metrics.h"
#include "xlme/train/signals.h"
#include "xlme/train/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

using Summaries = std::map<std::string, std::map<std::string, double>>;

// Term sums added over the steps of a log interval, so that its accuracies and F1 are those of
// all the interval's tokens rather than of its last step.
class IntervalSums {
 public:
  void add(const StepRecord& r) {
    for (const auto& [name, term] : r.sums) {
      auto [it, fresh] = sums_.try_emplace(name, term);
      if (fresh) continue;
      objectives::Term& acc = it->second;
      acc.loss_sum = acc.loss_sum + term.loss_sum;
      acc.count = acc.count + term.count;
      for (const auto& [key, value] : term.statistics) {
        acc.statistics[key] = acc.statistics[key] + value;
      }
    }
  }
  Summaries summarize_and_reset() {
    Summaries out;
    for (const auto& [name, term] : sums_) out[name] = objectives::summarize(term);
    sums_.clear();
    return out;
  }

 private:
  std::map<std::string, objectives::Term> sums_;
};

// "step 100/1000 | lr 5.0e-04 | loss 12.31 | mlm 7.12 acc 0.051 | mrtd 0.421 acc 0.80 f1 0.12
//  | gnorm 1.23 | 12.4k tok/s"
// Losses, accuracies and F1 are the interval's (`terms`); lr, loss and gnorm the step's.
std::string log_line(const StepRecord& r, const Summaries& terms, int64_t total_steps,
                     double tokens_per_second) {
  std::string line =
      fmt::format("step {}/{} | lr {:.2e} | loss {:.4g}", r.step, total_steps, r.lr, r.loss);
  for (const auto& [name, s] : terms) {
    line += fmt::format(" | {} {:.4g} acc {:.3f}", name, s.at("loss"), s.at("accuracy"));
    if (s.count("f1")) line += fmt::format(" f1 {:.3f}", s.at("f1"));
  }
  line += fmt::format(" | gnorm {:.3g} | {:.1f}k tok/s", r.grad_norm, tokens_per_second / 1000);
  if (r.skipped) line += " | SKIPPED (non-finite)";
  return line;
}

MetricsRecord metrics_of(const StepRecord& r, const Summaries& terms, double tokens_per_second,
                         int64_t tokens_seen) {
  MetricsRecord m;
  m.add("step", r.step).add("kind", std::string("train")).add("lr", r.lr).add("total_loss", r.loss);
  for (const auto& [name, s] : terms) {
    m.add("loss/" + name, s.at("loss")).add("accuracy/" + name, s.at("accuracy"));
    if (s.count("f1")) m.add("f1/" + name, s.at("f1"));
  }
  m.add("grad_norm", r.grad_norm)
      .add("tokens_per_s", tokens_per_second)
      .add("tokens_seen", tokens_seen)
      .add("skipped", static_cast<int64_t>(r.skipped));
  return m;
}

// Rank 0 picks the checkpoint to resume from; every rank gets its step (-1: none).
std::string resume_path(const PretrainOptions& options, const CheckpointManager& manager,
                        dist::Communicator& comm) {
  if (options.resume == "none") return "";
  if (options.resume != "auto") {
    CheckpointManager::verify(options.resume);
    return options.resume;
  }
  int64_t step = -1;
  if (comm.rank() == 0) {
    if (const auto latest = manager.latest_valid()) step = latest->step;
  }
  std::vector<torch::Tensor> shared{torch::tensor({static_cast<double>(step)}, torch::kFloat64)};
  if (comm.rank() != 0) shared[0].zero_();
  comm.all_reduce_sum(shared);  // only rank 0 contributes
  step = static_cast<int64_t>(shared[0].item<double>());
  return step < 0 ? "" : manager.path_for(step);
}

}  // namespace

int pretrain(const config::Config& config, const PretrainOptions& options,
             data::BatchSource& source, std::shared_ptr<dist::Communicator> comm) {
  install_stop_signal_handlers();
  const bool leader = comm->rank() == 0;
  const CheckpointManager manager((fs::path(config.run.out_dir) / "checkpoints").string(),
                                  config.train.keep_last, config.train.keep_every);
  if (leader) manager.remove_temporaries();
  comm->barrier();

  torch::manual_seed(config.run.seed);
  model::ElectraModel model(config.model, model::architecture_for(config.objectives.set));
  Trainer trainer(config, model, source, comm);
  if (const std::string path = resume_path(options, manager, *comm); !path.empty()) {
    trainer.load_checkpoint(path);
  } else {
    spdlog::info("starting from step 0 (run.out_dir {})", config.run.out_dir);
  }
  std::unique_ptr<MetricsWriter> metrics;
  if (leader) {
    metrics =
        std::make_unique<MetricsWriter>((fs::path(config.run.out_dir) / "metrics.jsonl").string());
  }

  auto window_start = std::chrono::steady_clock::now();
  int64_t window_tokens = 0;
  IntervalSums interval;
  while (trainer.step() < config.train.steps) {
    const StepRecord record = trainer.train_step();
    window_tokens += record.tokens;
    interval.add(record);
    const bool last = record.step == config.train.steps;
    if (record.step % config.train.log_every == 0 || record.step == 1 || last) {
      const auto now = std::chrono::steady_clock::now();
      const double rate = window_tokens / std::chrono::duration<double>(now - window_start).count();
      const Summaries terms = interval.summarize_and_reset();
      spdlog::info("{}", log_line(record, terms, config.train.steps, rate));
      if (metrics) metrics->write(metrics_of(record, terms, rate, trainer.tokens_seen()));
      window_start = now;
      window_tokens = 0;
    }
    // Every rank learns whether any rank received a stop signal, at the same step.
    std::vector<torch::Tensor> stop{
        torch::tensor({stop_signal() != 0 ? 1.0 : 0.0}, torch::kFloat64)};
    comm->all_reduce_sum(stop);
    const bool preempted = stop[0].item<double>() > 0;
    const bool periodic = config.train.save_every > 0 && record.step % config.train.save_every == 0;
    if (periodic || last || preempted) {
      const std::string path = trainer.save_checkpoint(manager);
      spdlog::info("checkpoint: {}", path);
    }
    if (preempted && !last) {
      spdlog::warn("stopping at step {} on a stop signal; resume with --resume auto (exit code {})",
                   record.step, kExitPreempted);
      clear_stop_signal();
      return kExitPreempted;
    }
  }
  spdlog::info("done: {} steps, {} tokens, {} skipped", trainer.step(), trainer.tokens_seen(),
               trainer.skipped_steps());
  return kExitOk;
}

int run_pretraining(const config::Config& config, const PretrainOptions& options) {
  const dist::LaunchInfo launch = dist::launch_info_from_env();
  auto comm = dist::Communicator::create(launch, config.dist.backend,
                                         std::chrono::seconds(config.dist.timeout_s));
  config::Config resolved = config;
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (!config.data.tokenizer.empty()) {
    tokenizer = std::make_unique<data::Tokenizer>(
        config.data.tokenizer, data::parse_vocab_layout(config.data.vocab_layout));
  }
  if (resolved.model.vocab_size == 0) {
    XLME_CHECK(tokenizer != nullptr,
               "model.vocab_size is 0 (= the tokenizer's size) but data.tokenizer is empty; set "
               "data.tokenizer to the SentencePiece model the shards were made with");
    resolved.model.vocab_size = tokenizer->vocab_size();
  } else if (tokenizer != nullptr) {
    XLME_CHECK(resolved.model.vocab_size == tokenizer->vocab_size(),
               "model.vocab_size is {} but the tokenizer {} has {} ids (<mask> included); set "
               "model.vocab_size=0 to take the tokenizer's",
               resolved.model.vocab_size, config.data.tokenizer, tokenizer->vocab_size());
  }
  data::ShardBatchSource source(
      data::BatchOptions::from_config(resolved, tokenizer.get(), launch.rank, launch.world_size));
  return pretrain(resolved, options, source, comm);
}

}  // namespace xlme::train
