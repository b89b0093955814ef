#include "rank_checks.h"

#include "xlme/checkpoint/manager.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/data/shard.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

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

}  // namespace

// Every rank must see rank 0's run.out_dir as the same folder: rank 0 writes every checkpoint
// there, each rank's state included, and every rank resumes from there. The same path is not
// enough (a disk local to each node, mounted at the same path everywhere, gives checkpoints without
// the other ranks' files and runs that cannot resume): rank 0 writes a file with a fresh nonce
// there and every other rank reads it. The outcome is exchanged, so that every rank fails with the
// same message, naming each rank that does not see it with its host and folder.
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
    nonce = fmt::format("{} {} {}", checkpoint::CheckpointManager::new_run_id(), host, ::getpid());
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

// Every rank must train with the same config: ranks with another model.hidden_size abort inside
// Gloo, another train.steps hangs at the end, another train.lr trains on silently.
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

// Every rank must read the same data: data.shards may be another path on each host, but a rank
// given another folder would train on with the others and exit 0. The ranks compare
// data_fingerprint() and fail naming the shards that differ, with each rank's counts and checksums.
// Each rank's tokenizer is checked against its shards' when they are opened, so equal shards mean
// equal tokenizers.
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

}  // namespace xlme::train
