#include "xlme/train/trainer.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/yaml_file.h"
#include "xlme/data/synthetic.h"
#include "xlme/train/optimizer.h"
#include "xlme/train/performance.h"
#include "xlme/train/precision.h"
#include "xlme/train/rng.h"
#include "xlme/train/signals.h"

#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

constexpr data::Task kTasks[] = {data::Task::kMono, data::Task::kPara};

// A term's sums accumulated over the micro-batches of a step.
struct TermSums {
  double weight = 1;
  torch::Tensor loss_sum, count;
  std::map<std::string, torch::Tensor> statistics;
};

std::string rank_file(const std::string& folder, int rank) {
  return (fs::path(folder) / fmt::format("rank{}.pt", rank)).string();
}

}  // namespace

// --- Trainer ------------------------------------------------------------------------------------

Trainer::Trainer(const config::Config& config, model::ElectraModel model, data::BatchSource& source,
                 std::shared_ptr<dist::Communicator> comm)
    : config_(config),
      model_(std::move(model)),
      source_(source),
      comm_(std::move(comm)),
      objectives_(config.objectives),
      schedule_(config.train.lr, config.train.warmup_steps, config.train.steps),
      device_(comm_->device()) {
  model_->to(device_);
  parameters_ = model_->parameters();
  // Every rank starts from rank 0's weights (and buffers), whatever its own initialization.
  std::vector<torch::Tensor> state = parameters_;
  for (const auto& buffer : model_->buffers()) state.push_back(buffer);
  dist::broadcast_tensors(*comm_, state, 0);
  optimizer_ = make_adamw(parameters_, config.train);
  // Enough micro-batches per task for train.tokens_per_task tokens over all ranks.
  const int64_t per_round = comm_->world_size() * config.train.micro_batch_tokens;
  micro_batches_ = (config.train.tokens_per_task + per_round - 1) / per_round;
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
    const auto names = objectives_.term_names(task);
    if (names.empty()) continue;
    const bool mono = task == data::Task::kMono;
    const int64_t length = mono ? config_.data.mono.max_len : config_.data.para.max_len;
    const int64_t rows = std::max<int64_t>(1, config_.train.micro_batch_tokens / length);
    try {
      data::SyntheticBatches synthetic(model_->special_ids(), rows, length,
                                       config_.objectives.mask_ratio, config_.run.seed);
      const data::Batch batch = synthetic.next(task);
      std::map<std::string, torch::Tensor> normalizers;
      for (const auto& name : names) {
        normalizers[name] = torch::full(
            {}, static_cast<double>(std::max<int64_t>(1, objectives::term_count(name, batch))),
            torch::TensorOptions(torch::kFloat32).device(device_));
      }
      const auto inputs = model::ModelInputs::from(batch).to(device_);
      torch::Tensor loss;
      {
        AutocastScope autocast(device_, bf16_);
        loss = objectives::weighted_loss(objectives_.compute(model_->forward(inputs), task),
                                         normalizers);
      }
      loss.backward();
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
  for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
}

StepRecord Trainer::train_step() {
  XLME_CHECK(!interrupted_,
             "train_step after an interrupted step: save the checkpoint and stop (the resumed run "
             "repeats the step)");
  model_->train();
  StepRecord record;
  reader_before_step_ = source_.state();
  rng_before_step_ = generator_states(device_);
  auto mark = std::chrono::steady_clock::now();
  // Adds the time since the last call to `phase`.
  auto lap = [&](const char* phase) {
    if (phase_timing_ && device_.is_cuda()) torch::cuda::synchronize();
    const auto now = std::chrono::steady_clock::now();
    record.seconds[phase] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };

  // 1. Every micro-batch of the step, and from them the counts each term is normalized by.
  std::vector<data::Batch> batches;
  std::vector<std::string> names;  // every term of the step, in order
  for (const data::Task task : kTasks) {
    const auto task_terms = objectives_.term_names(task);
    if (task_terms.empty()) continue;
    names.insert(names.end(), task_terms.begin(), task_terms.end());
    for (int64_t i = 0; i < micro_batches_; ++i) batches.push_back(source_.next(task));
  }
  // [term counts..., real tokens, model FLOPs], summed over ranks on the device.
  std::vector<double> counts(names.size() + 2, 0.0);
  for (const auto& batch : batches) {
    const auto task_terms = objectives_.term_names(batch.task);
    for (std::size_t n = 0; n < names.size(); ++n) {
      if (std::find(task_terms.begin(), task_terms.end(), names[n]) != task_terms.end()) {
        counts[n] += static_cast<double>(objectives::term_count(names[n], batch));
      }
    }
    counts[names.size()] += static_cast<double>(batch.real_tokens);
    counts[names.size() + 1] += static_cast<double>(batch.real_tokens) *
                                training_flops_per_token(config_, batch.input_ids.size(1));
  }
  lap("data");
  std::vector<torch::Tensor> reduced_counts{torch::tensor(counts, torch::kFloat64).to(device_)};
  comm_->all_reduce_sum(reduced_counts);
  lap("communication");
  std::map<std::string, torch::Tensor> normalizers;
  for (std::size_t n = 0; n < names.size(); ++n) {
    // A term with no tokens anywhere (e.g. nothing masked) contributes 0, not 0 / 0.
    normalizers[names[n]] = reduced_counts[0][n].clamp_min(1.0).to(torch::kFloat32);
  }

  // 2. Forward and backward, one micro-batch at a time; the sums stay on the device. After each,
  // the ranks agree on stop signals: each micro-batch starts a sum of the ranks' flags, read one
  // micro-batch later (the last one at once), so that no host synchronization drains the GPU's
  // queue; a preempted run gives up the step within two micro-batches.
  std::map<std::string, TermSums> sums;
  dist::PendingSum previous_stop;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const data::Batch& batch = batches[b];
    {
      const auto inputs = model::ModelInputs::from(batch).to(device_);
      std::vector<objectives::Term> terms;
      torch::Tensor loss;
      {
        AutocastScope autocast(device_, bf16_);
        terms = objectives_.compute(model_->forward(inputs), batch.task);
        loss = objectives::weighted_loss(terms, normalizers);
      }
      lap("forward");
      loss.backward();
      for (const auto& term : terms) {
        TermSums& acc = sums[term.name];
        acc.weight = term.weight;
        acc.loss_sum =
            acc.loss_sum.defined() ? acc.loss_sum + term.loss_sum.detach() : term.loss_sum.detach();
        acc.count = acc.count.defined() ? acc.count + term.count : term.count;
        for (const auto& [key, value] : term.statistics) {
          auto& s = acc.statistics[key];
          s = s.defined() ? s + value : value;
        }
      }
    }  // the micro-batch's activations and outputs are freed here, inside the backward phase
    lap("backward");
    dist::PendingSum stop = comm_->start_sum(stop_signal() != 0 ? 1.0 : 0.0);
    bool stopping = previous_stop.pending() && previous_stop.get() > 0;
    if (!stopping && b + 1 == batches.size()) stopping = stop.get() > 0;
    previous_stop = std::move(stop);
    lap("communication");
    if (stopping) {
      if (previous_stop.pending()) previous_stop.get();  // every rank started it: finish it
      for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
      interrupted_ = true;
      record.interrupted = true;
      record.step = step_;
      return record;
    }
  }

  // 3. Gradients and statistics summed over ranks: losses were divided by global counts, so the
  // sum of the ranks' gradients is the gradient of the step's L.
  dist::all_reduce_gradients(*comm_, parameters_, config_.dist.bucket_mb << 20, /*average=*/false);
  std::vector<torch::Tensor> flat;
  for (const auto& [name, acc] : sums) {
    flat.push_back(acc.loss_sum.to(torch::kFloat64).reshape({1}));
    flat.push_back(acc.count.to(torch::kFloat64).reshape({1}));
    for (const auto& [key, value] : acc.statistics)
      flat.push_back(value.to(torch::kFloat64).reshape({1}));
  }
  std::vector<torch::Tensor> stats{torch::cat(flat)};
  comm_->all_reduce_sum(stats);
  lap("communication");

  // 4. The global gradient norm over both models, read with the statistics, tokens and FLOPs in
  // the step's one host synchronization; then either skip a non-finite update or clip and step.
  const auto host =
      torch::cat({stats[0], reduced_counts[0].narrow(0, static_cast<int64_t>(names.size()), 2),
                  gradient_norm(parameters_).to(torch::kFloat64).reshape({1})})
          .cpu();
  const double* values = host.data_ptr<double>();
  int64_t at = 0;
  for (const auto& [name, acc] : sums) {
    objectives::Term reduced;
    reduced.name = name;
    reduced.weight = acc.weight;
    reduced.loss_sum = host[at++];
    reduced.count = host[at++].to(torch::kInt64);
    for (const auto& [key, value] : acc.statistics)
      reduced.statistics[key] = host[at++].to(torch::kInt64);
    record.terms[name] = objectives::summarize(reduced);
    record.loss += acc.weight * record.terms[name]["loss"];
    record.sums[name] = reduced;
  }
  record.tokens = static_cast<int64_t>(values[at++]);
  record.flops = values[at++];
  record.grad_norm = values[at++];
  record.lr = schedule_.lr(step_);
  ++step_;
  record.step = step_;
  tokens_seen_ += record.tokens;
  if (!std::isfinite(record.grad_norm) || !std::isfinite(record.loss)) {
    optimizer_->zero_grad();
    record.skipped = true;
    ++skipped_steps_;
    ++bad_in_a_row_;
    spdlog::warn(
        "step {}: non-finite loss ({}) or gradient norm ({}); update skipped ({} in a row)", step_,
        record.loss, record.grad_norm, bad_in_a_row_);
    XLME_CHECK(bad_in_a_row_ < config_.train.max_bad_steps,
               "{} optimizer steps in a row had a non-finite loss or gradient norm "
               "(train.max_bad_steps); stopping with the last good checkpoint intact. Lower "
               "train.lr, raise train.warmup_steps, or inspect the data of the last steps",
               bad_in_a_row_);
    lap("optimizer");
    return record;
  }
  bad_in_a_row_ = 0;
  if (config_.train.clip_norm > 0 && record.grad_norm > config_.train.clip_norm) {
    scale_gradients(parameters_, config_.train.clip_norm / (record.grad_norm + 1e-6));
  }
  set_learning_rate(*optimizer_, record.lr);
  optimizer_->step();
  optimizer_->zero_grad();
  lap("optimizer");
  return record;
}

