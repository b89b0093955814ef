// The Trainer's step and its parts, the start-up dry run, and the stop vote. Checkpoints are in
// trainer_checkpoint.cpp, the global batch in global_batch.cpp.
#include "xlme/train/trainer.h"

#include "xlme/common/error.h"
#include "xlme/common/precision.h"
#include "xlme/data/synthetic.h"
#include "xlme/optim/optimizer.h"
#include "xlme/train/global_batch.h"
#include "xlme/train/performance.h"
#include "xlme/train/rng.h"
#include "xlme/train/signals.h"

#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#ifdef XLME_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <new>

namespace xlme::train {

using optim::gradient_norm;
using optim::scale_gradients;
using optim::set_learning_rate;

namespace {

constexpr data::Task kTasks[] = {data::Task::kMono, data::Task::kPara};

// XLME_CUDA_SYNC_DEBUG=warn|error: LibTorch's CUDA synchronization check (a warning or an error
// at every call that makes the host wait for the device) over the micro-batch loop, which should
// have none; the step's one read of its totals comes after. Off by default and on the CPU.
class SyncDebugScope {
 public:
  explicit SyncDebugScope(const torch::Device& device) {
#ifdef XLME_WITH_CUDA
    const char* env = std::getenv("XLME_CUDA_SYNC_DEBUG");
    if (!device.is_cuda() || env == nullptr || std::string(env).empty()) return;
    const std::string mode = env;
    XLME_CHECK(mode == "warn" || mode == "error",
               "XLME_CUDA_SYNC_DEBUG is '{}'; it takes warn or error (or nothing: off)", mode);
    auto& state = c10::cuda::warning_state();
    previous_ = static_cast<int>(state.get_sync_debug_mode());
    state.set_sync_debug_mode(mode == "error" ? c10::cuda::SyncDebugMode::L_ERROR
                                              : c10::cuda::SyncDebugMode::L_WARN);
    active_ = true;
#else
    (void)device;
#endif
  }
  ~SyncDebugScope() {
#ifdef XLME_WITH_CUDA
    if (active_) {
      c10::cuda::warning_state().set_sync_debug_mode(
          static_cast<c10::cuda::SyncDebugMode>(previous_));
    }
#endif
  }
  SyncDebugScope(const SyncDebugScope&) = delete;
  SyncDebugScope& operator=(const SyncDebugScope&) = delete;

 private:
  bool active_ = false;
  int previous_ = 0;
};

}  // namespace

// Wall-clock seconds per phase of a step, added into StepRecord::seconds. With `synchronize`, a
// CUDA device is synchronized at each boundary so that the phases are exact.
class PhaseClock {
 public:
  PhaseClock(std::map<std::string, double>& seconds, const torch::Device& device, bool synchronize)
      : seconds_(seconds), synchronize_(synchronize && device.is_cuda()) {}

  // Adds the time since the previous lap (or the start) to `phase`.
  void lap(const char* phase) {
    if (synchronize_) torch::cuda::synchronize();
    const auto now = std::chrono::steady_clock::now();
    seconds_[phase] += std::chrono::duration<double>(now - mark_).count();
    mark_ = now;
  }

 private:
  std::map<std::string, double>& seconds_;
  bool synchronize_;
  std::chrono::steady_clock::time_point mark_ = std::chrono::steady_clock::now();
};

namespace {

// The ranks' agreement on stop signals during a step: after each micro-batch every rank starts a
// sum of the ranks' flags and reads the previous micro-batch's (the last one's at once), so that
// no host synchronization drains the GPU's queue; a preempted run gives up the step within two
// micro-batches.
class StopVote {
 public:
  explicit StopVote(dist::Communicator& comm) : comm_(comm) {}

