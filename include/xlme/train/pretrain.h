// A whole pre-training run on one rank: resume, the step loop, periodic and final checkpoints,
// and preemption (docs/ARCHITECTURE.md#training). The trainer (trainer.h) does the steps and the
// metrics processor (metrics_processor.h) reports them; this decides when to validate, save and
// stop, like Marian's Scheduler.
#pragma once

#include "xlme/common/runtime.h"
#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/dist/communicator.h"
#include "xlme/train/validation.h"

#include <memory>
#include <optional>
#include <string>

namespace xlme::train {

struct PretrainOptions {
  // "auto": the newest valid checkpoint under <run.out_dir>/checkpoints, if any (damaged ones are
  // skipped with a warning); "none": start fresh; otherwise a checkpoint folder.
  std::string resume = "auto";
  // A pre-training checkpoint folder whose weights start a fresh run (train.init_parts says
  // which), with a report of what matched; ignored when the run resumes from its own checkpoint.
  std::string init_from;
  // Resume although the shards differ from the checkpoint's, logging what changed.
  bool allow_data_change = false;
  // With resume "none" in a run.out_dir that holds checkpoints: move them and metrics.jsonl aside
  // to <run.out_dir>/replaced-<UTC time>/ and start afresh (without it the run refuses to start).
  bool overwrite = false;
};

// Holds an exclusive lock on run.out_dir (<run.out_dir>/run.lock, rank 0) for the whole run:
// a second run in the same folder fails at once with the holder's pid and host. A fresh start in a
// folder with checkpoints is refused (PretrainOptions::overwrite). Trains until train.steps and
// returns kExitOk, or, after SIGTERM / SIGINT / SIGUSR1 / SIGHUP on any rank,
// abandons the current step after the micro-batch in progress on every rank, saves a checkpoint
// of the last finished step and returns kExitPreempted. Before the first step it runs the
// start-up dry run (Trainer::dry_run). With a `validator`, validates every train.validate_every
// steps, at the last step and (train.validate_at_start) before the first step. Throws
// xlme::Error on bad input and after train.max_bad_steps non-finite steps in a row (the last good
// checkpoint is kept).
int pretrain(const config::Config& config, const PretrainOptions& options,
             data::BatchSource& source, std::shared_ptr<dist::Communicator> comm,
             const Validator* validator = nullptr);

// With run.threads=0, no OMP_NUM_THREADS and no launcher variable that says how many ranks share
// this host (a launch by hand or by another launcher), the ranks compare host names and each
// takes its share of the cores (runtime::configure_threads); returns the settings, or nullopt
// when nothing changed. Every rank calls it (one exchange through the store).
std::optional<runtime::ThreadSettings> share_cores_among_local_ranks(const config::Config& config,
                                                                     dist::Communicator& comm);

// xlme-pretrain's job: joins the launcher's process group (dist.backend, dist.timeout_s), loads
// the tokenizer (data.tokenizer, which also resolves model.vocab_size 0), reads batches from the
// shards (data.shards) for this rank, reads the held-out pairs (data.heldout) when validation is
// on, and runs pretrain().
int run_pretraining(const config::Config& config, const PretrainOptions& options);

}  // namespace xlme::train