std::string Trainer::save_checkpoint(const CheckpointManager& manager) {
  const int rank = comm_->rank();
  const std::string folder = manager.temporary_path_for(step_);
  if (rank == 0) manager.begin(step_);
  comm_->barrier();
  {
    torch::serialize::OutputArchive archive;
    archive.write("reader", c10::IValue(interrupted_ ? reader_before_step_ : source_.state()));
    const GeneratorStates rng = interrupted_ ? rng_before_step_ : generator_states(device_);
    archive.write("rng_cpu", rng.cpu);
    if (rng.device.defined()) archive.write("rng_device", rng.device);
    save_archive(archive, rank_file(folder, rank));
  }
  comm_->barrier();
  if (rank == 0) {
    try {
      torch::serialize::OutputArchive model_archive, optimizer_archive;
      model_->save(model_archive);
      save_archive(model_archive, (fs::path(folder) / "model.pt").string());
      optimizer_->save(optimizer_archive);
      save_archive(optimizer_archive, (fs::path(folder) / "optimizer.pt").string());
      YAML::Emitter out;
      out << YAML::BeginMap << YAML::Key << "step" << YAML::Value << step_ << YAML::Key
          << "tokens_seen" << YAML::Value << tokens_seen_ << YAML::Key << "skipped_steps"
          << YAML::Value << skipped_steps_ << YAML::Key << "world_size" << YAML::Value
          << comm_->world_size() << YAML::EndMap;
      write_file_atomic((fs::path(folder) / "trainer.yaml").string(),
                        std::string(out.c_str()) + "\n");
      config::save_config(config_, (fs::path(folder) / "config.yaml").string());
      if (!config_.data.tokenizer.empty() && fs::is_regular_file(config_.data.tokenizer)) {
        std::ifstream in(config_.data.tokenizer, std::ios::binary);
        write_file_atomic(
            (fs::path(folder) / "tokenizer.model").string(),
            std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
      }
      manager.commit(step_);
    } catch (...) {
      manager.abort(step_);  // the earlier checkpoints stay as they were
      throw;
    }
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

void Trainer::load_checkpoint(const std::string& path) {
  // Every file below is read through the verified manifest: an unlisted file is never read.
  const VerifiedFiles files = CheckpointManager::verify(path);
  const TrainerState saved = read_trainer_state(files.path("trainer.yaml"));
  // Checked before loading: a tensor of another shape would be loaded as it is.
  const auto differences = model_differences(config_, files.path("config.yaml"));
  XLME_CHECK(differences.empty(),
             "checkpoint '{}' holds another model than the config describes ({}); a run resumes "
             "with the model it started with: set these fields back, or start a new run in "
             "another run.out_dir (--init-from can take over matching weights)",
             path, fmt::join(differences, "; "));
  const std::string model_file = files.path("model.pt");
  const std::string optimizer_file = files.path("optimizer.pt");
  std::vector<std::string> rank_files;
  for (int r = 0; r < saved.world_size; ++r) {
    rank_files.push_back(files.path(fs::path(rank_file(path, r)).filename().string()));
  }
  torch::serialize::InputArchive model_archive, optimizer_archive;
  load_archive(model_archive, model_file, device_);
  try {
    model_->load(model_archive);
  } catch (const c10::Error& e) {
    XLME_FAIL("cannot load the model of checkpoint '{}' from '{}': {}", path, model_file,
              e.what_without_backtrace());
  }
  load_archive(optimizer_archive, optimizer_file, device_);
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
    load_archive(archive, rank_files[r], torch::kCPU);
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