  // Every rank calls it after each micro-batch and gets the same answer: true when the step is to
  // be abandoned.
  bool after_micro_batch(bool last) {
    dist::PendingSum stop = comm_.start_sum(stop_signal() != 0 ? 1.0 : 0.0);
    bool stopping = previous_.pending() && previous_.get() > 0;
    if (!stopping && last) stopping = stop.get() > 0;
    previous_ = std::move(stop);
    if (stopping && previous_.pending()) previous_.get();  // every rank started it: finish it
    return stopping;
  }

 private:
  dist::Communicator& comm_;
  dist::PendingSum previous_;
};

// Scales the gradients of `parameters` to global norm `max_norm` when their norm `norm` exceeds it
// (max_norm 0: no clipping).
void clip_gradients(std::vector<torch::Tensor>& parameters, double max_norm, double norm) {
  if (max_norm > 0 && norm > max_norm) scale_gradients(parameters, max_norm / (norm + 1e-6));
}

// `t` summed over the ranks (one all-reduce).
torch::Tensor summed_over_ranks(dist::Communicator& comm, torch::Tensor t) {
  std::vector<torch::Tensor> one{std::move(t)};
  comm.all_reduce_sum(one);
  return one[0];
}

}  // namespace

// --- Trainer ------------------------------------------------------------------------------------

Trainer::Trainer(const config::Config& config, model::ElectraModel model, data::BatchSource& source,
                 std::shared_ptr<dist::Communicator> comm)
    : config_(config),
      model_(std::move(model)),
      source_(source),
      comm_(std::move(comm)),
      objectives_(config.objectives, config.distill),
      schedule_(config.train.lr, config.train.warmup_steps, config.train.steps),
      device_(comm_->device()) {
  model_->to(device_);
  parameters_ = model_->parameters();
  // Every rank starts from rank 0's weights (and buffers), whatever its own initialization.
  std::vector<torch::Tensor> state = parameters_;
  for (const auto& buffer : model_->buffers()) state.push_back(buffer);
  dist::broadcast_tensors(*comm_, state, 0);
  optimizer_ = optim::make_adamw(parameters_, config.train);
  const bool zero = config.train.zero == 1;
  buckets_ = std::make_unique<GradientBuckets>(
      parameters_, config.dist.bucket_mb << 20, *comm_,
      zero ? GradientBuckets::Reduction::kReduceScatter : GradientBuckets::Reduction::kAllReduce);
  if (zero) {
    sharded_ = std::make_unique<optim::ShardedAdamW>(parameters_, buckets_->segments(),
                                                     buckets_->shard_size(), config.train);
  }
  // Enough micro-batches per task for train.tokens_per_task tokens over all ranks.
  const GlobalBatch batch = global_batch(config.train, comm_->world_size());
  micro_batches_ = batch.micro_batches;
  tokens_per_step_ = batch.tokens_per_step;
  if (comm_->rank() == 0) log_global_batch(batch, config.train, comm_->world_size());
  const auto graphs = MicroBatchGraphs::choose(config, device_);
  graphs_choice_ = graphs.reason;
  if (graphs.on) graphs_ = std::make_unique<MicroBatchGraphs>(*buckets_);
  if (comm_->rank() == 0) spdlog::info("cuda graphs: {}", graphs_choice_);
  bf16_ = uses_bf16(config.train.precision, device_);
  enable_tf32(device_);
  // run.seed made the model; dropout and sampling draw from this rank's own streams.
  seed_generators(training_seed(config.run.seed, comm_->rank()), device_);
}

int64_t Trainer::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters_) n += p.numel();
  return n;
}

bool Trainer::stop_requested() {
  // Rank 0's failed background save stops every rank at this step: finish_checkpoint() then
  // reports it (the run loop saves, or fails, when it stops).
  const bool stop = stop_signal() != 0 || background_.failed();
  return comm_->start_sum(stop ? 1.0 : 0.0).get() > 0;
}

