// The Trainer's checkpoints: the distributed save (every rank's file checked into rank 0's folder
// before it commits), its background variant, and the load with its checks against the config.
#include "xlme/train/trainer.h"

#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/yaml_file.h"
#include "xlme/train/global_batch.h"
#include "xlme/train/rng.h"

#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/serialize.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <set>
#include <type_traits>

namespace xlme::train {

using checkpoint::CheckpointManager;
using checkpoint::VerifiedFiles;

namespace {

namespace fs = std::filesystem;

// The most optimizer states per parameter a checkpoint may hold: AdamW's two moments, and the
// maximum of the second with amsgrad.
constexpr uint64_t kMaxOptimizerStates = 3;

// The most tensor data of a rank's file (its random generators' states, a few kilobytes) and of
// the optimizer's step counters.
constexpr uint64_t kMaxRankStateBytes = 16u << 20;

// Runs `part` and returns its exception (null when it succeeded), so that a rank whose part of a
// save fails still takes part in the save's remaining collectives.
template <typename Part>
std::exception_ptr attempt(Part&& part) {
  try {
    part();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

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

// Rank 0's files of the checkpoint of `step` written into its temporary `folder`, which is then
// committed; returns the committed path. File I/O alone (no collective), so that it may run on the
// background thread; a failure removes the temporary folder.
std::string write_and_commit(StateArchives& archives, const checkpoint::TrainerState& state,
                             const config::Config& config, const std::string& folder, int64_t step,
                             bool background, const CheckpointManager& manager) {
  const auto start = std::chrono::steady_clock::now();
  try {
    const auto file = [&](const char* name) { return (fs::path(folder) / name).string(); };
    checkpoint::save_archive(archives.model(), file(checkpoint::kModelFile));
    checkpoint::save_archive(archives.optimizer(), file(checkpoint::kOptimizerFile));
    checkpoint::write_trainer_state(file(checkpoint::kTrainerStateFile), state);
    config::save_config(config, file(checkpoint::kConfigFile));
    if (!config.data.tokenizer.empty() && fs::is_regular_file(config.data.tokenizer)) {
      write_file_atomic(file(checkpoint::kTokenizerFile),
                        read_file(config.data.tokenizer, "tokenizer"));
    }
    const std::string path = manager.commit(step);
    if (background) {
      spdlog::info("checkpoint: {} (written in the background in {:.1f} s)", path,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return path;
  } catch (...) {
    manager.abort(step);  // no temporary folder is left behind
    throw;
  }
}

// The model.* fields in which the checkpoint's config file `saved` differs from `config`,
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
  if (leader) error = attempt([&] { manager.begin(step_); });
  comm_->barrier();
  const std::string folder = manager.temporary_path_for(step_);
  const std::string my_file = (fs::path(folder) / checkpoint::rank_file(comm_->rank())).string();
  bool written = false;
  if (!error) {
    error = attempt([&] {
      write_rank_file(folder, my_file);
      written = true;
    });
  }
  const std::vector<double> records = rank_file_records(*comm_, my_file, written);
  if (leader && !error) {
    error = attempt([&] {
      check_rank_files(folder, records);
      save_model_and_optimizer(manager, folder, background, exp_avg, exp_avg_sq);
    });
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

// This rank's reader and RNG state (before an interrupted step: the resumed run repeats that step)
// written to `file` in rank 0's temporary checkpoint `folder`.
void Trainer::write_rank_file(const std::string& folder, const std::string& file) const {
  XLME_CHECK(fs::is_directory(folder),
             "rank {}: the checkpoint folder '{}' that rank 0 made is not there: run.out_dir "
             "'{}' is not a folder every rank shares",
             comm_->rank(), folder, config_.run.out_dir);
  torch::serialize::OutputArchive archive;
  archive.write("reader", c10::IValue(interrupted_ ? reader_before_step_ : source_.state()));
  const GeneratorStates rng = interrupted_ ? rng_before_step_ : generator_states(device_);
  archive.write("rng_cpu", rng.cpu);
  if (rng.device.defined()) archive.write("rng_device", rng.device);
  checkpoint::save_archive(archive, file);
}

// Rank 0: the model, the optimizer (ZeRO-1: the whole moments `exp_avg`, `exp_avg_sq` gathered
// from the shards), the trainer state, the config and the tokenizer written into `folder` and
// committed, here or (`background`) on the background thread from host copies of the tensors.
void Trainer::save_model_and_optimizer(const CheckpointManager& manager, const std::string& folder,
                                       bool background, const std::vector<torch::Tensor>& exp_avg,
                                       const std::vector<torch::Tensor>& exp_avg_sq) {
  try {
    // In the background the archives own copies of the tensors: training changes the live ones.
    auto archives = std::make_shared<StateArchives>(background);
    archives->add_model(*model_);
    if (sharded_) sharded_->put_whole_into(*optimizer_, exp_avg, exp_avg_sq);
    archives->add_optimizer(*optimizer_, /*owned=*/sharded_ != nullptr);
    if (sharded_) optimizer_->state().clear();
    const checkpoint::TrainerState state{step_, tokens_seen_, skipped_steps_, comm_->world_size(),
                                         tokens_per_step_};
    const int64_t step = step_;
    if (background) {
      background_.start(step, [archives, state, config = config_, folder, step, &manager] {
        return write_and_commit(*archives, state, config, folder, step, /*background=*/true,
                                manager);
      });
    } else {
      write_and_commit(*archives, state, config_, folder, step, /*background=*/false, manager);
    }
  } catch (...) {
    if (sharded_) optimizer_->state().clear();
    throw;
  }
}

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
  std::vector<std::string> rank_files;
  for (int r = 0; r < saved.world_size; ++r) {
    rank_files.push_back(files.path(checkpoint::rank_file(r)));
  }
  load_model_and_optimizer(files);
  step_ = saved.step;
  tokens_seen_ = saved.tokens_seen;
  skipped_steps_ = saved.skipped_steps;
  bad_in_a_row_ = 0;
  load_rank_states(rank_files);
  spdlog::info("resumed from {} at step {} ({} tokens seen, saved by {} rank(s))", path, step_,
               tokens_seen_, saved.world_size);
}

// The archives may hold what this model and its optimizer need and no more: model.pt exactly the
// model's tensors (names, shapes and dtypes checked before LibTorch reads them), the optimizer at
// most AdamW's moments of every parameter.
void Trainer::load_model_and_optimizer(const VerifiedFiles& files) {
  const std::string& path = files.folder();
  const std::string model_file = files.path(checkpoint::kModelFile);
  const std::string optimizer_file = files.path(checkpoint::kOptimizerFile);
  torch::serialize::InputArchive model_archive, optimizer_archive;
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
}

// Every saved rank's reader state, handed to the source (which re-splits them over this run's
// ranks), and this rank's random generators: restored when the world size is the one saved, else
// seeded afresh from the step. A rank's file holds its random states and no more.
void Trainer::load_rank_states(const std::vector<std::string>& rank_files) {
  const int saved_world_size = static_cast<int>(rank_files.size());
  std::vector<std::string> readers;
  GeneratorStates my_rng;
  for (int r = 0; r < saved_world_size; ++r) {
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
  if (saved_world_size == comm_->world_size() && (my_rng.device.defined() || !device_.is_cuda())) {
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
}

}  // namespace xlme::train
