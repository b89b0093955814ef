#include "xlme/train/trainer.h"

#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/layout.h"
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

#include <chrono>
#include <cmath>
#include <cstdlib>
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
  // Enough micro-batches per task for train.tokens_per_task tokens over all ranks.
  const int64_t per_round = comm_->world_size() * config.train.micro_batch_tokens;
  micro_batches_ = (config.train.tokens_per_task + per_round - 1) / per_round;
  if (micro_batches_ * per_round != config.train.tokens_per_task && comm_->rank() == 0) {
    spdlog::warn(
        "tokens per step: {} per task ({} micro-batch(es) of train.micro_batch_tokens = {} on "
        "each of {} rank(s)), not train.tokens_per_task = {}: the global batch is rounded up to "
        "whole micro-batches on every rank ({:+.1f}%)",
        micro_batches_ * per_round, micro_batches_, config.train.micro_batch_tokens,
        comm_->world_size(), config.train.tokens_per_task,
        100.0 * static_cast<double>(micro_batches_ * per_round - config.train.tokens_per_task) /
            static_cast<double>(config.train.tokens_per_task));
  }
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
  return comm_->start_sum(stop_signal() != 0 ? 1.0 : 0.0).get() > 0;
}

void Trainer::dry_run() {
  ForkedRng fork(device_);  // dropout and sampling draw from a fork: training is unchanged
  model_->train();
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
}

StepRecord Trainer::train_step() {
  XLME_CHECK(!interrupted_,
             "train_step after an interrupted step: save the checkpoint and stop (the resumed run "
             "repeats the step)");
  model_->train();
  StepRecord record;
  PhaseClock clock(record.seconds, device_, phase_timing_);
  remember_state_before_step();

  // 1. Every micro-batch of the step, and the counts its terms are normalized by (all ranks).
  const std::vector<data::Batch> batches = next_micro_batches();
  torch::Tensor counts = count_micro_batches(batches);
  const std::vector<model::ModelInputs> inputs = device_inputs(batches);
  clock.lap("data");
  counts = summed_over_ranks(*comm_, counts);
  clock.lap("communication");
  const auto normalizers = objectives_.normalizers(counts);

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
      forward_backward(batches[b], inputs[b], normalizers, sums, clock);
      const bool stopping = stop.after_micro_batch(b + 1 == batches.size());
      clock.lap("communication");
      if (stopping) return abandon_step(std::move(record));
    }
  }

  // 3. Gradients and term sums summed over ranks.
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
                               objectives::TermSums& sums, PhaseClock& clock) {
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
  for (const auto& p : parameters_) *flags++ = p.grad().defined() ? 1.0 : 0.0;
  return host.to(device_, /*non_blocking=*/true);
}

// All-reduces the gradients and returns `sums` flattened and summed over the ranks: losses were
// divided by global counts, so the sum of the ranks' gradients is the gradient of the step's L.
// gradient_presence() rides along with the sums (no collective of its own): the all-reduce gives
// every parameter a gradient, zeros where no rank had one, and read_step_totals drops those again.
torch::Tensor Trainer::sum_over_ranks(const objectives::TermSums& sums) {
  const torch::Tensor presence = gradient_presence();
  dist::all_reduce_gradients(*comm_, parameters_, config_.dist.bucket_mb << 20, /*average=*/false);
  return summed_over_ranks(*comm_, torch::cat({sums.flatten(device_), presence}));
}

// A parameter that got no gradient on any rank (e.g. the last layer's FFN of a distillation
// student without distill.hidden_cosine) loses the zero gradient the all-reduce gave it, so that
// the optimizer leaves it and its moments alone, as with one process: AdamW would otherwise decay
// its weights every step. `presence`: gradient_presence() summed over the ranks.
void Trainer::drop_gradients_absent_on_every_rank(const double* presence) {
  for (auto& p : parameters_) {
    if (*presence++ == 0.0) p.mutable_grad() = torch::Tensor();
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
  clip_gradients(parameters_, config_.train.clip_norm, record.grad_norm);
  set_learning_rate(*optimizer_, record.lr);
  optimizer_->step();
  optim::clear_gradients(parameters_);
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
    if (device_.is_cuda()) host = host.pinned();
    inputs.push_back(host.to(device_, /*non_blocking=*/true));
  }
  return inputs;
}

Trainer::MicroBatchLoss Trainer::forward(const data::Batch& batch, const model::ModelInputs& inputs,
                                         const std::map<std::string, torch::Tensor>& normalizers) {
  AutocastScope autocast(device_, bf16_);
  MicroBatchLoss micro;
  micro.terms = objectives_.compute(model_->forward(inputs), batch.task);
  micro.loss = objectives::weighted_loss(micro.terms, normalizers);
  return micro;
}

// Every rank abandoned the step after the same micro-batch: nothing is updated, and step() is
// still the previous step.
StepRecord Trainer::abandon_step(StepRecord record) {
  for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
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
  // [term sums, gradient presence (more than one process), tokens, FLOPs, gradient norm]
  const auto host = torch::cat({reduced_sums, counts.narrow(0, terms, 2),
                                gradient_norm(parameters_).to(torch::kFloat64).reshape({1})})
                        .cpu();
  record.sums = sums.unflatten(host.narrow(0, 0, sums.flat_size()));
  record.terms = record.sums.summary();
  record.loss = record.sums.total_loss();
  const double* presence = host.data_ptr<double>() + sums.flat_size();
  const int64_t presence_size = reduced_sums.size(0) - sums.flat_size();
  if (presence_size > 0) drop_gradients_absent_on_every_rank(presence);
  const double* tail = presence + presence_size;
  record.tokens = static_cast<int64_t>(tail[0]);
  record.flops = tail[1];
  record.grad_norm = tail[2];
}

