#include "xlme/train/benchmark.h"

#include "xlme/checkpoint/manager.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/data/synthetic.h"
#include "xlme/dist/communicator.h"
#include "xlme/train/distill.h"
#include "xlme/train/metrics.h"
#include "xlme/train/op_profile.h"
#include "xlme/train/performance.h"
#include "xlme/train/trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>

namespace xlme::train {

namespace {

namespace fs = std::filesystem;

double seconds_of(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The time a step waits per checkpoint, `rounds` times each way, into a fresh folder under
// `save_dir` (removed afterwards): saved while training waits (train.async_save=false), and copied
// and written in the background, with a step run meanwhile.
void add_save_figures(Trainer& trainer, const std::string& save_dir, int rounds,
                      MetricsRecord& out) {
  const std::string folder =
      (fs::path(save_dir) / fmt::format("xlme-benchmark-save-{}", ::getpid())).string();
  XLME_CHECK(!fs::exists(folder), "--benchmark-save: '{}' exists already; remove it", folder);
  const checkpoint::CheckpointManager manager(folder, /*keep_last=*/1, /*keep_every=*/0);
  double sync = 0, async = 0, step_during = 0, wait = 0;
  uint64_t bytes = 0;
  try {
    for (int i = 0; i < rounds; ++i) {
      trainer.train_step();
      sync += seconds_of([&] { trainer.save_checkpoint(manager); });
      trainer.train_step();
      async += seconds_of([&] { trainer.start_checkpoint(manager); });
      step_during += seconds_of([&] { trainer.train_step(); });
      std::optional<std::string> path;
      wait += seconds_of([&] { path = trainer.finish_checkpoint(); });
      bytes = 0;
      for (const auto& entry : fs::directory_iterator(*path)) bytes += entry.file_size();
    }
  } catch (...) {
    std::error_code ec;
    fs::remove_all(folder, ec);
    throw;
  }
  std::error_code ec;
  fs::remove_all(folder, ec);
  out.add("checkpoint_mb", static_cast<double>(bytes) / (1024.0 * 1024.0))
      .add("save_blocked_ms_sync", 1000 * sync / rounds)
      .add("save_blocked_ms_async", 1000 * async / rounds)
      .add("step_ms_during_async_save", 1000 * step_during / rounds)
      .add("save_wait_ms_after_one_step", 1000 * wait / rounds)
      .add("peak_memory_mib_with_saves", peak_memory_mib(trainer.device()));
}

}  // namespace

std::string run_benchmark(const config::Config& config, int64_t steps,
                          const std::string& profile_path, const std::string& save_dir) {
  XLME_CHECK(steps >= 1, "--benchmark needs at least 1 step, got {}", steps);
  XLME_CHECK(config.model.vocab_size > 0,
             "--benchmark needs model.vocab_size (0 = the tokenizer's size); add e.g. --set "
             "model.vocab_size=8000");
  const int64_t length = config.data.mono.max_len;
  const int64_t batch = config.train.micro_batch_tokens / length;
  model::ElectraModel model = build_model(config);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  data::SyntheticBatches source(data::SpecialIds::for_vocab(config.model.vocab_size), batch, length,
                                config.objectives.mask_ratio, config.run.seed);
  source.set_sentence_pairs(config.model.cross_attention);  // VECO splits pairs
  const dist::LaunchInfo launch = dist::launch_info_from_env();
  const torch::Device device = dist::use_device(config.run.device, launch);
  auto comm = dist::Communicator::create(launch, device, config.dist.backend,
                                         std::chrono::seconds(config.dist.timeout_s));
  Trainer trainer(config, model, source, comm);
  trainer.set_phase_timing(true);
  spdlog::info("benchmark: {} parameters, micro-batches of {} x {} tokens, {} per task and step",
               parameters, batch, length, trainer.micro_batches_per_task());
  // The loss and the skipped steps go with the figures: a run gone non-finite (every update
  // skipped) would otherwise still report its speed.
  int64_t skipped = 0;
  for (int i = 0; i < 2; ++i) skipped += trainer.train_step().skipped ? 1 : 0;

  std::map<std::string, double> seconds;
  int64_t tokens = 0;
  double flops = 0, first_loss = 0, last_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    const StepRecord record = trainer.train_step();
    tokens += record.tokens;
    flops += record.flops;
    skipped += record.skipped ? 1 : 0;
    if (i == 0) first_loss = record.loss;
    last_loss = record.loss;
    for (const auto& [phase, s] : record.seconds) seconds[phase] += s;
  }
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (!profile_path.empty()) {
    // A separate pass, so that the profiler's overhead stays out of the figures above.
    const auto profile_start = std::chrono::steady_clock::now();
    const bool on_cuda = trainer.device().is_cuda();
    const auto ops = profile_ops(
        [&] {
          for (int64_t i = 0; i < steps; ++i) trainer.train_step();
        },
        on_cuda);
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - profile_start)
            .count();
    write_file_atomic(profile_path, format_op_table(ops, steps, wall_ms, ops.size()));
    spdlog::info(
        "where the time goes ({} profiled steps, {:.0f} ms per step with the profiler, {} "
        "times; every operator in {}):\n{}",
        steps, wall_ms / steps, on_cuda ? "CUDA-event (device)" : "host", profile_path,
        format_op_table(ops, steps, wall_ms, 20));
  }

  const double peak_memory = peak_memory_mib(trainer.device());
  const auto mfu =
      model_flops_utilization(flops / total, device_name(trainer.device()), comm->world_size());
  MetricsRecord out;
  out.add("benchmark", std::string("xlme-pretrain"))
      .add("steps", steps)
      .add("tokens_per_s", tokens / total)
      .add("step_ms", 1000 * total / steps)
      .add("loss_first", first_loss)
      .add("loss_last", last_loss)
      .add("skipped_steps", skipped);
  for (const auto& [phase, s] : seconds) out.add(phase + "_ms", 1000 * s / steps);
  out.add("objectives", config.objectives.set)
      .add("sequences_per_micro_batch", batch)
      .add("sequence_length", length)
      .add("micro_batches_per_task", trainer.micro_batches_per_task())
      .add("ranks", static_cast<int64_t>(comm->world_size()))
      .add("parameters", parameters)
      .add("precision", std::string(trainer.bf16() ? "bf16" : "fp32"))
      .add("flops_per_token", step_flops_per_token(config, model->teacher()))
      .add("mfu", mfu ? *mfu : std::nan(""))
      .add("peak_memory_mib", peak_memory)
      .add("device", device_name(trainer.device()));
  if (!save_dir.empty()) add_save_figures(trainer, save_dir, /*rounds=*/2, out);
  return out.to_json();
}

}  // namespace xlme::train
