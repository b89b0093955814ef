#include "xlme/train/metrics_processor.h"

#include "xlme/checkpoint/layout.h"
#include "xlme/train/performance.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <optional>

namespace xlme::train {
namespace {

// What the log line and the metrics report about speed and memory.
struct Throughput {
  double tokens_per_second = 0;
  std::optional<double> mfu;  // GPU with a known peak only
  double peak_memory_mib = 0;
};

// "step 100/1000 | lr 5.0e-04 | loss 12.31 | mlm 7.12 acc 0.051 | mrtd 0.421 acc 0.80 f1 0.12
//  | gnorm 1.23 | 12.4k tok/s | mfu 41.2% | mem 812 MiB"
// Losses, accuracies and F1 are the interval's (`terms`); lr, loss and gnorm the step's.
std::string log_line(const StepRecord& r, const objectives::TermSummaries& terms,
                     int64_t total_steps, const Throughput& speed) {
  std::string line =
      fmt::format("step {}/{} | lr {:.2e} | loss {:.4g}", r.step, total_steps, r.lr, r.loss);
  line += objectives::log_text(terms);
  line +=
      fmt::format(" | gnorm {:.3g} | {:.1f}k tok/s", r.grad_norm, speed.tokens_per_second / 1000);
  if (speed.mfu) line += fmt::format(" | mfu {:.1f}%", 100 * *speed.mfu);
  line += fmt::format(" | mem {:.0f} MiB", speed.peak_memory_mib);
  if (r.skipped) line += " | SKIPPED (non-finite)";
  return line;
}

// `flops`: the model FLOPs of the log interval's steps, all ranks.
MetricsRecord metrics_of(const StepRecord& r, const objectives::TermSummaries& terms,
                         const Throughput& speed, int64_t tokens_seen, double flops) {
  MetricsRecord m;
  m.add("step", r.step).add("kind", std::string("train")).add("lr", r.lr).add("total_loss", r.loss);
  for (const auto& [key, value] : objectives::log_fields(terms)) m.add(key, value);
  m.add("grad_norm", r.grad_norm)
      .add("tokens_per_s", speed.tokens_per_second)
      .add("mfu", speed.mfu ? *speed.mfu : std::nan(""))
      .add("peak_memory_mib", speed.peak_memory_mib)
      .add("tokens_seen", tokens_seen)
      .add("flops", flops)
      .add("skipped", static_cast<int64_t>(r.skipped));
  return m;
}

// "validation step 100 | mlm 5.1 acc 0.21 | mrtd 0.31 acc 0.89 f1 0.23 | ... | retrieval@1
//  layer 1: 0.052 (en->x 0.048, x->en 0.056) | 1.9 s"
std::string validation_line(const ValidationResult& v) {
  std::string line = fmt::format("validation step {}", v.step) + objectives::log_text(v.terms);
  for (const auto& [term, accuracy] : v.unigram_accuracy) {
    line += fmt::format(" | {} unigram floor {:.3f} acc {:.3f}", term, v.unigram_loss.at(term),
                        accuracy);
  }
  if (!v.retrieval.empty()) {
    line += fmt::format(" | retrieval@1 layer {}: {:.3f} ({} pairs; a->b {:.3f}, b->a {:.3f})",
                        v.probe_layer, v.retrieval_mean.mean, v.retrieval.size(),
                        v.retrieval_mean.a_to_b, v.retrieval_mean.b_to_a);
  }
  return line + fmt::format(" | {:.1f} s", v.seconds);
}

MetricsRecord validation_metrics(const ValidationResult& v) {
  MetricsRecord m;
  m.add("step", v.step).add("kind", std::string("validation"));
  for (const auto& [key, value] : objectives::log_fields(v.terms)) m.add(key, value);
  for (const auto& [term, accuracy] : v.unigram_accuracy) {
    m.add("unigram_accuracy/" + term, accuracy)
        .add("unigram_loss/" + term, v.unigram_loss.at(term));
  }
  if (!v.retrieval.empty()) {
    m.add("probe_layer", v.probe_layer)
        .add("retrieval/mean", v.retrieval_mean.mean)
        .add("retrieval/a_to_b", v.retrieval_mean.a_to_b)
        .add("retrieval/b_to_a", v.retrieval_mean.b_to_a);
    for (const auto& [pair, r] : v.retrieval) {
      m.add("retrieval/" + pair + "/a_to_b", r.a_to_b)
          .add("retrieval/" + pair + "/b_to_a", r.b_to_a);
    }
  }
  return m.add("seconds", v.seconds);
}

}  // namespace

MetricsProcessor::MetricsProcessor(const config::Config& config, const torch::Device& device,
                                   int world_size, bool writes, int64_t resumed_step,
                                   bool validates_at_start)
    : log_every_(config.train.log_every),
      total_steps_(config.train.steps),
      device_(device),
      device_name_(device_name(device)),
      world_size_(world_size),
      start_(std::chrono::steady_clock::now()) {
  if (writes) {
    writer_ = std::make_unique<MetricsWriter>(
        (std::filesystem::path(config.run.out_dir) / checkpoint::kMetricsFile).string(),
        resumed_step, !validates_at_start);
  }
}

void MetricsProcessor::log_step(const StepRecord& record, int64_t tokens_seen,
                                const data::BatchSource& source) {
  tokens_ += record.tokens;
  flops_ += record.flops;
  sums_.add(record.sums);
  if (record.step % log_every_ != 0 && record.step != 1 && record.step != total_steps_) return;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  Throughput speed;
  speed.tokens_per_second = tokens_ / seconds;
  speed.mfu = model_flops_utilization(flops_ / seconds, device_name_, world_size_);
  speed.peak_memory_mib = peak_memory_mib(device_);
  const objectives::TermSummaries terms = sums_.summary();
  sums_ = objectives::TermSums();
  spdlog::info("{}", log_line(record, terms, total_steps_, speed));
  if (const std::string table = source.language_report(); !table.empty()) {
    spdlog::info("data: language, shard tokens, target / realized share{}", table);
  }
  if (writer_) writer_->write(metrics_of(record, terms, speed, tokens_seen, flops_));
  start_ = now;
  tokens_ = 0;
  flops_ = 0;
}

void MetricsProcessor::log_validation(const ValidationResult& result) {
  spdlog::info("{}", validation_line(result));
  if (writer_) writer_->write(validation_metrics(result));
  start_ = std::chrono::steady_clock::now();
}

}  // namespace xlme::train
