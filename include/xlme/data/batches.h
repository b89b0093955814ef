// Training batches from binarized shards (docs/ARCHITECTURE.md#data): languages sampled with
// p_j ∝ m_j^alpha, MRTD sequences packed from whole sentences, TRTD pairs framed and bucketed by
// length, token-budget micro-batches, masking, per-rank streams with an O(1) state that re-splits
// over any number of ranks, and background prefetch.
//
// The stream of one language (or pair) j, the same on every rank:
//   units     sentences (mono) or pairs (para) of j's shard, read in shard order from a seeded
//             rotation offset and wrapping around at the end (epochs);
//   pools     consecutive runs of data.bucket_pool units (at most one epoch); pool k is
//             addressable in O(1);
//   sequences mono: a pool's sentences packed in order into <s> ... </s> of at most max_len
//             tokens, crossing documents (fairseq's "complete" mode); a sentence longer than
//             max_len - 2 is truncated and fills a sequence alone; for VECO (sentence_pairs)
//             instead two adjacent sentences of one document, <s> a </s> b </s>, paired within
//             the pool (framing.h's pair_adjacent_sentences). para: <s> e </s> f </s>, one per
//             pair. A pair longer than max_len is dropped or truncated (data.too_long);
//   micro-batches  a pool's sequences sorted by length and cut greedily so that rows x longest
//             row <= train.micro_batch_tokens, then shuffled (seeded by the pool).
// So j's micro-batches form one global sequence g = 0, 1, 2, ... that no rank owns.
//
// Ranks read it in lockstep rounds: in round t (a rank's t-th micro-batch of the task) rank r
// reads language L(t, r), drawn from a hash of (run.seed, task, t, r). Every rank computes
// L(t, r') for all R ranks, so every rank knows how many micro-batches c_j each language gives
// in the round: the ranks with language j read j's next c_j micro-batches in rank order, and j's
// cursor moves past them. After any round the micro-batches read of each language are exactly a
// prefix of its global sequence, on every rank alike. The state is that prefix's end per language
// (pool, micro-batch in the pool, count) plus t: O(1) to save and to restore, never replayed, and
// independent of the number of ranks, so a state saved with N ranks continues with M ranks
// without repeating or skipping anything. Masking is keyed by the micro-batch's place in its
// language's sequence, so a micro-batch is the same whichever rank or thread builds it.
//
// Packing, framing and truncation (framing.h), bucketing (bucketing.h) and masking (masking.h)
// are the ones the held-out (heldout.h) and synthetic (synthetic.h) batches use too.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/data/sampler.h"
#include "xlme/data/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xlme::data {

// One task's settings (data.mono / data.para).
struct TaskBatchOptions {
  bool enabled = true;  // false: next(task) is an error and no shard is opened
  int64_t max_len = 512;
  double sampling_exponent = 0.7;
  std::vector<std::string> languages;  // empty = every shard of the task
  // mono only: sequences are two adjacent sentences of one document, <s> a </s> b </s>, instead
  // of packed sentences (VECO's monolingual pairs, objectives.set=veco)
  bool sentence_pairs = false;
};

struct BatchOptions {
  std::string shards;          // data.shards: <shards>/mono/<lang>.idx, <shards>/para/<a>-<b>.idx
  std::string tokenizer_path;  // data.tokenizer; when set, every shard must carry its hash
  uint64_t tokenizer_hash = 0;
  bool verify_shards = false;  // data.verify_shards: CRC32 of every shard when it is opened
  // restore() continues although the shards differ from the saved state's (logging what
  // changed) instead of refusing (xlme-pretrain --allow-data-change)
  bool allow_data_change = false;
  SpecialIds ids;  // vocab_size 0 = from the shards' headers
  TaskBatchOptions mono, para;
  bool truncate_too_long = false;  // data.too_long: truncate instead of drop
  bool reset_positions = false;    // data.reset_positions
  int64_t bucket_pool = 8192;
  int64_t micro_batch_tokens = 16384;
  double mask_ratio = 0.15;
  double mask_token_ratio = 1.0;
  uint64_t seed = 1;
  int64_t loader_threads = 2;
  int64_t prefetch = 8;  // per task
  int64_t rank = 0, ranks = 1;

  // The options of `cfg` for rank `rank` of `ranks`; tasks the objective set does not train are
  // disabled. `tokenizer` (may be null) gives the special ids and the hash the shards must carry;
  // without one, a model.vocab_size above 0 is the vocabulary every shard must have.
  static BatchOptions from_config(const config::Config& cfg, const Tokenizer* tokenizer,
                                  int64_t rank, int64_t ranks);
};