void Trainer::dry_run() {
  ForkedRng fork(device_);  // dropout and sampling draw from a fork: training is unchanged
  model_->train();
  buckets_->attach();
  for (const data::Task task : kTasks) {
    if (objectives_.term_names(task).empty()) continue;
    const bool mono = task == data::Task::kMono;
    const int64_t length = mono ? config_.data.mono.max_len : config_.data.para.max_len;
    const int64_t rows = std::max<int64_t>(1, config_.train.micro_batch_tokens / length);
    try {
      data::SyntheticBatches synthetic(model_->special_ids(), rows, length,
                                       config_.objectives.mask_ratio, config_.run.seed);
      synthetic.set_sentence_pairs(config_.model.cross_attention);  // VECO splits pairs
      const data::Batch batch = synthetic.next(task);
      forward(batch, device_inputs({batch}).front(),
              objectives_.normalizers(count_micro_batches({batch})))
          .loss.backward();
      if (device_.is_cuda()) torch::cuda::synchronize();  // asynchronous errors surface here
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool memory = what.find("out of memory") != std::string::npos ||
                          what.find("allocate") != std::string::npos ||
                          dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
      XLME_FAIL(
          "start-up dry run: one {} micro-batch of {} sequences x {} tokens "
          "(train.micro_batch_tokens "
          "{}, data.{}.max_len {}, precision {}) on the {:.1f}M-parameter model (model.hidden_size "
          "{}, model.layers {} + generator {}) failed on {}: {}{}",
          mono ? "MRTD" : "TRTD", rows, length, config_.train.micro_batch_tokens,
          mono ? "mono" : "para", length, bf16_ ? "bf16" : "fp32",
          static_cast<double>(parameter_count()) / 1e6, config_.model.hidden_size,
          config_.model.layers, config_.model.generator.layers, device_.str(),
          what.substr(0, what.find('\n')),
          memory ? "; it does not fit in memory: lower train.micro_batch_tokens (the step keeps "
                   "train.tokens_per_task with more micro-batches) or the model size"
                 : "");
    }
  }
  // Gradients dropped, not zeroed: a parameter that no step touches must stay without one.
  optim::clear_gradients(parameters_);
  buckets_->release();
}

StepRecord Trainer::train_step() {
  XLME_CHECK(!interrupted_,
             "train_step after an interrupted step: save the checkpoint and stop (the resumed run "
             "repeats the step)");
  model_->train();
  StepRecord record;
  PhaseClock clock(record.seconds, device_, phase_timing_);
  remember_state_before_step();
  buckets_->attach();

  // 1. Every micro-batch of the step, and the counts its terms are normalized by (all ranks).
  const std::vector<data::Batch> batches = next_micro_batches();
  torch::Tensor counts = count_micro_batches(batches);
  const std::vector<model::ModelInputs> inputs = device_inputs(batches);
  clock.lap("data");
  counts = summed_over_ranks(*comm_, counts);
  clock.lap("communication");
  const auto step_normalizers = objectives_.normalizers(counts);
  // With CUDA graphs, the tensors the graphs read, holding this step's values.
  const auto& normalizers = graphs_ ? graphs_->normalizers(step_normalizers) : step_normalizers;

  // 2. Forward and backward, one micro-batch at a time; gradients and term sums accumulate. A
  // stop signal on any rank abandons the step.
  // One autocast scope over all of them: autocast casts each weight to bf16 once per step and
  // reuses the copy in every micro-batch (its cache lives until the scope ends, before the
  // optimizer changes the weights).
  objectives::TermSums sums(objectives_);
  StopVote stop(*comm_);
  {
    const AutocastScope step_autocast(device_, bf16_);
    const SyncDebugScope no_host_waits(device_);
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const bool last = b + 1 == batches.size();
      // The last backward sends each gradient bucket as it completes (dist.overlap), and the
      // buckets left are sent right after it, before the stop vote's sum on every rank.
      if (last) buckets_->arm(config_.dist.overlap);
      forward_backward(batches[b], inputs[b], normalizers, sums, clock, graphs_ && !last);
      if (last) buckets_->flush();
      const bool stopping = stop.after_micro_batch(last);
      clock.lap("communication");
      if (stopping) return abandon_step(std::move(record));
    }
  }

  // 3. Gradients (waited for) and term sums summed over ranks.
  const torch::Tensor reduced_sums = sum_over_ranks(sums);
  clock.lap("communication");

  // 4. The step's one host synchronization: term sums, tokens, FLOPs, global gradient norm.
  read_step_totals(record, sums, reduced_sums, counts);
  record.lr = schedule_.lr(step_);
  record.step = ++step_;
  tokens_seen_ += record.tokens;

  // 5. Skip a non-finite update; otherwise clip, step with the scheduled lr, zero the gradients.
  update_parameters(record);
  clock.lap("optimizer");
  return record;
}

