#include "xlme/train/pretrain.h"

#include "rank_checks.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/checkpoint/manager.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/common/error.h"
#include "xlme/common/exit_codes.h"
#include "xlme/common/io.h"
#include "xlme/common/runtime.h"
#include "xlme/data/batches.h"
#include "xlme/data/tokenizer.h"
#include "xlme/train/distill.h"
#include "xlme/train/init.h"
#include "xlme/train/metrics_processor.h"
#include "xlme/train/performance.h"
#include "xlme/train/signals.h"
#include "xlme/train/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

// Refuses a train.micro_batch_tokens whose micro-batch cannot fit in this machine's memory, before
// the loader or the dry run allocates it (the dry run's allocation can succeed on an
// overcommitting system and the run then grows until it is killed). A lower bound, not an
// estimate: the host holds at least ids, targets and mask (8 bytes each) per token, and on the CPU
// every layer of both models keeps its fp32 input [tokens, hidden] for the backward pass.
void check_micro_batch_memory(const config::Config& config, const torch::Device& device) {
  const double tokens = static_cast<double>(config.train.micro_batch_tokens);
  double bytes_per_token = 3 * 8;
  std::string what = "its ids, targets and mask (24 bytes a token)";
  if (device.is_cpu()) {
    const int64_t layers = config.model.layers + config.model.generator.layers + 1;
    bytes_per_token += 4.0 * static_cast<double>(config.model.hidden_size * layers);
    what = fmt::format(
        "its hidden states alone: model.hidden_size {} x 4 bytes x {} layers of both models kept "
        "for the backward pass, and the ids",
        config.model.hidden_size, layers);
  }
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  const double gib = 1024.0 * 1024.0 * 1024.0;
  XLME_CHECK(memory <= 0 || tokens * bytes_per_token <= memory,
             "train.micro_batch_tokens {} needs at least {:.1f} GiB for one micro-batch ({}), "
             "more than this machine's {:.1f} GiB of memory; lower train.micro_batch_tokens (the "
             "step keeps train.tokens_per_task with more micro-batches)",
             config.train.micro_batch_tokens, tokens * bytes_per_token / gib, what, memory / gib);
}
using checkpoint::CheckpointManager;
using checkpoint::VerifiedFiles;

// The checkpoint to resume from (nullopt: a fresh start), verified once on each rank and handed to
// the trainer's loader as it is. With --resume auto rank 0 picks the newest valid checkpoint and
// the other ranks verify the one it picked.
std::optional<VerifiedFiles> resume_from(const PretrainOptions& options,
                                         const CheckpointManager& manager,
                                         dist::Communicator& comm) {
  if (options.resume == "none") return std::nullopt;
  if (options.resume != "auto") return CheckpointManager::verify(options.resume);
  double step = 0;  // only rank 0 contributes to the sum
  std::optional<VerifiedFiles> picked;
  if (comm.rank() == 0) {
    if (auto latest = manager.latest_valid()) {
      step = static_cast<double>(latest->step);
      picked = std::move(latest->files);
    } else {
      XLME_CHECK(manager.list().empty(),
                 "--resume auto: '{}' holds checkpoints but none of them verifies (see the "
                 "warnings above); repair or restore one, resume from a given one with --resume "
                 "DIR, or start afresh with --resume none --overwrite (the old ones are kept "
                 "aside)",
                 manager.dir());
      step = -1;
    }
  }
  step = comm.reduce_scalars({step}, dist::ScalarOp::kSum).front();
  if (step < 0) return std::nullopt;
  if (picked) return picked;
  return CheckpointManager::verify(manager.path_for(static_cast<int64_t>(step)));
}

// When the checkpoint `folder` was written by another run than the other checkpoints beside it
// (copied from another run folder), a sentence naming both runs; "" otherwise. Said before the
// reason its loading failed, which alone (a data-state seed, a shape) does not name the run.
std::string other_run_note(const CheckpointManager& manager, const std::string& folder) {
  const std::string id = CheckpointManager::run_id_of(folder);
  for (const auto& ref : manager.list()) {
    if (ref.path == folder) continue;
    std::string other;
    try {
      other = CheckpointManager::run_id_of(ref.path);
    } catch (const Error&) {
      continue;
    }
    if (other.empty() || other == id) continue;
    std::string written_in = "unknown";
    try {
      written_in =
          config::load_config((fs::path(folder) / checkpoint::kConfigFile).string()).run.out_dir;
    } catch (const Error&) {
    }
    return fmt::format(
        "checkpoint '{}' was written by another run (run id {}, run.out_dir '{}') than the "
        "checkpoints beside it (run id {}, e.g. '{}'): was it copied from another run folder? "
        "Move it out of '{}' to resume this run, or resume that run from it in its own folder",
        folder, id, written_in, other, ref.path, manager.dir());
  }
  return "";
}