// What one rank has read of one language (pair) since it started: the trainer logs these.
struct LanguageCount {
  std::string name;
  double probability = 0;    // p_j of the sampler
  int64_t shard_tokens = 0;  // m_j: tokens in the shard (the sampling unit)
  int64_t micro_batches = 0;
  int64_t sequences = 0;
  int64_t tokens = 0;   // real tokens read (special tokens included, padding not)
  int64_t padding = 0;  // padding tokens in those micro-batches
};

// Where a language's reading stands: its next micro-batch is batch `batch` of pool `pool`, and
// `consumed` micro-batches of it were read before (by all ranks together).
struct LanguageCursor {
  int64_t pool = 0;
  int64_t batch = 0;
  int64_t consumed = 0;
};

// One task's reader state: rounds read and a cursor per language (in TaskReader order).
struct ReaderState {
  int64_t round = 0;
  std::vector<LanguageCursor> cursors;
};

struct Pool;  // one pool's sequences and micro-batches (src/data/batches_internal.h)

// What the next micro-batch of a rank is, decided by the schedule before it is built.
struct BatchJob {
  int64_t round = 0;
  int64_t language = 0;
  std::shared_ptr<const Pool> pool;
  int64_t batch = 0;  // in the pool
  ReaderState after;  // the reader state once this micro-batch is read
};

// One task on one rank, synchronous: the schedule (next_job, cheap, one caller at a time) and the
// assembly (build, thread-safe). ShardBatchSource runs it on background threads.
class TaskReader {
 public:
  // Opens the task's shards; throws xlme::Error naming the folder, language, file or key at fault.
  TaskReader(const BatchOptions& options, Task task);
  ~TaskReader();
  TaskReader(const TaskReader&) = delete;
  TaskReader& operator=(const TaskReader&) = delete;

  BatchJob next_job();
  Batch build(const BatchJob& job) const;
  Batch next() { return build(next_job()); }

  Task task() const { return task_; }
  const SpecialIds& special_ids() const { return ids_; }
  std::vector<std::string> languages() const;
  const std::vector<double>& probabilities() const { return sampler_->probabilities(); }
  std::vector<int64_t> shard_tokens() const;
  // Per language: "<tokens> tokens, crc32 <bin_crc32>" of its shard, what a saved state records.
  std::vector<std::string> shard_signatures() const;

  const ReaderState& state() const { return state_; }
  void set_state(const ReaderState& state);
  // The settings a saved state is only valid with (they decide the pools and micro-batches).
  std::string settings() const;

 private:
  struct Language;
  std::shared_ptr<const Pool> pool(int64_t language, int64_t index);
  LanguageCursor walk(int64_t language, LanguageCursor cursor, int64_t batches);
  std::shared_ptr<const Pool> make_pool(const Language& language, int64_t index) const;

  BatchOptions options_;
  Task task_;
  TaskBatchOptions task_options_;
  SpecialIds ids_;
  std::vector<std::unique_ptr<Language>> languages_;
  std::unique_ptr<LanguageSampler> sampler_;
  ReaderState state_;
  bool pinned_ = false;
};

// The trainer's BatchSource over shards: one TaskReader per enabled task, data.loader_threads
// threads building up to data.prefetch micro-batches ahead per task. The batches equal those of
// the synchronous readers whatever the thread count; an error on a loader thread is re-thrown by
// next() with its message.
//
// The saved state records each shard's token count and checksum: restore() refuses a shard set
// that differs from the saved one (a language added, removed, or re-binarized) unless
// allow_data_change, and then logs what changed. It also records the tokenizer's hash and path:
// another tokenizer is refused whatever allow_data_change says (its ids mean other pieces). The
// language table (language_report) is logged when the source opens.
class ShardBatchSource : public BatchSource {
 public:
  explicit ShardBatchSource(const BatchOptions& options);
  ~ShardBatchSource() override;

  Batch next(Task task) override;
  std::string state() const override;
  void restore(const std::vector<std::string>& saved) override;

  // Per language (pair) of `task`: its probability and what this rank has read since it started.
  std::vector<LanguageCount> language_counts(Task task) const;
  // One line per language of each task: shard tokens, target share p_j and the share of the
  // tokens this rank has read.
  std::string language_report() const override;
  const SpecialIds& special_ids() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xlme::data
