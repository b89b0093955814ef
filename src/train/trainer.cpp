#include "xlme/train/trainer.h"

#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/precision.h"
#include "xlme/config/yaml_file.h"
#include "xlme/data/synthetic.h"
#include "xlme/optim/optimizer.h"
#include "xlme/train/performance.h"
#include "xlme/train/rng.h"
#include "xlme/train/signals.h"

#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <yaml-cpp/yaml.h>

#ifdef XLME_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <mutex>
#include <set>

namespace xlme::train {

using checkpoint::CheckpointManager;
using checkpoint::VerifiedFiles;
using optim::gradient_norm;
using optim::scale_gradients;
using optim::set_learning_rate;

namespace {

namespace fs = std::filesystem;

constexpr data::Task kTasks[] = {data::Task::kMono, data::Task::kPara};

// The most optimizer states per parameter a checkpoint may hold: AdamW's two moments, and the
// maximum of the second with amsgrad.
constexpr uint64_t kMaxOptimizerStates = 3;

// The most tensor data of a rank's file (its random generators' states, a few kilobytes) and of
// the optimizer's step counters.
constexpr uint64_t kMaxRankStateBytes = 16u << 20;

}  // namespace

namespace {

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

// --- The global batch ---------------------------------------------------------------------------

std::optional<GlobalBatch> try_global_batch(const config::TrainConfig& train, int world_size) {
  const int64_t per_round = static_cast<int64_t>(world_size) * train.micro_batch_tokens;
  const int64_t below = train.tokens_per_task / per_round;
  const bool exact = below * per_round == train.tokens_per_task;
  int64_t micro_batches = below;
  if (!exact) {
    if (train.batch_rounding == "up") {
      micro_batches = below + 1;
    } else if (train.batch_rounding != "down") {
      return std::nullopt;  // error
    }
  }
  if (micro_batches < 1) return std::nullopt;
  return GlobalBatch{micro_batches, micro_batches * per_round};
}

std::vector<int> world_sizes_with(const config::TrainConfig& train, int64_t tokens_per_step,
                                  int world_size, std::size_t count) {
  std::vector<int> found;
  for (int w = 1; w <= 4096; ++w) {
    const auto batch = try_global_batch(train, w);
    if (batch && batch->tokens_per_step == tokens_per_step) found.push_back(w);
  }
  std::stable_sort(found.begin(), found.end(), [&](int a, int b) {
    return std::abs(a - world_size) < std::abs(b - world_size);
  });
  if (found.size() > count) found.resize(count);
  std::sort(found.begin(), found.end());
  return found;
}

GlobalBatch global_batch(const config::TrainConfig& train, int world_size) {
  if (const auto batch = try_global_batch(train, world_size)) return *batch;
  const int64_t per_round = static_cast<int64_t>(world_size) * train.micro_batch_tokens;
  const auto change = [&](int64_t micro_batches) {
    if (micro_batches < 1) return std::string("no micro-batch: not possible");
    return fmt::format(
        "{} per rank, {} tokens per step, {:+.1f}%", micro_batches, micro_batches * per_round,
        100.0 * static_cast<double>(micro_batches * per_round - train.tokens_per_task) /
            static_cast<double>(train.tokens_per_task));
  };
  const int64_t below = train.tokens_per_task / per_round;
  std::string valid = "none: train.tokens_per_task is not a multiple of train.micro_batch_tokens";
  auto exact = train;
  exact.batch_rounding = "error";
  if (const auto sizes = world_sizes_with(exact, train.tokens_per_task, world_size);
      !sizes.empty()) {
    valid = fmt::format("{}", fmt::join(sizes, ", "));
  }
  XLME_FAIL(
      "train.tokens_per_task = {} is not a whole number of micro-batches over {} rank(s) "
      "(train.micro_batch_tokens = {}: {:.3g} per rank){}; the world sizes nearest to {} that "
      "divide it: {}. Launch on one of those, change train.tokens_per_task or "
      "train.micro_batch_tokens, or set train.batch_rounding=up ({}) or down ({})",
      train.tokens_per_task, world_size, train.micro_batch_tokens,
      static_cast<double>(train.tokens_per_task) / static_cast<double>(per_round),
      train.batch_rounding == "down" ? " and rounding down leaves no micro-batch" : "", world_size,
      valid, change(below + 1), change(below));
}

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
  if (comm_->rank() == 0) {
    const std::string said = fmt::format(
        "tokens per step: {} per task ({} micro-batch(es) of train.micro_batch_tokens = {} on "
        "each of {} rank(s))",
        tokens_per_step_, micro_batches_, config.train.micro_batch_tokens, comm_->world_size());
    if (tokens_per_step_ == config.train.tokens_per_task) {
      spdlog::info("{} = train.tokens_per_task", said);
    } else {
      spdlog::warn(
          "{}, not train.tokens_per_task = {}: rounded {} (train.batch_rounding) to whole "
          "micro-batches on every rank ({:+.1f}%)",
          said, config.train.tokens_per_task, config.train.batch_rounding,
          100.0 * static_cast<double>(tokens_per_step_ - config.train.tokens_per_task) /
              static_cast<double>(config.train.tokens_per_task));
    }
  }
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

namespace {

// The size and CRC32 of the file each rank wrote, [2 x world] (-1: not written), as a slot per rank
// summed over the ranks.
std::vector<double> rank_file_records(dist::Communicator& comm, const std::string& file,
                                      bool written) {
  std::vector<double> records(2 * static_cast<std::size_t>(comm.world_size()), 0.0);
  const auto r = static_cast<std::size_t>(comm.rank());
  std::error_code ec;
  const auto size = written ? fs::file_size(file, ec) : 0;
  records[2 * r] = written && !ec ? static_cast<double>(size) : -1.0;
  records[2 * r + 1] = written && !ec ? static_cast<double>(file_crc32(file)) : 0.0;
  return comm.reduce_scalars(records, dist::ScalarOp::kSum);
}

// Throws, naming the rank and the folder, unless every rank's file is in rank 0's `folder` as that
// rank wrote it (`records`: rank_file_records).
void check_rank_files(const std::string& folder, const std::vector<double>& records) {
  const std::string shared =
      "rank 0 commits a checkpoint only with every rank's file in it: run.out_dir must be one "
      "folder that every rank shares (a file system every node mounts at the same path)";
  for (std::size_t r = 0; 2 * r < records.size(); ++r) {
    const std::string file =
        (fs::path(folder) / checkpoint::rank_file(static_cast<int>(r))).string();
    XLME_CHECK(records[2 * r] >= 0,
               "checkpoint not saved: rank {} could not write {} into the checkpoint folder '{}' "
               "(its log says why); {}",
               r, checkpoint::rank_file(static_cast<int>(r)), folder, shared);
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    XLME_CHECK(!ec,
               "checkpoint not saved: rank {}'s file is not in rank 0's checkpoint folder "
               "'{}' ({} is missing: rank {} wrote it into another folder of the same name); {}",
               r, folder, checkpoint::rank_file(static_cast<int>(r)), r, shared);
    XLME_CHECK(static_cast<double>(size) == records[2 * r] &&
                   static_cast<double>(file_crc32(file)) == records[2 * r + 1],
               "checkpoint not saved: {} in rank 0's checkpoint folder '{}' is not the file rank "
               "{} wrote ({} bytes there, {} written: another run's, or rank {} wrote into another "
               "folder of the same name); {}",
               checkpoint::rank_file(static_cast<int>(r)), folder, r, size, records[2 * r], r,
               shared);
  }
}

// The step's model and optimizer state as archives that own host copies of every tensor (the
// copy the background write reads while training goes on), or that refer to the live tensors
// (a save that writes before training continues). Tensors shared between modules are copied once.
class StateArchives {
 public:
  explicit StateArchives(bool copy) : copy_(copy) {}

