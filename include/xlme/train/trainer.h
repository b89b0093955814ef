// One optimizer step of XLM-E, read top to bottom
// (docs/ARCHITECTURE.md#one-training-step-through-the-code):
//   fetch every micro-batch of the step -> all-reduce the term counts (the normalizers) ->
//   forward (bf16 autocast when train.precision says so) + backward each micro-batch, agreeing
//   on stop signals after each (read one micro-batch late: no host synchronization) -> all-reduce
//   gradients in buckets (gradient_buckets.h: sent during the last backward with dist.overlap;
//   reduce-scattered with train.zero=1) -> grad norm, read with the statistics in the step's one
//   host synchronization (skip the update if non-finite) -> clip -> AdamW with the scheduled lr ->
//   one record of statistics.
// Losses are normalized by counts summed over every micro-batch and rank, so k micro-batches give
// the gradient of one batch k times larger, and R ranks the gradient of the combined batch.
#pragma once

#include "xlme/checkpoint/background.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/checkpoint/manager.h"
#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/dist/communicator.h"
#include "xlme/model/electra.h"
#include "xlme/objectives/objectives.h"
#include "xlme/objectives/term_sums.h"
#include "xlme/optim/schedule.h"
#include "xlme/optim/zero.h"
#include "xlme/train/global_batch.h"
#include "xlme/train/gradient_buckets.h"
#include "xlme/train/micro_batch_graphs.h"
#include "xlme/train/rng.h"

#include <torch/optim/adamw.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xlme::train {

struct StepRecord {
  int64_t step = 0;  // updates done, this one included
  double lr = 0;
  double loss = 0;       // L of the step, as optimized
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // non-finite loss or gradient: no update
  // A stop signal reached some rank during the step: every rank abandoned it after the same
  // micro-batch, nothing was updated, and step() is still the previous step.
  bool interrupted = false;
  int64_t tokens = 0;  // real tokens in the step, all ranks
  // Model FLOPs of the step, all ranks (training_flops_per_token at each micro-batch's length).
  double flops = 0;
  objectives::TermSummaries terms;  // "mlm" -> {loss, accuracy, ...}
  // The sums behind `terms`, over all micro-batches and ranks (host tensors): add several steps'
  // sums and summarize them to report an interval.
  objectives::TermSums sums;
  // Wall-clock seconds per phase: data (reading and counting), forward, backward (freeing the
  // micro-batch's tensors included; a micro-batch run by a CUDA graph counts whole as backward),
  // communication (collectives, stop-signal agreement and the step's one host read), optimizer
  // (clipping, AdamW). On CUDA they are exact only with set_phase_timing(true), which
  // synchronizes at each boundary.
  std::map<std::string, double> seconds;
};

class PhaseClock;  // train_step's timing of its phases (trainer.cpp)

class Trainer {
 public:
  Trainer(const config::Config& config, model::ElectraModel model, data::BatchSource& source,
          std::shared_ptr<dist::Communicator> comm);

  // One optimizer step (the steps above). After an interrupted step (StepRecord::interrupted) it
  // refuses: the caller saves a checkpoint and stops, and the resumed run repeats the step.
  StepRecord train_step();

  // One forward + backward micro-batch of each task at its maximum length (data.<task>.max_len,
  // train.micro_batch_tokens / max_len sequences) on synthetic tokens, so that a configuration
  // that does not fit in memory fails at start-up with a message naming the task, the batch and
  // the model size. Gradients are dropped and the random generators restored afterwards: the
  // run continues exactly as without it. Every rank calls it (no collective inside).
  void dry_run();

  // Checkpoints (trainer_checkpoint.cpp); every rank calls these at the same step boundary. A
  // checkpoint holds the model, the optimizer (gathered whole with train.zero=1, so that it is the
  // same as without ZeRO), the step, the tokens seen, each rank's reader and RNG state (from
  // before an interrupted step, so that the resumed run repeats it), the resolved config and the
  // tokenizer model. Rank 0 commits it only when every rank's file is in it as that rank wrote it
  // (size and CRC32): a run.out_dir that is not one folder every rank shares fails on every rank,
  // naming the rank and the folder. A failed save leaves no temporary folder. save_checkpoint
  // finishes a save in flight (finish_checkpoint) and returns once the checkpoint is committed.
  std::string save_checkpoint(const checkpoint::CheckpointManager& manager);
  // train.async_save: the same checkpoint, but rank 0 only copies the model and optimizer state to
  // host memory here (the ZeRO-1 gather and the ranks' files stay on the step boundary) and writes,
  // verifies, commits and prunes it on a background thread while training goes on. Returns the
  // path it will have. At most one save is in flight: one still being written is finished first.
  // `manager` must outlive the save (finish_checkpoint, or the trainer's destruction, waits).
  std::string start_checkpoint(const checkpoint::CheckpointManager& manager);
  // Every rank calls it at the same point: waits for the save in flight, and every rank throws
  // xlme::Error naming the checkpoint when rank 0 could not write it (its temporary folder is
  // removed, the earlier checkpoints are kept). Returns its path; nullopt when none was in flight.
  std::optional<std::string> finish_checkpoint();
  // Reads a checkpoint that the caller verified, each file once. Refuses one of another model, or
  // one whose tokens per step this run would change (another world size) unless
  // train.tokens_per_task was changed on purpose, naming the world sizes that keep them.
  void load_checkpoint(const checkpoint::VerifiedFiles& files);

