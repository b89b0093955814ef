#include "xlme/train/pretrain.h"

#include "xlme/checkpoint/layout.h"
#include "xlme/checkpoint/manager.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/common/error.h"
#include "xlme/common/exit_codes.h"
#include "xlme/common/io.h"
#include "xlme/common/runtime.h"
#include "xlme/data/batches.h"
#include "xlme/data/shard.h"
#include "xlme/data/tokenizer.h"
#include "xlme/objectives/term_sums.h"
#include "xlme/train/distill.h"
#include "xlme/train/init.h"
#include "xlme/train/metrics.h"
#include "xlme/train/performance.h"
#include "xlme/train/signals.h"
#include "xlme/train/trainer.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

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

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Every rank must see rank 0's run.out_dir as the same folder: rank 0 writes every checkpoint
// there, each rank's state included, and every rank resumes from there. The same path is not
// enough (a disk local to each node, mounted at the same path everywhere, gave checkpoints without
// rank 1's file and runs that could not resume): rank 0 writes a file with a fresh nonce there and
// every other rank reads it. The outcome is exchanged, so that every rank fails with the same
// message, naming each rank that does not see it with its host and folder.
void check_shared_run_folder(const config::Config& config, dist::Communicator& comm) {
  if (comm.world_size() == 1) return;
  const fs::path out_dir = fs::absolute(config.run.out_dir);
  const std::string host = host_name();
  // The file is named after the nonce: two jobs starting in one folder do not read each other's.
  const auto probe_of = [&](const std::string& nonce) {
    return out_dir / (".shared-folder-probe." + nonce.substr(0, nonce.find(' ')));
  };
  std::string nonce;
  if (comm.rank() == 0) {
    nonce = fmt::format("{} {} {}", CheckpointManager::new_run_id(), host, ::getpid());
    try {
      std::error_code ec;
      fs::create_directories(out_dir, ec);
      XLME_CHECK(!ec, "cannot create run.out_dir '{}': {}", out_dir.string(), ec.message());
      write_file_atomic(probe_of(nonce).string(), nonce);
    } catch (const Error& e) {
      nonce = std::string("!") + e.what();
    }
  }
  // Rank 0's nonce reaches every rank after rank 0 wrote the file.
  nonce = comm.all_gather_strings(nonce).front();
  const fs::path probe = probe_of(nonce);
  std::string verdict = "ok";  // also when rank 0 failed: said below
  if (comm.rank() != 0 && (nonce.empty() || nonce[0] != '!')) {
    std::error_code ec;
    if (!fs::exists(probe, ec)) {
      verdict = fmt::format("'{}' does not exist there", probe.filename().string());
    } else {
      std::string seen;
      try {
        seen = read_file(probe.string());
      } catch (const Error& e) {
        seen = e.what();
      }
      if (seen != nonce) {
        verdict = fmt::format("'{}' there holds another run's nonce ('{}', not '{}')",
                              probe.filename().string(), seen.substr(0, 80), nonce);
      }
    }
  }
  const std::vector<std::string> verdicts =
      comm.all_gather_strings(fmt::format("{}\n{}\n{}", host, out_dir.string(), verdict));
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::remove(probe, ec);
  }
  XLME_CHECK(nonce.empty() || nonce[0] != '!',
             "rank {}: rank 0 could not write into its "
             "run.out_dir: {}",
             comm.rank(), nonce.substr(1));
  std::vector<std::string> blind;
  std::string rank0_host;
  for (std::size_t r = 0; r < verdicts.size(); ++r) {
    const std::string& v = verdicts[r];
    const auto first = v.find('\n'), second = v.find('\n', first + 1);
    if (r == 0) rank0_host = v.substr(0, first);
    if (v.substr(second + 1) == "ok") continue;
    blind.push_back(fmt::format("rank {} on host {} (its run.out_dir '{}': {})", r,
                                v.substr(0, first), v.substr(first + 1, second - first - 1),
                                v.substr(second + 1)));
  }
  XLME_CHECK(blind.empty(),
             "rank {}: run.out_dir '{}' is not the same folder on every rank: rank 0 on host {} "
             "wrote a file into its run.out_dir that {} cannot read. Rank 0 writes every "
             "checkpoint, with every rank's state, into its run.out_dir and every rank resumes "
             "from there: give every rank the same run.out_dir on a file system they all share "
             "(NFS, Lustre, ...; not a disk local to each node)",
             comm.rank(), config.run.out_dir, rank0_host, fmt::join(blind, "; "));
}