  void add_model(const torch::nn::Module& model) {
    if (!copy_) {
      model.save(model_);
      return;
    }
    add_module(model, model_);
  }

  // `optimizer` as its save() writes it, with its state's tensors copied unless `owned` (the
  // state is a copy already: ZeRO-1's gathered moments).
  void add_optimizer(torch::optim::AdamW& optimizer, bool owned) {
    if (!copy_ || owned) {
      optimizer.save(optimizer_);
      return;
    }
    using State = torch::optim::AdamWParamState;
    using StateMap = std::decay_t<decltype(optimizer.state())>;
    auto& state = optimizer.state();
    StateMap live = std::move(state);
    state.clear();
    // The live state is put back whatever happens.
    struct Restore {
      torch::optim::AdamW& optimizer;
      StateMap& saved;
      ~Restore() { optimizer.state() = std::move(saved); }
    } restore{optimizer, live};
    for (const auto& [key, value] : live) {
      const auto& moments = static_cast<const State&>(*value);
      auto copy = std::make_unique<State>();
      copy->step(moments.step());
      copy->exp_avg(host_copy(moments.exp_avg()));
      copy->exp_avg_sq(host_copy(moments.exp_avg_sq()));
      if (moments.max_exp_avg_sq().defined()) {
        copy->max_exp_avg_sq(host_copy(moments.max_exp_avg_sq()));
      }
      state.emplace(key, std::move(copy));
    }
    optimizer.save(optimizer_);
  }