// The reader and RNG state before the step, saved instead of the current ones should the step be
// interrupted (the resumed run then reads and draws it again).
void Trainer::remember_state_before_step() {
  reader_before_step_ = source_.state();
  rng_before_step_ = generator_states(device_);
}

// One micro-batch forward and backward: its gradients add to the parameters', its terms to
// `sums`; its activations and outputs are freed inside the backward phase.
void Trainer::forward_backward(const data::Batch& batch, const model::ModelInputs& inputs,
                               const std::map<std::string, torch::Tensor>& normalizers,
                               objectives::TermSums& sums, PhaseClock& clock, bool graphed) {
  if (graphed && inputs.sides.empty()) {
    // Captured or replayed whole: the clock counts it as backward.
    const auto pass = [&](const model::ModelInputs& in) {
      const MicroBatchLoss micro = forward(batch, in, normalizers);
      const AutocastPause no_autocast(device_);
      micro.loss.backward();
      return micro.terms;
    };
    const char* task = batch.task == data::Task::kMono ? "mono" : "para";
    sums.add(graphs_->run(micro_batch_shape(task, inputs), inputs, pass));
    clock.lap("backward");
    return;
  }
  {
    const MicroBatchLoss micro = forward(batch, inputs, normalizers);
    clock.lap("forward");
    const AutocastPause no_autocast(device_);  // the backward as outside autocast
    micro.loss.backward();
    sums.add(micro.terms);
  }
  clock.lap("backward");
}

// With more than one process: 1 for each parameter that has a gradient on this rank, else 0
// (float64 [parameters] on the device, copied from pinned memory on a GPU so that the copy does
// not wait for the queue). Empty with one process.
torch::Tensor Trainer::gradient_presence() const {
  const auto options = torch::TensorOptions(torch::kFloat64);
  if (comm_->world_size() == 1) return torch::empty({0}, options.device(device_));
  auto host = torch::empty({static_cast<int64_t>(parameters_.size())},
                           options.pinned_memory(device_.is_cuda()));
  double* flags = host.data_ptr<double>();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    *flags++ = buckets_->present(i) ? 1.0 : 0.0;
  }
  return host.to(device_, /*non_blocking=*/true);
}

// Waits for the gradient buckets (sent during and after the last backward) and returns `sums`
// flattened and summed over the ranks: losses were divided by global counts, so the sum of the
// ranks' gradients is the gradient of the step's L. gradient_presence() rides along with the sums
// (no collective of its own): every parameter's gradient is a view of a zeroed bucket, and
// read_step_totals drops the gradients no rank had. With ZeRO-1 the squared norm of this rank's
// shard of the gradients rides along too: their sum is the squared global norm.
// [term sums, gradient presence (more than one process), squared norm (ZeRO-1)]
torch::Tensor Trainer::sum_over_ranks(const objectives::TermSums& sums) {
  std::vector<torch::Tensor> parts{sums.flatten(device_), gradient_presence()};
  buckets_->wait();
  if (sharded_) {
    parts.push_back(
        torch::linalg_vector_norm(buckets_->shard(), 2, c10::nullopt, false, torch::kFloat64)
            .pow(2)
            .reshape({1}));
  }
  if (comm_->world_size() == 1) {
    present_everywhere_.assign(parameters_.size(), 0);
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      present_everywhere_[i] = buckets_->present(i);
    if (!sharded_) drop_gradients_absent_on_every_rank();  // the norm leaves them out
  }
  return summed_over_ranks(*comm_, torch::cat(parts));
}