// Keys that may differ between ranks: where each host keeps its files (run.out_dir is probed by
// check_shared_run_folder), its threads, logging and loading, and the sections pre-training does
// not read.
bool may_differ_between_ranks(const std::string& key) {
  static const std::set<std::string> keys = {
      "run.out_dir",        "run.threads",          "run.log_level",       "data.shards",
      "data.tokenizer",     "data.heldout.dir",     "data.loader_threads", "data.prefetch",
      "data.verify_shards", "train.release_memory", "distill.teacher"};
  static const std::vector<std::string> sections = {"finetune.", "export.", "data.spm.",
                                                    "data.binarize."};
  if (keys.count(key)) return true;
  for (const auto& section : sections) {
    if (key.rfind(section, 0) == 0) return true;
  }
  return false;
}

// Where `text` (lines "key=value") of some rank differs from rank 0's: "key (rank 0: v, rank r:
// w)" for at most 10 keys and a count of the rest, the other ranks in `other_ranks`; empty when
// every rank has rank 0's. Every rank calls it. Each rank's 52-bit hash of its text is gathered
// by a sum over one slot per rank; only when they differ do the ranks exchange their texts
// through the store.
std::vector<std::string> keys_differing_from_rank0(const std::string& text,
                                                   dist::Communicator& comm,
                                                   std::set<std::size_t>& other_ranks) {
  const auto ranks = static_cast<std::size_t>(comm.world_size());
  std::vector<double> slots(ranks, 0.0);
  slots[static_cast<std::size_t>(comm.rank())] =
      static_cast<double>(std::hash<std::string>{}(text) >> 12);
  slots = comm.reduce_scalars(slots, dist::ScalarOp::kSum);
  if (std::all_of(slots.begin(), slots.end(), [&](double h) { return h == slots[0]; })) return {};
  const std::vector<std::string> texts = comm.all_gather_strings(text);
  const auto parse = [](const std::string& list) {
    std::map<std::string, std::string> values;
    std::istringstream in(list);
    for (std::string line; std::getline(in, line);) {
      const auto eq = line.find('=');
      values[line.substr(0, eq)] = eq == std::string::npos ? "" : line.substr(eq + 1);
    }
    return values;
  };
  const auto reference = parse(texts[0]);
  std::map<std::string, std::vector<std::string>> differing;  // key -> "rank r: value"
  const auto differs = [&](const std::string& key, const std::string& value0, std::size_t r,
                           const std::string& value) {
    auto& shown = differing[key];
    if (shown.empty()) shown.push_back("rank 0: " + value0);
    shown.push_back(fmt::format("rank {}: {}", r, value));
    other_ranks.insert(r);
  };
  for (std::size_t r = 1; r < ranks; ++r) {
    const auto values = parse(texts[r]);
    for (const auto& [key, value] : values) {
      const auto it = reference.find(key);
      if (it == reference.end()) {
        differs(key, "(absent)", r, value);
      } else if (it->second != value) {
        differs(key, it->second, r, value);
      }
    }
    for (const auto& [key, value] : reference) {
      if (!values.count(key)) differs(key, value, r, "(absent)");
    }
  }
  std::vector<std::string> keys;
  for (const auto& [key, shown] : differing) {
    if (keys.size() == 10) {
      keys.push_back(fmt::format("and {} more", differing.size() - 10));
      break;
    }
    keys.push_back(fmt::format(
        "{} ({})", key,
        fmt::join(shown.begin(), shown.begin() + std::min<std::size_t>(shown.size(), 4), ", ")));
  }
  return keys;
}

// Every rank must train with the same config: ranks with another model.hidden_size died of
// SIGABRT inside Gloo, another train.steps hung at the end, another train.lr trained on silently.
// Every rank fails naming the keys and the values of rank 0 and each other rank.
void check_same_config(const config::Config& config, dist::Communicator& comm) {
  if (comm.world_size() == 1) return;
  std::string text;
  for (const auto& [key, value] : config::flat_values(config::to_yaml(config))) {
    if (!may_differ_between_ranks(key)) text += key + "=" + value + "\n";
  }
  std::set<std::size_t> other_ranks;
  const auto keys = keys_differing_from_rank0(text, comm, other_ranks);
  XLME_CHECK(
      keys.empty(),
      "rank {}: the config of rank(s) {} differs from rank 0's in {}; every rank must train the "
      "same model the same way (the ranks exchange its weights and gradients, and step together): "
      "give all ranks the same --config and the same --set values (only run.out_dir's path, "
      "run.threads, run.log_level, data file paths and loader settings may differ)",
      comm.rank(), fmt::join(other_ranks, ", "), fmt::join(keys, "; "));
}