// A non-finite loss or gradient norm: the gradients are dropped without an update; after
// train.max_bad_steps such steps in a row the run stops.
void Trainer::skip_update(StepRecord& record) {
  optim::clear_gradients(parameters_);
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

std::string Trainer::save_checkpoint(const CheckpointManager& manager) {
  // Every rank writes its reader and RNG state into the temporary folder between the barriers.
  const auto write_rank_state = [&](const std::string& folder) {
    comm_->barrier();  // the folder exists
    torch::serialize::OutputArchive archive;
    archive.write("reader", c10::IValue(interrupted_ ? reader_before_step_ : source_.state()));
    const GeneratorStates rng = interrupted_ ? rng_before_step_ : generator_states(device_);
    archive.write("rng_cpu", rng.cpu);
    if (rng.device.defined()) archive.write("rng_device", rng.device);
    checkpoint::save_archive(archive,
                             (fs::path(folder) / checkpoint::rank_file(comm_->rank())).string());
    comm_->barrier();  // every rank's file is written
  };
  if (comm_->rank() == 0) {
    // A save that fails leaves the earlier checkpoints as they were and no temporary folder.
    manager.save(step_, [&](const std::string& folder) {
      write_rank_state(folder);
      const auto file = [&](const char* name) { return (fs::path(folder) / name).string(); };
      torch::serialize::OutputArchive model_archive, optimizer_archive;
      model_->save(model_archive);
      checkpoint::save_archive(model_archive, file(checkpoint::kModelFile));
      optimizer_->save(optimizer_archive);
      checkpoint::save_archive(optimizer_archive, file(checkpoint::kOptimizerFile));
      checkpoint::write_trainer_state(file(checkpoint::kTrainerStateFile),
                                      {step_, tokens_seen_, skipped_steps_, comm_->world_size()});
      config::save_config(config_, file(checkpoint::kConfigFile));
      if (!config_.data.tokenizer.empty() && fs::is_regular_file(config_.data.tokenizer)) {
        write_file_atomic(file(checkpoint::kTokenizerFile),
                          read_file(config_.data.tokenizer, "tokenizer"));
      }
    });
  } else {
    write_rank_state(manager.temporary_path_for(step_));
  }
  comm_->barrier();
  return manager.path_for(step_);
}

namespace {

// "a.b.c" -> value of every scalar or list under `node`.
void flatten_yaml(const YAML::Node& node, const std::string& prefix,
                  std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& item : node) {
      const std::string key = item.first.as<std::string>();
      flatten_yaml(item.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else {
    out[prefix] = YAML::Dump(node);
  }
}

// The model.* fields in which the checkpoint's config file `saved_config` differs from `config`,
// as "model.hidden_size: 32 in the checkpoint, 64 now"; empty when they agree or the checkpoint's
// config cannot be read. Dropout, initialization and sampling temperature may change on resume.
std::vector<std::string> model_differences(const config::Config& config,
                                           const std::string& saved_config) {
  static const std::set<std::string> may_change = {"model.dropout", "model.attention_dropout",
                                                   "model.init_std",
                                                   "model.generator.sampling_temperature"};
  std::map<std::string, std::string> saved, current;
  try {
    flatten_yaml(config::load_yaml_file(saved_config), "", saved);
    flatten_yaml(YAML::Load(config::to_yaml(config)), "", current);
  } catch (const YAML::Exception&) {
    return {};
  }
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

}  // namespace

void Trainer::load_checkpoint(const VerifiedFiles& files) {
  // Every file below is read through the verified manifest: an unlisted file is never read.
  const std::string& path = files.folder();
  const checkpoint::TrainerState saved =
      checkpoint::read_trainer_state(files.path(checkpoint::kTrainerStateFile));
  // Checked before loading: a tensor of another shape would be loaded as it is.
  const auto differences = model_differences(config_, files.path(checkpoint::kConfigFile));
  XLME_CHECK(differences.empty(),
             "checkpoint '{}' holds another model than the config describes ({}); a run resumes "
             "with the model it started with: set these fields back, or start a new run in "
             "another run.out_dir (--init-from can take over matching weights)",
             path, fmt::join(differences, "; "));
  const std::string model_file = files.path(checkpoint::kModelFile);
  const std::string optimizer_file = files.path(checkpoint::kOptimizerFile);
  std::vector<std::string> rank_files;
  for (int r = 0; r < saved.world_size; ++r) {
    rank_files.push_back(files.path(checkpoint::rank_file(r)));
  }
  torch::serialize::InputArchive model_archive, optimizer_archive;
  checkpoint::load_archive(model_archive, model_file, device_);
  try {
    model_->load(model_archive);
  } catch (const c10::Error& e) {
    XLME_FAIL("cannot load the model of checkpoint '{}' from '{}': {}", path, model_file,
              e.what_without_backtrace());
  }
  checkpoint::load_archive(optimizer_archive, optimizer_file, device_);
  try {
    optimizer_->load(optimizer_archive);
  } catch (const c10::Error& e) {
    XLME_FAIL("cannot load the optimizer state of checkpoint '{}' from '{}': {}", path,
              optimizer_file, e.what_without_backtrace());
  }
  step_ = saved.step;
  tokens_seen_ = saved.tokens_seen;
  skipped_steps_ = saved.skipped_steps;
  bad_in_a_row_ = 0;
  std::vector<std::string> readers;
  GeneratorStates my_rng;
  for (int r = 0; r < saved.world_size; ++r) {
    torch::serialize::InputArchive archive;
    checkpoint::load_archive(archive, rank_files[r], torch::kCPU);
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