// A parameter that got no gradient on any rank (e.g. the last layer's FFN of a distillation
// student without distill.hidden_cosine) loses the zero gradient its bucket gave it, so that
// the optimizer leaves it and its moments alone: AdamW would otherwise decay its weights every
// step. Reads present_everywhere_.
void Trainer::drop_gradients_absent_on_every_rank() {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!present_everywhere_[i]) parameters_[i].mutable_grad() = torch::Tensor();
  }
}

// The optimizer step with `record`'s lr after gradient clipping, or skip_update when the loss or
// the gradient norm is not finite.
void Trainer::update_parameters(StepRecord& record) {
  if (!std::isfinite(record.grad_norm) || !std::isfinite(record.loss)) {
    skip_update(record);
    return;
  }
  bad_in_a_row_ = 0;
  if (sharded_) {
    // ZeRO-1: this rank clips and steps its shard, then every rank gets every rank's weights.
    const double max_norm = config_.train.clip_norm;
    if (max_norm > 0 && record.grad_norm > max_norm) {
      buckets_->shard().mul_(max_norm / (record.grad_norm + 1e-6));
    }
    sharded_->step(buckets_->shard(), present_everywhere_, record.lr);
    buckets_->all_gather_parameters();
  } else {
    clip_gradients(parameters_, config_.train.clip_norm, record.grad_norm);
    set_learning_rate(*optimizer_, record.lr);
    optimizer_->step();
  }
  optim::clear_gradients(parameters_);
  buckets_->release();
}

std::vector<data::Batch> Trainer::next_micro_batches() {
  std::vector<data::Batch> batches;
  for (const data::Task task : kTasks) {
    if (objectives_.term_names(task).empty()) continue;
    for (int64_t i = 0; i < micro_batches_; ++i) batches.push_back(source_.next(task));
  }
  return batches;
}

// [term counts..., real tokens, model FLOPs] of this rank's micro-batches, float64 on the device:
// the counts (objectives::Objectives::counts) are known from the host batches before any forward
// pass, so that every micro-batch's loss is divided by the step's global counts.
torch::Tensor Trainer::count_micro_batches(const std::vector<data::Batch>& batches) const {
  const std::size_t terms = objectives_.term_names().size();
  std::vector<double> counts(terms + 2, 0.0);
  for (const auto& batch : batches) {
    const auto term_counts = objectives_.counts(batch);
    for (std::size_t n = 0; n < terms; ++n) counts[n] += term_counts[n];
    const auto tokens = static_cast<double>(batch.real_tokens);
    counts[terms] += tokens;
    counts[terms + 1] +=
        tokens * training_flops_per_token(config_, batch.input_ids.size(1), model_->teacher());
  }
  auto host = torch::tensor(counts, torch::kFloat64);
  // From pinned memory the copy is queued; from pageable memory it would wait for the stream.
  if (device_.is_cuda()) host = host.pin_memory();
  return host.to(device_, /*non_blocking=*/true);
}

// Every micro-batch's model inputs on the device, all copies queued at the step's start from
// pinned memory (a few hundred kB per micro-batch), so that no copy waits inside the loop.
std::vector<model::ModelInputs> Trainer::device_inputs(
    const std::vector<data::Batch>& batches) const {
  std::vector<model::ModelInputs> inputs;
  inputs.reserve(batches.size());
  for (const auto& batch : batches) {
    auto host = model_->inputs(batch);
    // CUDA graphs: the generator's rows padded to the most this shape can mask, so that the
    // micro-batches of a shape repeat one graph (every micro-batch: the draws stay those of a run
    // whose micro-batches all had graphs, eager ones included).
    if (graphs_ && host.sides.empty()) {
      const int64_t capacity = model::masked_capacity(host.labels.size(0), host.labels.size(1),
                                                      config_.objectives.mask_ratio);
      if (host.masked_index.size(0) <= capacity) host = host.padded_masked(capacity);
    }
    if (device_.is_cuda()) host = host.pinned();
    inputs.push_back(host.to(device_, /*non_blocking=*/true));
  }
  return inputs;
}