  torch::serialize::OutputArchive& model() { return model_; }
  torch::serialize::OutputArchive& optimizer() { return optimizer_; }

 private:
  // What Module::save writes, with copies of the tensors.
  void add_module(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
    for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
      archive.write(parameter.key(), host_copy(parameter.value()));
    }
    for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
      archive.write(buffer.key(), host_copy(buffer.value()), /*is_buffer=*/true);
    }
    for (const auto& child : module.named_children()) {
      if (!child.value()->is_serializable()) continue;
      torch::serialize::OutputArchive child_archive(archive.compilation_unit());
      add_module(*child.value(), child_archive);
      archive.write(child.key(), child_archive);
    }
  }

  torch::Tensor host_copy(const torch::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    const auto found = copies_.find(tensor.unsafeGetTensorImpl());
    if (found != copies_.end()) return found->second;
    torch::NoGradGuard no_grad;
    torch::Tensor copy = tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    copy.set_requires_grad(tensor.requires_grad());
    copies_.emplace(tensor.unsafeGetTensorImpl(), copy);
    return copy;
  }

  bool copy_;
  torch::serialize::OutputArchive model_, optimizer_;
  std::map<const void*, torch::Tensor> copies_;
};

}  // namespace

std::string Trainer::save_checkpoint(const CheckpointManager& manager) {
  finish_checkpoint();
  return save(manager, /*background=*/false);
}

std::string Trainer::start_checkpoint(const CheckpointManager& manager) {
  finish_checkpoint();
  return save(manager, /*background=*/true);
}