// Rank 0's hold on the run folder for the length of the run (an exclusive lock: a second run in
// the same run.out_dir fails at once, naming this one), after checking that the run may write
// there: a fresh start (--resume none) refuses a folder that holds checkpoints, unless
// --overwrite moves them and metrics.jsonl aside to <run.out_dir>/replaced-<time>/.
std::unique_ptr<FileLock> claim_run_folder(const config::Config& config,
                                           const PretrainOptions& options,
                                           const CheckpointManager& manager) {
  const fs::path out_dir(config.run.out_dir);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  XLME_CHECK(!ec, "cannot create run.out_dir '{}': {}", out_dir.string(), ec.message());
  auto lock = std::make_unique<FileLock>((out_dir / "run.lock").string(),
                                         fmt::format("run folder '{}'", out_dir.string()));
  if (options.resume != "none" || manager.list().empty()) return lock;
  XLME_CHECK(options.overwrite,
             "--resume none, but run.out_dir '{}' holds checkpoints of an earlier run (newest: "
             "{}); a fresh run there would mix with them. Choose a fresh run.out_dir, continue it "
             "with --resume auto, or pass --overwrite to move them aside and start again",
             out_dir.string(), manager.list().back().path);
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  const fs::path aside = out_dir / (std::string("replaced-") + stamp);
  fs::create_directories(aside, ec);
  XLME_CHECK(!ec, "cannot create '{}': {}", aside.string(), ec.message());
  for (const char* name : {checkpoint::kCheckpointsFolder, checkpoint::kMetricsFile}) {
    if (!fs::exists(out_dir / name)) continue;
    fs::rename(out_dir / name, aside / name, ec);
    XLME_CHECK(!ec, "cannot move '{}' aside to '{}': {}", (out_dir / name).string(), aside.string(),
               ec.message());
  }
  spdlog::warn("--overwrite: the earlier run's checkpoints and metrics are moved to {}",
               aside.string());
  return lock;
}

// What every rank checks before it trains (the same config and data as rank 0, one run folder that
// every rank shares), and rank 0's hold on that folder for the run (claim_run_folder), whose
// leftover temporary checkpoints it removes. Returns the lock (null on the other ranks).
std::unique_ptr<FileLock> start_run(const config::Config& config, const PretrainOptions& options,
                                    const CheckpointManager& manager, dist::Communicator& comm) {
  check_same_config(config, comm);
  check_same_data(config, comm);
  check_shared_run_folder(config, comm);
  std::unique_ptr<FileLock> lock;
  if (comm.rank() == 0) {
    lock = claim_run_folder(config, options, manager);
    manager.remove_temporaries();
  }
  comm.barrier();
  return lock;
}

// Rank 0: the run's lineage, drawn at step 0 and carried through every resume.
void record_run_id(CheckpointManager& manager, const std::optional<VerifiedFiles>& resume) {
  std::string run_id = resume ? CheckpointManager::run_id_of(resume->folder()) : "";
  if (run_id.empty()) run_id = CheckpointManager::new_run_id();
  manager.set_run_id(run_id);
  spdlog::info("run id {} (recorded in each checkpoint; only its own checkpoints are pruned)",
               run_id);
}

// The trainer continued from its own checkpoint `resume`: a load that fails names the other run
// when the checkpoint was copied from one, and the loaded weights must be finite.
void resume_trainer(Trainer& trainer, const VerifiedFiles& resume, const CheckpointManager& manager,
                    const PretrainOptions& options) {
  try {
    trainer.load_checkpoint(resume);
  } catch (const Error& e) {
    const std::string other = other_run_note(manager, resume.folder());
    if (other.empty()) throw;
    XLME_FAIL("{}; {}", other, e.what());
  }
  checkpoint::check_finite_weights(checkpoint::named_weights(*trainer.model()),
                                   resume.path(checkpoint::kModelFile));
  if (!options.init_from.empty()) {
    spdlog::info("--init-from {} ignored: the run continues from its own checkpoint {}",
                 options.init_from, resume.folder());
  }
}