Trainer::MicroBatchLoss Trainer::forward(const data::Batch& batch, const model::ModelInputs& inputs,
                                         const std::map<std::string, torch::Tensor>& normalizers) {
  AutocastScope autocast(device_, bf16_);
  MicroBatchLoss micro;
  const model::ModelOutput output = model_->forward(inputs);
  if (observer_) observer_(batch, output);
  micro.terms = objectives_.compute(output, batch.task);
  micro.loss = objectives::weighted_loss(micro.terms, normalizers);
  return micro;
}

// Every rank abandoned the step after the same micro-batch: nothing is updated, and step() is
// still the previous step.
StepRecord Trainer::abandon_step(StepRecord record) {
  buckets_->wait();  // the buckets every rank sent after the last backward
  for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
  buckets_->release();
  interrupted_ = true;
  record.interrupted = true;
  record.step = step_;
  return record;
}

// Reads the reduced term sums, the step's real tokens and FLOPs (the tail of `counts`) and the
// gradient norm over both models to the host in one copy, into `record`.
void Trainer::read_step_totals(StepRecord& record, const objectives::TermSums& sums,
                               const torch::Tensor& reduced_sums, const torch::Tensor& counts) {
  const int64_t terms = static_cast<int64_t>(objectives_.term_names().size());
  const int64_t presence_size =
      comm_->world_size() > 1 ? static_cast<int64_t>(parameters_.size()) : 0;
  // ZeRO-1: the global norm from the summed squared norms of the shards.
  const torch::Tensor norm = sharded_ ? reduced_sums.narrow(0, reduced_sums.size(0) - 1, 1).sqrt()
                                      : gradient_norm(parameters_).to(torch::kFloat64).reshape({1});
  // [term sums, gradient presence (more than one process), tokens, FLOPs, gradient norm]
  const auto host = torch::cat({reduced_sums.narrow(0, 0, sums.flat_size() + presence_size),
                                counts.narrow(0, terms, 2), norm})
                        .cpu();
  record.sums = sums.unflatten(host.narrow(0, 0, sums.flat_size()));
  record.terms = record.sums.summary();
  record.loss = record.sums.total_loss();
  const double* presence = host.data_ptr<double>() + sums.flat_size();
  if (presence_size > 0) {
    present_everywhere_.assign(parameters_.size(), 0);
    for (int64_t i = 0; i < presence_size; ++i) present_everywhere_[i] = presence[i] != 0.0;
    if (!sharded_) drop_gradients_absent_on_every_rank();
  }
  const double* tail = presence + presence_size;
  record.tokens = static_cast<int64_t>(tail[0]);
  record.flops = tail[1];
  record.grad_norm = tail[2];
}

// A non-finite loss or gradient norm: the gradients are dropped without an update; after
// train.max_bad_steps such steps in a row the run stops.
void Trainer::skip_update(StepRecord& record) {
  optim::clear_gradients(parameters_);
  buckets_->release();
  record.skipped = true;
  ++skipped_steps_;
  ++bad_in_a_row_;
  spdlog::warn("step {}: non-finite loss ({}) or gradient norm ({}); update skipped ({} in a row)",
               step_, record.loss, record.grad_norm, bad_in_a_row_);
  XLME_CHECK(bad_in_a_row_ < config_.train.max_bad_steps,
             "{} optimizer steps in a row had a non-finite loss or gradient norm "
             "(train.max_bad_steps); stopping with the last good checkpoint intact. Lower "
             "train.lr, raise train.warmup_steps, or inspect the data of the last steps",
             bad_in_a_row_);
}

}  // namespace xlme::train