// What a rank reads, by content rather than by path: for every shard under data.shards (named
// relative to it: "mono/de"), what its header records of its files (counts, the CRC32 of the
// .bin and of the index, the tokenizer it was made with). Reads 256 bytes a shard; a shard whose
// header cannot be read is left to the loader, which names what is wrong with it.
std::string data_fingerprint(const config::Config& config) {
  std::error_code ec;
  if (config.data.shards.empty() || !fs::is_directory(config.data.shards, ec)) return "";
  std::string text;
  for (const auto& stem : data::list_shards(config.data.shards)) {
    data::ShardHeader header;
    std::ifstream in(stem + ".idx", std::ios::binary);
    if (!in.read(reinterpret_cast<char*>(&header), sizeof(header))) continue;
    text += fmt::format(
        "{}={} sequences, {} tokens, .bin CRC32 {:08x}, index CRC32 {:08x}, tokenizer {:016x}\n",
        (fs::path(stem).parent_path().filename() / fs::path(stem).filename()).string(),
        header.sequences, header.tokens, header.bin_crc32, header.index_crc32,
        header.tokenizer_hash);
  }
  return text;
}

// Every rank must read the same data: data.shards may be another path on each host, but a rank
// given another folder trained on with the others, exit 0. The ranks compare data_fingerprint()
// and fail naming the shards that differ, with each rank's counts and checksums. Each rank's
// tokenizer is checked against its shards' when they are opened, so equal shards mean equal
// tokenizers.
void check_same_data(const config::Config& config, dist::Communicator& comm) {
  if (comm.world_size() == 1) return;
  std::set<std::size_t> other_ranks;
  const auto shards = keys_differing_from_rank0(data_fingerprint(config), comm, other_ranks);
  XLME_CHECK(shards.empty(),
             "rank {}: the shards of rank(s) {} differ from rank 0's (data.shards '{}' on this "
             "rank) in {}; every rank must read the same data: data.shards may be another path "
             "on each host, but to the same files (copy the folder rank 0 reads, or binarize the "
             "same corpus with the same tokenizer and settings)",
             comm.rank(), fmt::join(other_ranks, ", "), config.data.shards,
             fmt::join(shards, "; "));
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

}  // namespace