  int64_t step() const { return step_; }
  int64_t tokens_seen() const { return tokens_seen_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t micro_batches_per_task() const { return micro_batches_; }
  // Tokens per step for each task over all ranks (micro-batches x ranks x micro_batch_tokens).
  int64_t tokens_per_step() const { return tokens_per_step_; }
  // The gradient buckets (how many, how many were sent during the last step's backward).
  const GradientBuckets& gradient_buckets() const { return *buckets_; }
  // train.cuda_graphs: the graphs of the micro-batches, or null when off (cuda_graphs_choice()
  // says why).
  const MicroBatchGraphs* cuda_graphs() const { return graphs_.get(); }
  const std::string& cuda_graphs_choice() const { return graphs_choice_; }
  // Called after each micro-batch's forward with the micro-batch and the model's output (the
  // generator's draws, the discriminator's input): what the parity trace records
  // (tests/tools/parity_trace.cpp). Not called for micro-batches replayed by a CUDA graph.
  using ForwardObserver = std::function<void(const data::Batch&, const model::ModelOutput&)>;
  void set_forward_observer(ForwardObserver observer) { observer_ = std::move(observer); }
  // Synchronize the device at phase boundaries so that StepRecord::seconds is exact (benchmarks).
  void set_phase_timing(bool on) { phase_timing_ = on; }
  model::ElectraModel& model() { return model_; }
  const torch::Device& device() const { return device_; }
  bool bf16() const { return bf16_; }
  int64_t parameter_count() const;
  // Whether a stop signal (signals.h) reached any rank, or rank 0's save in flight failed
  // (finish_checkpoint then says why): every rank calls it at the same point and gets the same
  // answer (one all-reduce of a flag and one host read: once per step).
  bool stop_requested();

 private:
  // The pieces of train_step, in the order it calls them.
  void remember_state_before_step();
  std::vector<data::Batch> next_micro_batches();
  torch::Tensor count_micro_batches(const std::vector<data::Batch>& batches) const;
  std::vector<model::ModelInputs> device_inputs(const std::vector<data::Batch>& batches) const;
  // With `graphed` (train.cuda_graphs, not the step's last micro-batch) through graphs_.
  void forward_backward(const data::Batch& batch, const model::ModelInputs& inputs,
                        const std::map<std::string, torch::Tensor>& normalizers,
                        objectives::TermSums& sums, PhaseClock& clock, bool graphed);
  // One micro-batch's terms and its share of the step's normalized L ([], differentiable).
  struct MicroBatchLoss {
    std::vector<objectives::Term> terms;
    torch::Tensor loss;
  };
  MicroBatchLoss forward(const data::Batch& batch, const model::ModelInputs& inputs,
                         const std::map<std::string, torch::Tensor>& normalizers);
  StepRecord abandon_step(StepRecord record);
  torch::Tensor gradient_presence() const;
  torch::Tensor sum_over_ranks(const objectives::TermSums& sums);
  void read_step_totals(StepRecord& record, const objectives::TermSums& sums,
                        const torch::Tensor& reduced_sums, const torch::Tensor& counts);
  void drop_gradients_absent_on_every_rank();
  void update_parameters(StepRecord& record);
  void skip_update(StepRecord& record);
  // The parts of save_checkpoint (`background` false) and start_checkpoint, and of
  // load_checkpoint (trainer_checkpoint.cpp).
  std::string save(const checkpoint::CheckpointManager& manager, bool background);
  void write_rank_file(const std::string& folder, const std::string& file) const;
  void save_model_and_optimizer(const checkpoint::CheckpointManager& manager,
                                const std::string& folder, bool background,
                                const std::vector<torch::Tensor>& exp_avg,
                                const std::vector<torch::Tensor>& exp_avg_sq);
  void check_tokens_per_step(const checkpoint::TrainerState& saved,
                             const std::map<std::string, std::string>& saved_config,
                             const std::string& path) const;
  void load_model_and_optimizer(const checkpoint::VerifiedFiles& files);
  void load_rank_states(const std::vector<std::string>& rank_files);

  config::Config config_;
  model::ElectraModel model_;
  data::BatchSource& source_;
  std::shared_ptr<dist::Communicator> comm_;
  objectives::Objectives objectives_;
  // The checkpoint's format of the optimizer state; with train.zero=1 empty but while a checkpoint
  // is saved or loaded (sharded_ keeps this rank's shard).
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<GradientBuckets> buckets_;
  std::unique_ptr<optim::ShardedAdamW> sharded_;  // train.zero=1
  std::unique_ptr<MicroBatchGraphs> graphs_;      // train.cuda_graphs, when on
  std::string graphs_choice_;
  // Per parameter, after the step's reduction: whether some rank got a gradient for it.
  std::vector<char> present_everywhere_;
  optim::LinearSchedule schedule_;
  std::vector<torch::Tensor> parameters_;
  torch::Device device_;
  int64_t micro_batches_ = 1;
  int64_t tokens_per_step_ = 0;
  int64_t step_ = 0;
  int64_t tokens_seen_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t bad_in_a_row_ = 0;
  bool phase_timing_ = false;
  ForwardObserver observer_;
  bool bf16_ = false;
  // The reader and RNG state before the current step, for a checkpoint after an interruption.
  std::string reader_before_step_;
  GeneratorStates rng_before_step_;
  bool interrupted_ = false;
  // start_checkpoint: the step and path of the save in flight (-1: none), known on every rank;
  // rank 0's background_ writes it. Last member: destroyed first, it waits for the write.
  int64_t pending_step_ = -1;
  std::string pending_path_;
  checkpoint::BackgroundSave background_;
};

}  // namespace xlme::train