std::optional<std::string> Trainer::finish_checkpoint() {
  if (pending_step_ < 0) return std::nullopt;
  const int64_t step = pending_step_;
  pending_step_ = -1;
  const bool leader = comm_->rank() == 0;
  std::string error;
  if (leader) {
    try {
      background_.wait();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Every rank learns the outcome at the same point, on the training thread.
  const bool saved =
      comm_->reduce_scalars({leader && error.empty() ? 1.0 : 0.0}, dist::ScalarOp::kSum).front() >
      0;
  XLME_CHECK(error.empty(),
             "the checkpoint of step {} ('{}'), written in the background, was not saved: {}; "
             "its temporary folder was removed and the earlier checkpoints are kept: fix the "
             "cause and resume with --resume auto",
             step, pending_path_, error);
  XLME_CHECK(saved,
             "rank {}: rank 0 could not write the checkpoint of step {} in the background (its "
             "log says why); the earlier checkpoints are kept: resume with --resume auto",
             comm_->rank(), step);
  if (!leader) spdlog::info("checkpoint: {} (written by rank 0 in the background)", pending_path_);
  return pending_path_;
}

std::string Trainer::save(const CheckpointManager& manager, bool background) {
  // ZeRO-1: the optimizer state gathered from every rank's shard (every rank takes part) into
  // rank 0's host memory, where the checkpoint is written from.
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  if (sharded_) {
    exp_avg = buckets_->gather_whole(sharded_->exp_avg(), comm_->rank() == 0);
    exp_avg_sq = buckets_->gather_whole(sharded_->exp_avg_sq(), comm_->rank() == 0);
  }
  // The same collectives on every rank whatever fails: barrier (rank 0 made the temporary
  // folder), the ranks' file records, rank 0's verdict. So a failure on one rank ends the save on
  // every rank with an error instead of leaving the others waiting.
  const bool leader = comm_->rank() == 0;
  std::exception_ptr error;  // this rank's, when its part failed
  if (leader) {
    try {
      manager.begin(step_);
    } catch (...) {
      error = std::current_exception();
    }
  }
  comm_->barrier();
  const std::string folder = manager.temporary_path_for(step_);
  const std::string my_file = (fs::path(folder) / checkpoint::rank_file(comm_->rank())).string();
  bool written = false;
  if (!error) {
    try {
      // The reader and RNG state of this rank (before an interrupted step: that step is repeated).
      XLME_CHECK(fs::is_directory(folder),
                 "rank {}: the checkpoint folder '{}' that rank 0 made is not there: run.out_dir "
                 "'{}' is not a folder every rank shares",
                 comm_->rank(), folder, config_.run.out_dir);
      torch::serialize::OutputArchive archive;
      archive.write("reader", c10::IValue(interrupted_ ? reader_before_step_ : source_.state()));
      const GeneratorStates rng = interrupted_ ? rng_before_step_ : generator_states(device_);
      archive.write("rng_cpu", rng.cpu);
      if (rng.device.defined()) archive.write("rng_device", rng.device);
      checkpoint::save_archive(archive, my_file);
      written = true;
    } catch (...) {
      error = std::current_exception();
    }
  }
  const std::vector<double> records = rank_file_records(*comm_, my_file, written);
  if (leader && !error) {
    try {
      check_rank_files(folder, records);
      // In the background the archives own copies of the tensors: training changes the live ones.
      auto archives = std::make_shared<StateArchives>(background);
      archives->add_model(*model_);
      if (sharded_) sharded_->put_whole_into(*optimizer_, exp_avg, exp_avg_sq);
      archives->add_optimizer(*optimizer_, /*owned=*/sharded_ != nullptr);
      if (sharded_) optimizer_->state().clear();
      const checkpoint::TrainerState state{step_, tokens_seen_, skipped_steps_, comm_->world_size(),
                                           tokens_per_step_};
      const int64_t step = step_;
      // File I/O alone (no collective): it may run on the background thread.
      auto write = [archives, state, config = config_, folder, step, background, &manager]() {
        const auto start = std::chrono::steady_clock::now();
        try {
          const auto file = [&](const char* name) { return (fs::path(folder) / name).string(); };
          checkpoint::save_archive(archives->model(), file(checkpoint::kModelFile));
          checkpoint::save_archive(archives->optimizer(), file(checkpoint::kOptimizerFile));
          checkpoint::write_trainer_state(file(checkpoint::kTrainerStateFile), state);
          config::save_config(config, file(checkpoint::kConfigFile));
          if (!config.data.tokenizer.empty() && fs::is_regular_file(config.data.tokenizer)) {
            write_file_atomic(file(checkpoint::kTokenizerFile),
                              read_file(config.data.tokenizer, "tokenizer"));
          }
          const std::string path = manager.commit(step);
          if (background) {
            spdlog::info(
                "checkpoint: {} (written in the background in {:.1f} s)", path,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
          }
          return path;
        } catch (...) {
          manager.abort(step);  // no temporary folder is left behind
          throw;
        }
      };
      if (background) {
        background_.start(step_, std::move(write));
      } else {
        write();
      }
    } catch (...) {
      if (sharded_) optimizer_->state().clear();
      error = std::current_exception();
    }
  }
  // A save that fails leaves the earlier checkpoints as they were and no temporary folder.
  if (leader && error) manager.abort(step_);
  const bool saved =
      comm_->reduce_scalars({leader && !error ? 1.0 : 0.0}, dist::ScalarOp::kSum).front() > 0;
  if (error) std::rethrow_exception(error);
  XLME_CHECK(saved,
             "rank {}: rank 0 did not save the checkpoint of step {} (its log says why); no "
             "checkpoint was written",
             comm_->rank(), step_);
  if (background) {
    // Every rank: finish_checkpoint() collects the outcome at a later step boundary.
    pending_step_ = step_;
    pending_path_ = manager.path_for(step_);
  }
  return manager.path_for(step_);
}

namespace {

// The model.* fields in which the checkpoint's config file `saved_config` differs from `config`,
// as "model.hidden_size: 32 in the checkpoint, 64 now"; empty when they agree or the checkpoint's
// config could not be read (`saved` empty). Dropout, initialization and sampling temperature may
// change on resume.
std::vector<std::string> model_differences(const config::Config& config,
                                           const std::map<std::string, std::string>& saved) {
  static const std::set<std::string> may_change = {"model.dropout", "model.attention_dropout",
                                                   "model.init_std",
                                                   "model.generator.sampling_temperature"};
  const auto current = config::flat_values(config::to_yaml(config));
  std::vector<std::string> out;
  for (const auto& [key, value] : current) {
    if (key.rfind("model.", 0) != 0 || may_change.count(key)) continue;
    const auto it = saved.find(key);
    if (it != saved.end() && it->second != value) {
      out.push_back(fmt::format("{}: {} in the checkpoint, {} now", key, it->second, value));
    }
  }
  return out;
}

// The checkpoint's config.yaml as flat_values; empty when it cannot be read.
std::map<std::string, std::string> saved_values(const std::string& file) {
  try {
    return config::flat_values(YAML::Dump(config::load_yaml_file(file)));
  } catch (const YAML::Exception&) {
    return {};
  }
}

}  // namespace

// Refuses to change the tokens per step of the run `saved` comes from (another world size rounds
// train.tokens_per_task otherwise), unless train.tokens_per_task itself was changed.
void Trainer::check_tokens_per_step(const checkpoint::TrainerState& saved,
                                    const std::map<std::string, std::string>& saved_config,
                                    const std::string& path) const {
  int64_t before = saved.tokens_per_step;
  const auto value = [&](const std::string& key) -> int64_t {
    const auto it = saved_config.find(key);
    return it == saved_config.end() ? 0 : std::atoll(it->second.c_str());
  };
  const int64_t saved_tokens_per_task = value("train.tokens_per_task");
  if (before == 0 && saved_tokens_per_task > 0 && value("train.micro_batch_tokens") > 0) {
    // Written before trainer.yaml recorded it: the rounding then was always up.
    const int64_t per_round = saved.world_size * value("train.micro_batch_tokens");
    before = (saved_tokens_per_task + per_round - 1) / per_round * per_round;
  }
  if (before == 0 || before == tokens_per_step_) return;
  if (saved_tokens_per_task != config_.train.tokens_per_task) {
    if (comm_->rank() == 0) {
      spdlog::info(
          "the global batch changes from {} to {} tokens per step and task, as "
          "train.tokens_per_task changed from {} to {}",
          before, tokens_per_step_, saved_tokens_per_task, config_.train.tokens_per_task);
    }
    return;
  }
  const auto sizes = world_sizes_with(config_.train, before, comm_->world_size());
  XLME_FAIL(
      "checkpoint '{}' was trained with {} tokens per step and task on {} rank(s); on {} rank(s) "
      "a step would hold {} ({:+.1f}%: {} micro-batch(es) of train.micro_batch_tokens = {} per "
      "rank, train.batch_rounding={}), which would change the run's optimization. Resume on a "
      "world size that keeps {} tokens per step ({}), or set train.tokens_per_task to the global "
      "batch you want (a deliberate change, said at resume)",
      path, before, saved.world_size, comm_->world_size(), tokens_per_step_,
      100.0 * static_cast<double>(tokens_per_step_ - before) / static_cast<double>(before),
      micro_batches_, config_.train.micro_batch_tokens, config_.train.batch_rounding, before,
      sizes.empty() ? std::string("none with these settings")
                    : fmt::format("{} rank(s)", fmt::join(sizes, ", ")));
}

void Trainer::load_checkpoint(const VerifiedFiles& files) {
  // Every file below is read through the verified manifest: an unlisted file is never read.
  const std::string& path = files.folder();
  const checkpoint::TrainerState saved =
      checkpoint::read_trainer_state(files.path(checkpoint::kTrainerStateFile));
  // Checked before loading: a tensor of another shape would be loaded as it is.
  const auto saved_config = saved_values(files.path(checkpoint::kConfigFile));
  const auto differences = model_differences(config_, saved_config);
  XLME_CHECK(differences.empty(),
             "checkpoint '{}' holds another model than the config describes ({}); a run resumes "
             "with the model it started with: set these fields back, or start a new run in "
             "another run.out_dir (--init-from can take over matching weights)",
             path, fmt::join(differences, "; "));
  check_tokens_per_step(saved, saved_config, path);
  const std::string model_file = files.path(checkpoint::kModelFile);
  const std::string optimizer_file = files.path(checkpoint::kOptimizerFile);
  std::vector<std::string> rank_files;
  for (int r = 0; r < saved.world_size; ++r) {
    rank_files.push_back(files.path(checkpoint::rank_file(r)));
  }
  torch::serialize::InputArchive model_archive, optimizer_archive;
  // The archives may hold what this model and its optimizer need and no more: model.pt exactly
  // the model's tensors (names, shapes and dtypes checked before LibTorch reads them), the
  // optimizer at most AdamW's moments of every parameter, a rank's file its random states.
  const auto specs = checkpoint::weight_specs(*model_);
  checkpoint::load_module_archive(model_archive, model_file, device_, specs);
  try {
    model_->load(model_archive);
  } catch (const c10::Error& e) {
    XLME_FAIL("cannot load the model of checkpoint '{}' from '{}': {}", path, model_file,
              e.what_without_backtrace());
  }
  // ZeRO-1: the whole state read into host memory, of which each rank copies its shard.
  checkpoint::load_archive(
      optimizer_archive, optimizer_file, sharded_ ? torch::Device(torch::kCPU) : device_,
      kMaxOptimizerStates * checkpoint::weight_bytes(specs) + kMaxRankStateBytes);
  try {
    optimizer_->load(optimizer_archive);
  } catch (const c10::Error& e) {
    XLME_FAIL("cannot load the optimizer state of checkpoint '{}' from '{}': {}", path,
              optimizer_file, e.what_without_backtrace());
  }
  if (sharded_) sharded_->take_shard_of(*optimizer_);  // ZeRO-1: this rank's shard alone
  step_ = saved.step;
  tokens_seen_ = saved.tokens_seen;
  skipped_steps_ = saved.skipped_steps;
  bad_in_a_row_ = 0;
  std::vector<std::string> readers;
  GeneratorStates my_rng;
  for (int r = 0; r < saved.world_size; ++r) {
    torch::serialize::InputArchive archive;
    checkpoint::load_archive(archive, rank_files[r], torch::kCPU, kMaxRankStateBytes);
    try {
      c10::IValue reader;
      archive.read("reader", reader);
      XLME_CHECK(reader.isString(),
                 "'{}': 'reader' is not a string; the file is damaged or was altered: resume from "
                 "another checkpoint",
                 rank_files[r]);
      readers.push_back(reader.toStringRef());
      if (r == comm_->rank()) {
        archive.read("rng_cpu", my_rng.cpu);
        if (!archive.try_read("rng_device", my_rng.device)) my_rng.device = torch::Tensor();
      }
    } catch (const c10::Error& e) {
      XLME_FAIL(
          "cannot read the state of rank {} from '{}': {}; the file is damaged or was "
          "altered: resume from another checkpoint",
          r, rank_files[r], e.what_without_backtrace());
    }
  }
  source_.restore(readers);
  if (saved.world_size == comm_->world_size() && (my_rng.device.defined() || !device_.is_cuda())) {
    try {
      set_generator_states(my_rng, device_);
    } catch (const c10::Error& e) {
      XLME_FAIL(
          "cannot restore the random generators from '{}': {}; the file is damaged or was "
          "altered: resume from another checkpoint",
          rank_files[comm_->rank()], e.what_without_backtrace());
    }
  } else {
    // Other ranks than when saved (the data streams are re-split by the source), or a checkpoint
    // of a CPU run resumed on a GPU: dropout and sampling noise starts from a fresh seed per rank.
    seed_generators(
        training_seed(config_.run.seed * 7919 + static_cast<uint64_t>(step_) * 31, comm_->rank()),
        device_);
  }
  spdlog::info("resumed from {} at step {} ({} tokens seen, saved by {} rank(s))", path, step_,
               tokens_seen_, saved.world_size);
}

}  // namespace xlme::train