int pretrain(const config::Config& config, const PretrainOptions& options,
             data::BatchSource& source, std::shared_ptr<dist::Communicator> comm,
             const Validator* validator) {
  install_stop_signal_handlers();
  const bool leader = comm->rank() == 0;
  CheckpointManager manager(checkpoint::checkpoints_folder(config.run.out_dir),
                            config.train.keep_last, config.train.keep_every);
  check_same_config(config, *comm);
  check_same_data(config, *comm);
  check_shared_run_folder(config, *comm);
  std::unique_ptr<FileLock> lock;
  if (leader) {
    lock = claim_run_folder(config, options, manager);
    manager.remove_temporaries();
  }
  comm->barrier();

  torch::manual_seed(config.run.seed);
  model::ElectraModel model = build_model(config);
  const std::optional<VerifiedFiles> resume = resume_from(options, manager, *comm);
  if (leader) {
    // The run's lineage: drawn at step 0, carried through every resume.
    std::string run_id = resume ? CheckpointManager::run_id_of(resume->folder()) : "";
    if (run_id.empty()) run_id = CheckpointManager::new_run_id();
    manager.set_run_id(run_id);
    spdlog::info("run id {} (recorded in each checkpoint; only its own checkpoints are pruned)",
                 run_id);
  }
  if (!resume && !options.init_from.empty()) {
    // Every rank loads the same weights (the trainer broadcasts rank 0's anyway).
    const auto report = init_weights(
        model, init_source_weights(options.init_from, checkpoint::weight_specs(*model)),
        config.train.init_parts, options.init_from);
    spdlog::info("{}", format_report(report, options.init_from, config.train.init_parts));
  }
  Trainer trainer(config, model, source, comm);
  if (resume) {
    try {
      trainer.load_checkpoint(*resume);
    } catch (const Error& e) {
      const std::string other = other_run_note(manager, resume->folder());
      if (other.empty()) throw;
      XLME_FAIL("{}; {}", other, e.what());
    }
    checkpoint::check_finite_weights(checkpoint::named_weights(*trainer.model()),
                                     resume->path(checkpoint::kModelFile));
    if (!options.init_from.empty()) {
      spdlog::info("--init-from {} ignored: the run continues from its own checkpoint {}",
                   options.init_from, resume->folder());
    }
  } else {
    spdlog::info("starting from step 0 (run.out_dir {})", config.run.out_dir);
  }
  const auto dry_start = std::chrono::steady_clock::now();
  trainer.dry_run();
  spdlog::info(
      "start-up dry run at the longest micro-batches passed in {:.1f} s ({}, peak memory "
      "{:.0f} MiB)",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - dry_start).count(),
      trainer.bf16() ? "bf16 autocast" : "fp32", peak_memory_mib(trainer.device()));
  std::unique_ptr<MetricsWriter> metrics;
  if (leader) {
    // The run rewrites what a stopped run logged after the checkpoint it resumes from (or after
    // step 0, when it stopped before its first checkpoint).
    metrics = std::make_unique<MetricsWriter>(
        (fs::path(config.run.out_dir) / checkpoint::kMetricsFile).string(), trainer.step(),
        !(validator != nullptr && config.train.validate_at_start));
  }
  // train.release_memory: CPU tensors live in the C heap, which keeps what they free, fragmented
  // by the changing micro-batch shapes (runtime::release_free_memory).
  const bool release_memory = config.train.release_memory && !trainer.device().is_cuda();
  auto validate = [&](int64_t step) {
    ValidationResult v = validator->run(trainer.model(), *comm, trainer.device(), trainer.bf16());
    if (release_memory) runtime::release_free_memory();
    v.step = step;
    spdlog::info("{}", validation_line(v));
    if (metrics) metrics->write(validation_metrics(v));
  };
  if (validator != nullptr && config.train.validate_at_start) validate(trainer.step());

  auto window_start = std::chrono::steady_clock::now();
  int64_t window_tokens = 0;
  double window_flops = 0;
  const std::string gpu = device_name(trainer.device());
  // Term sums added over the steps of a log interval, so that its accuracies and F1 are those of
  // all the interval's tokens rather than of its last step.
  objectives::TermSums interval;
  while (trainer.step() < config.train.steps) {
    const StepRecord record = trainer.train_step();
    if (release_memory) runtime::release_free_memory();
    if (record.interrupted) {
      // The step was abandoned on every rank: save the last finished one (unless saved already).
      trainer.finish_checkpoint();  // the save in flight is complete (or its error said) first
      bool saved = false;
      for (const auto& ref : manager.list()) saved = saved || ref.step == trainer.step();
      comm->barrier();
      if (!saved) spdlog::info("checkpoint: {}", trainer.save_checkpoint(manager));
      spdlog::warn(
          "stopping at step {} on a stop signal, in the middle of step {}; resume with "
          "--resume auto (exit code {})",
          trainer.step(), trainer.step() + 1, kExitPreempted);
      clear_stop_signal();
      return kExitPreempted;
    }
    window_tokens += record.tokens;
    window_flops += record.flops;
    interval.add(record.sums);
    const bool last = record.step == config.train.steps;
    if (record.step % config.train.log_every == 0 || record.step == 1 || last) {
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - window_start).count();
      Throughput speed;
      speed.tokens_per_second = window_tokens / seconds;
      speed.mfu = model_flops_utilization(window_flops / seconds, gpu, comm->world_size());
      speed.peak_memory_mib = peak_memory_mib(trainer.device());
      const objectives::TermSummaries terms = interval.summary();
      interval = objectives::TermSums();
      spdlog::info("{}", log_line(record, terms, config.train.steps, speed));
      if (const std::string table = source.language_report(); !table.empty()) {
        spdlog::info("data: language, shard tokens, target / realized share{}", table);
      }
      if (metrics) {
        metrics->write(metrics_of(record, terms, speed, trainer.tokens_seen(), window_flops));
      }
      window_start = now;
      window_tokens = 0;
      window_flops = 0;
    }
    if (validator != nullptr && config.train.validate_every > 0 &&
        (record.step % config.train.validate_every == 0 || last)) {
      validate(record.step);
      window_start = std::chrono::steady_clock::now();  // tokens/s is training's alone
    }
    // Every rank learns whether any rank received a stop signal, at the same step.
    const bool preempted = trainer.stop_requested();
    const bool periodic = config.train.save_every > 0 && record.step % config.train.save_every == 0;
    if (periodic || last || preempted) {
      // The last and the stop-signal checkpoints are complete before the run ends.
      const bool background = config.train.async_save && !last && !preempted;
      const auto save_start = std::chrono::steady_clock::now();
      const std::string path =
          background ? trainer.start_checkpoint(manager) : trainer.save_checkpoint(manager);
      const double blocked =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
      if (background) {
        spdlog::info(
            "checkpoint of step {}: training waited {:.2f} s (state copied); {} is "
            "written in the background",
            record.step, blocked, path);
      } else {
        spdlog::info("checkpoint: {} (training waited {:.2f} s)", path, blocked);
      }
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