// The start-up dry run (Trainer::dry_run), timed and logged with the peak memory it reached.
void start_up_dry_run(Trainer& trainer) {
  const auto start = std::chrono::steady_clock::now();
  trainer.dry_run();
  spdlog::info(
      "start-up dry run at the longest micro-batches passed in {:.1f} s ({}, peak memory "
      "{:.0f} MiB)",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      trainer.bf16() ? "bf16 autocast" : "fp32", peak_memory_mib(trainer.device()));
}

// The checkpoint after `step`: written before training goes on, or (`background`) only copied to
// host memory here and written on the background thread; logs how long training waited.
void save_after_step(Trainer& trainer, const CheckpointManager& manager, int64_t step,
                     bool background) {
  const auto start = std::chrono::steady_clock::now();
  const std::string path =
      background ? trainer.start_checkpoint(manager) : trainer.save_checkpoint(manager);
  const double blocked =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (background) {
    spdlog::info(
        "checkpoint of step {}: training waited {:.2f} s (state copied); {} is "
        "written in the background",
        step, blocked, path);
  } else {
    spdlog::info("checkpoint: {} (training waited {:.2f} s)", path, blocked);
  }
}

// A stop signal abandoned the step on every rank: the last finished step is saved (unless it is
// already) once the save in flight is complete (or its error said). Returns kExitPreempted.
int stop_in_step(Trainer& trainer, const CheckpointManager& manager, dist::Communicator& comm) {
  trainer.finish_checkpoint();
  bool saved = false;
  for (const auto& ref : manager.list()) saved = saved || ref.step == trainer.step();
  comm.barrier();
  if (!saved) spdlog::info("checkpoint: {}", trainer.save_checkpoint(manager));
  spdlog::warn(
      "stopping at step {} on a stop signal, in the middle of step {}; resume with "
      "--resume auto (exit code {})",
      trainer.step(), trainer.step() + 1, kExitPreempted);
  clear_stop_signal();
  return kExitPreempted;
}

}  // namespace

int pretrain(const config::Config& config, const PretrainOptions& options,
             data::BatchSource& source, std::shared_ptr<dist::Communicator> comm,
             const Validator* validator) {
  install_stop_signal_handlers();
  const bool leader = comm->rank() == 0;
  CheckpointManager manager(checkpoint::checkpoints_folder(config.run.out_dir),
                            config.train.keep_last, config.train.keep_every);
  const std::unique_ptr<FileLock> lock = start_run(config, options, manager, *comm);

  torch::manual_seed(config.run.seed);
  model::ElectraModel model = build_model(config);
  const std::optional<VerifiedFiles> resume = resume_from(options, manager, *comm);
  if (leader) record_run_id(manager, resume);
  if (!resume && !options.init_from.empty()) {
    // Every rank loads the same weights (the trainer broadcasts rank 0's anyway).
    const auto report = init_weights(
        model, init_source_weights(options.init_from, checkpoint::weight_specs(*model)),
        config.train.init_parts, options.init_from);
    spdlog::info("{}", format_report(report, options.init_from, config.train.init_parts));
  }
  Trainer trainer(config, model, source, comm);
  if (resume) {
    resume_trainer(trainer, *resume, manager, options);
  } else {
    spdlog::info("starting from step 0 (run.out_dir {})", config.run.out_dir);
  }
  start_up_dry_run(trainer);

  const bool validates_at_start = validator != nullptr && config.train.validate_at_start;
  // Rank 0 rewrites what a stopped run logged after the checkpoint it resumes from (or after
  // step 0, when it stopped before its first checkpoint).
  MetricsProcessor metrics(config, trainer.device(), comm->world_size(), leader, trainer.step(),
                           validates_at_start);
  // train.release_memory: CPU tensors live in the C heap, which keeps what they free, fragmented
  // by the changing micro-batch shapes (runtime::release_free_memory).
  const bool release_memory = config.train.release_memory && !trainer.device().is_cuda();
  auto validate = [&](int64_t step) {
    ValidationResult v = validator->run(trainer.model(), *comm, trainer.device(), trainer.bf16());
    if (release_memory) runtime::release_free_memory();
    v.step = step;
    metrics.log_validation(v);
  };
  if (validates_at_start) validate(trainer.step());

  while (trainer.step() < config.train.steps) {
    const StepRecord record = trainer.train_step();
    if (release_memory) runtime::release_free_memory();
    if (record.interrupted) return stop_in_step(trainer, manager, *comm);
    metrics.log_step(record, trainer.tokens_seen(), source);
    const bool last = record.step == config.train.steps;
    if (validator != nullptr && config.train.validate_every > 0 &&
        (record.step % config.train.validate_every == 0 || last)) {
      validate(record.step);
    }
    // Every rank learns whether any rank received a stop signal, at the same step.
    const bool preempted = trainer.stop_requested();
    const bool periodic = config.train.save_every > 0 && record.step % config.train.save_every == 0;
    if (periodic || last || preempted) {
      // The last and the stop-signal checkpoints are complete before the run ends.
      save_after_step(trainer, manager, record.step,
                      /*background=*/config.train.async_save && !last && !preempted);
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

std::optional<runtime::ThreadSettings> share_cores_among_local_ranks(const config::Config& config,
                                                                     dist::Communicator& comm) {
  if (comm.world_size() == 1) return std::nullopt;
  // Every rank exchanges its host name, whatever its own settings: the ranks' collectives match.
  const std::string host = host_name();
  const auto hosts = comm.all_gather_strings(host);
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (config.run.threads != 0 || (omp != nullptr && *omp != '\0') ||
      runtime::local_ranks_from_env().count > 1) {
    return std::nullopt;  // decided already
  }
  const auto here = static_cast<int>(std::count(hosts.begin(), hosts.end(), host));
  if (here < 2) return std::nullopt;
  return runtime::configure_threads(0, {here, "ranks on this host at the rendezvous"});
}

int run_pretraining(const config::Config& config, const PretrainOptions& options) {
  const dist::LaunchInfo launch = dist::launch_info_from_env();
  const torch::Device device = dist::use_device(config.run.device, launch);
  dist::CommOptions comm_options;
  comm_options.timeout = std::chrono::seconds(config.dist.timeout_s);
  comm_options.startup_timeout = std::chrono::seconds(config.dist.startup_timeout_s);
  comm_options.heartbeat = std::chrono::seconds(config.dist.heartbeat_s);
  comm_options.stop_requested = [] { return stop_signal() != 0; };
  std::shared_ptr<dist::Communicator> comm;
  try {
    comm = dist::Communicator::create(launch, device, config.dist.backend, comm_options);
  } catch (const dist::RendezvousInterrupted& e) {
    // The documented stop: exit code 75, and the same command starts the run again.
    spdlog::warn("{} (exit code {})", e.what(), kExitPreempted);
    return kExitPreempted;
  }
  if (const auto threads = share_cores_among_local_ranks(config, *comm)) {
    spdlog::info("threads: {} LibTorch (from {})", threads->intra_op, threads->source);
  }
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
  check_micro_batch_memory(resolved, device);
  auto batch_options =
      data::BatchOptions::from_config(resolved, tokenizer.get(), launch.rank, launch.world_size);
  batch_options.allow_data_change = options.allow_data_change;
  data::ShardBatchSource source(batch_options);
  std::unique_ptr<Validator> validator;
  const bool wants_validation = config.train.validate_every > 0;
  if (wants_validation && !config.data.heldout.dir.empty()) {
    XLME_CHECK(tokenizer != nullptr,
               "data.heldout.dir is set but data.tokenizer is empty: the held-out text needs the "
               "tokenizer the shards were made with");
    const auto pairs = data::read_heldout(config.data.heldout, *tokenizer);
    validator = std::make_unique<Validator>(resolved, pairs, tokenizer->special_ids());
    spdlog::info(
        "validation on {} held-out pairs from {}: {} micro-batches, {} tokens; retrieval "
        "probe at discriminator layer {}",
        pairs.size(), config.data.heldout.dir, validator->micro_batches(), validator->tokens(),
        validator->probe_layer());
  } else if (wants_validation) {
    spdlog::warn("no validation: data.heldout.dir is empty (e.g. data/demo/heldout/dev)");
  }
  return pretrain(resolved, options, source, comm, validator.get());
}

}  // namespace xlme::train
