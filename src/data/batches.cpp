#include "xlme/data/batches.h"

#include "xlme/common/error.h"
#include "xlme/data/shard.h"
#include "xlme/objectives/objective_set.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace xlme::data {

// One pool of one language: its sequences sorted by length and its micro-batches.
struct Pool {
  struct Sequence {
    int64_t first = 0;     // position of its first unit in the language's rotated stream
    int32_t count = 0;     // units (mono: sentences; para: 1)
    int32_t length = 0;    // tokens, special tokens included
    int32_t e = 0, f = 0;  // para: tokens kept of each side
  };
  int64_t index = 0;
  std::vector<Sequence> sequences;                   // ascending length
  std::vector<std::pair<int64_t, int64_t>> batches;  // [begin, end) of sequences, shuffled
};

namespace {

namespace fs = std::filesystem;

// Salts that keep the random decisions of different kinds apart.
constexpr uint64_t kSaltRotation = 0x726f74;
constexpr uint64_t kSaltShuffle = 0x736875;
constexpr uint64_t kSaltLanguage = 0x6c616e;
constexpr uint64_t kSaltMask = 0x6d736b;
constexpr const char* kStateMagic = "xlme-batches";
constexpr int kStateVersion = 1;

const char* task_key(Task task) {
  return task == Task::kMono ? "mono" : "para";
}

double uniform_of(uint64_t key) {
  return static_cast<double>(key >> 11) * 0x1.0p-53;
}

}  // namespace

struct TaskReader::Language {
  std::string name;
  std::unique_ptr<Shard> shard;
  uint64_t key = 0;        // hash_name(name)
  int64_t units = 0;       // sentences or pairs
  int64_t rotation = 0;    // the unit the stream starts at
  int64_t pool_units = 0;  // units per pool, at most one epoch
  std::map<int64_t, std::shared_ptr<const Pool>> cache;

  int64_t unit(int64_t position) const { return (rotation + position) % units; }
};

TaskReader::TaskReader(const BatchOptions& options, Task task)
    : options_(options),
      task_(task),
      task_options_(task == Task::kMono ? options.mono : options.para) {
  const char* key = task_key(task);
  const int64_t frame = task == Task::kMono ? 3 : 5;
  XLME_CHECK(task_options_.max_len >= frame,
             "data.{}.max_len ({}) is smaller than the special-token frame: {} needs at least {} "
             "tokens ({}); raise data.{}.max_len",
             key, task_options_.max_len, task == Task::kMono ? "MRTD" : "TRTD", frame,
             task == Task::kMono ? "<s> x </s>" : "<s> e </s> f </s>", key);
  XLME_CHECK(task_options_.max_len <= options.micro_batch_tokens,
             "data.{}.max_len ({}) exceeds train.micro_batch_tokens ({}): one sequence must fit "
             "in a micro-batch",
             key, task_options_.max_len, options.micro_batch_tokens);
  XLME_CHECK(task_options_.sampling_exponent > 0 && task_options_.sampling_exponent <= 1,
             "data.{}.sampling_exponent must be in (0, 1], got {}", key,
             task_options_.sampling_exponent);
  XLME_CHECK(options.mask_ratio >= 0 && options.mask_ratio <= 1 && options.mask_token_ratio >= 0 &&
                 options.mask_token_ratio <= 1,
             "objectives.mask_ratio ({}) and objectives.mask_token_ratio ({}) must be in [0, 1]",
             options.mask_ratio, options.mask_token_ratio);
  XLME_CHECK(options.ranks >= 1 && options.rank >= 0 && options.rank < options.ranks,
             "rank {} of {} ranks is out of range", options.rank, options.ranks);
  XLME_CHECK(options.bucket_pool >= 1, "data.bucket_pool ({}) must be >= 1", options.bucket_pool);

  XLME_CHECK(!options.shards.empty(),
             "data.shards is not set; binarize a corpus with xlme-data binarize --out DIR and pass "
             "--set data.shards=DIR");
  XLME_CHECK(fs::is_directory(options.shards),
             "shard folder '{}' (data.shards) not found; run xlme-data binarize --input CORPUS "
             "--out {}",
             options.shards, options.shards);
  const fs::path dir = fs::path(options.shards) / key;
  std::vector<std::string> available, without_index;
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".idx") available.push_back(e.path().stem().string());
      if (e.path().extension() == ".bin" &&
          !fs::exists(fs::path(e.path()).replace_extension(".idx"))) {
        without_index.push_back(e.path().string());
      }
    }
  }
  std::sort(available.begin(), available.end());
  for (const auto& bin : without_index) {
    // A deleted .idx (or a binarize that did not finish) would drop the language silently.
    spdlog::warn(
        "'{}' has no .idx beside it: its language is left out of {}; re-run xlme-data "
        "binarize or remove it",
        bin, key);
  }
  XLME_CHECK(!available.empty(),
             "shard folder '{}' (data.shards) has no {}/*.idx shards for {}; run xlme-data "
             "binarize --input CORPUS --out {} on a corpus with {}/",
             options.shards, key,
             task == Task::kMono
                 ? "MLM and MRTD, which every objectives.set trains on monolingual text (a "
                   "corpus of translation pairs alone trains none of them)"
                 : "TLM and TRTD (translation pairs)",
             options.shards, key);
  std::vector<std::string> names = task_options_.languages;
  if (names.empty()) names = available;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    XLME_CHECK(std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), name) ==
                   names.begin() + static_cast<std::ptrdiff_t>(i),
               "data.{}.languages names '{}' twice", key, name);
    XLME_CHECK(std::binary_search(available.begin(), available.end(), name),
               "data.{}.languages names '{}', but '{}' has no {}.idx shard; available: {}; "
               "binarize it or remove it from data.{}.languages",
               key, name, dir.string(), name, fmt::join(available, ", "), key);
    auto language = std::make_unique<Language>();
    language->name = name;
    language->shard = std::make_unique<Shard>((dir / name).string(), options.verify_shards);
    const Shard& shard = *language->shard;
    const ShardKind kind = task == Task::kMono ? ShardKind::kMono : ShardKind::kPara;
    XLME_CHECK(shard.kind() == kind, "shard '{}.idx' is not a {} shard; move it out of {}",
               shard.stem(), key, dir.string());
    if (!options.tokenizer_path.empty()) {
      shard.check_tokenizer(options.tokenizer_hash, options.tokenizer_path);
    }
    XLME_CHECK(shard.sequences() > 0 && shard.header().tokens > 0,
               "shard '{}.idx' has no tokens; re-run xlme-data binarize or remove '{}' from "
               "data.{}.languages",
               shard.stem(), name, key);
    language->key = hash_name(name);
    language->units = shard.sequences();
    language->rotation =
        static_cast<int64_t>(hash_key({options.seed, kSaltRotation, language->key}) %
                             static_cast<uint64_t>(language->units));
    language->pool_units = std::min(options.bucket_pool, language->units);
    languages_.push_back(std::move(language));
  }
  ids_ = options.ids;
  if (ids_.vocab_size == 0) {
    ids_ = SpecialIds::for_vocab(static_cast<int64_t>(languages_[0]->shard->header().vocab_size));
  }
  std::vector<double> sizes;
  for (const auto& language : languages_) {
    const auto vocab = static_cast<int64_t>(language->shard->header().vocab_size);
    XLME_CHECK(vocab == ids_.vocab_size,
               "shard '{}.idx' has a vocabulary of {} ids, expected {}; binarize every shard with "
               "the same tokenizer (data.tokenizer)",
               language->shard->stem(), vocab, ids_.vocab_size);
    sizes.push_back(static_cast<double>(language->shard->header().tokens));
  }
  sampler_ = std::make_unique<LanguageSampler>(sizes, task_options_.sampling_exponent);
  state_.cursors.assign(languages_.size(), LanguageCursor{});
  pinned_ = torch::cuda::is_available();
}

TaskReader::~TaskReader() = default;

std::vector<std::string> TaskReader::languages() const {
  std::vector<std::string> names;
  for (const auto& language : languages_) names.push_back(language->name);
  return names;
}

std::vector<int64_t> TaskReader::shard_tokens() const {
  std::vector<int64_t> tokens;
  for (const auto& language : languages_) {
    tokens.push_back(static_cast<int64_t>(language->shard->header().tokens));
  }
  return tokens;
}

std::vector<std::string> TaskReader::shard_signatures() const {
  std::vector<std::string> signatures;
  for (const auto& language : languages_) {
    const ShardHeader& h = language->shard->header();
    signatures.push_back(fmt::format("{}:{:08x}", h.tokens, h.bin_crc32));
  }
  return signatures;
}

std::string TaskReader::settings() const {
  std::string s =
      fmt::format("max_len={},micro_batch_tokens={},bucket_pool={},seed={}", task_options_.max_len,
                  options_.micro_batch_tokens, options_.bucket_pool, options_.seed);
  if (task_ == Task::kPara)
    s += options_.truncate_too_long ? ",too_long=truncate" : ",too_long=drop";
  return s;
}

void TaskReader::set_state(const ReaderState& state) {
  XLME_CHECK(state.cursors.size() == languages_.size() && state.round >= 0,
             "a {} reader state needs {} language cursors, got {}", task_key(task_),
             languages_.size(), state.cursors.size());
  state_ = state;
  for (auto& language : languages_) language->cache.clear();
}

std::shared_ptr<const Pool> TaskReader::make_pool(const Language& language, int64_t index) const {
  auto pool = std::make_shared<Pool>();
  pool->index = index;
  const Shard& shard = *language.shard;
  const int64_t begin = index * language.pool_units, end = begin + language.pool_units;
  const auto max_len = static_cast<int32_t>(task_options_.max_len);
  if (task_ == Task::kMono) {
    // Whole sentences in order while they fit between <s> and </s>.
    const int32_t room = max_len - 2;
    Pool::Sequence current{begin, 0, 0, 0, 0};
    auto flush = [&] {
      if (current.count == 0) return;
      current.length += 2;
      pool->sequences.push_back(current);
    };
    for (int64_t i = begin; i < end; ++i) {
      const auto n = static_cast<int32_t>(
          std::min<int64_t>(shard.segment_length(language.unit(i)), room + int64_t{1}));
      if (n > room) {  // truncated, alone
        flush();
        pool->sequences.push_back(Pool::Sequence{i, 1, max_len, 0, 0});
        current = Pool::Sequence{i + 1, 0, 0, 0, 0};
        continue;
      }
      if (current.count > 0 && current.length + n > room) {
        flush();
        current = Pool::Sequence{i, 0, 0, 0, 0};
      }
      ++current.count;
      current.length += n;
    }
    flush();
  } else {
    const int64_t room = max_len - 3;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t pair = language.unit(i);
      int64_t e = shard.segment_length(2 * pair), f = shard.segment_length(2 * pair + 1);
      if (e + f > room) {
        if (!options_.truncate_too_long) continue;
        // The longer side gives up tokens first; each keeps at least half the room if it needs.
        e = std::min(e, std::max((room + 1) / 2, room - f));
        f = std::min(f, room - e);
      }
      pool->sequences.push_back(Pool::Sequence{i, 1, static_cast<int32_t>(e + f + 3),
                                               static_cast<int32_t>(e), static_cast<int32_t>(f)});
    }
  }
  std::stable_sort(pool->sequences.begin(), pool->sequences.end(),
                   [](const auto& a, const auto& b) { return a.length < b.length; });
  // Ascending lengths: the row just added is the batch's longest, so rows x it is its size.
  int64_t first = 0;
  const auto count = static_cast<int64_t>(pool->sequences.size());
  for (int64_t s = 0; s < count; ++s) {
    if (s > first && (s - first + 1) * pool->sequences[s].length > options_.micro_batch_tokens) {
      pool->batches.emplace_back(first, s);
      first = s;
    }
  }
  if (count > first) pool->batches.emplace_back(first, count);
  Rng rng(hash_key({options_.seed, kSaltShuffle, static_cast<uint64_t>(task_), language.key,
                    static_cast<uint64_t>(index)}));
  for (size_t i = pool->batches.size(); i > 1; --i) {
    std::swap(pool->batches[i - 1], pool->batches[rng.below(i)]);
  }
  return pool;
}

std::shared_ptr<const Pool> TaskReader::pool(int64_t language, int64_t index) {
  auto& cache = languages_[language]->cache;
  auto it = cache.find(index);
  if (it == cache.end()) it = cache.emplace(index, make_pool(*languages_[language], index)).first;
  return it->second;
}

LanguageCursor TaskReader::walk(int64_t language, LanguageCursor cursor, int64_t batches) {
  const Language& l = *languages_[language];
  const int64_t epoch_pools = (l.units + l.pool_units - 1) / l.pool_units;
  cursor.batch += batches;
  cursor.consumed += batches;
  int64_t empty = 0;
  while (true) {
    const auto size = static_cast<int64_t>(pool(language, cursor.pool)->batches.size());
    if (cursor.batch < size) return cursor;
    empty = size == 0 ? empty + 1 : 0;
    XLME_CHECK(empty <= epoch_pools,
               "every pair of '{}' is longer than data.para.max_len ({}) and data.too_long is "
               "drop: nothing is left to read; set data.too_long=truncate, raise "
               "data.para.max_len or remove '{}' from data.para.languages",
               l.name, task_options_.max_len, l.name);
    cursor.batch -= size;
    ++cursor.pool;
  }
}

BatchJob TaskReader::next_job() {
  const int64_t ranks = options_.ranks, t = state_.round;
  std::vector<int64_t> chosen(static_cast<size_t>(ranks));
  std::vector<int64_t> per_language(languages_.size(), 0);
  for (int64_t r = 0; r < ranks; ++r) {
    chosen[r] = sampler_->pick(
        uniform_of(hash_key({options_.seed, kSaltLanguage, static_cast<uint64_t>(task_),
                             static_cast<uint64_t>(t), static_cast<uint64_t>(r)})));
    ++per_language[chosen[r]];
  }
  const int64_t mine = chosen[options_.rank];
  const auto before = std::count(chosen.begin(), chosen.begin() + options_.rank, mine);
  BatchJob job;
  job.round = t;
  job.language = mine;
  const LanguageCursor at = walk(mine, state_.cursors[mine], before);
  job.pool = pool(mine, at.pool);
  job.batch = at.batch;
  for (size_t j = 0; j < languages_.size(); ++j) {
    if (per_language[j] > 0) {
      state_.cursors[j] = walk(static_cast<int64_t>(j), state_.cursors[j], per_language[j]);
    }
    auto& cache = languages_[j]->cache;
    cache.erase(cache.begin(), cache.lower_bound(state_.cursors[j].pool));
  }
  ++state_.round;
  job.after = state_;
  return job;
}

Batch TaskReader::build(const BatchJob& job) const {
  const Pool& pool = *job.pool;
  const Language& language = *languages_[job.language];
  const Shard& shard = *language.shard;
  const auto [begin, end] = pool.batches[job.batch];
  const int64_t rows = end - begin, width = pool.sequences[end - 1].length;
  const auto options = torch::TensorOptions().pinned_memory(pinned_);
  Batch batch;
  batch.task = task_;
  batch.input_ids = torch::empty({rows, width}, options.dtype(torch::kInt64));  // [B, T]
  batch.labels = torch::empty({rows, width}, options.dtype(torch::kInt64));     // [B, T]
  batch.positions = torch::empty({rows, width}, options.dtype(torch::kInt64));  // [B, T]
  batch.masked = torch::empty({rows, width}, options.dtype(torch::kBool));      // [B, T]
  batch.padding = torch::empty({rows, width}, options.dtype(torch::kBool));     // [B, T]
  int64_t* input = batch.input_ids.data_ptr<int64_t>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  int64_t* positions = batch.positions.data_ptr<int64_t>();
  bool* masked = batch.masked.data_ptr<bool>();
  bool* padding = batch.padding.data_ptr<bool>();
  Rng rng(hash_key({options_.seed, kSaltMask, static_cast<uint64_t>(task_), language.key,
                    static_cast<uint64_t>(pool.index), static_cast<uint64_t>(job.batch)}));
  const auto max_content = static_cast<size_t>(task_options_.max_len - 1);
  std::vector<int32_t> tokens;
  std::vector<int64_t> candidates;
  tokens.reserve(static_cast<size_t>(width));
  for (int64_t b = 0; b < rows; ++b) {
    const Pool::Sequence& s = pool.sequences[begin + b];
    tokens.assign(1, static_cast<int32_t>(ids_.bos));
    size_t second = 0;  // where f starts (para)
    if (task_ == Task::kMono) {
      for (int32_t u = 0; u < s.count; ++u)
        shard.append_segment(language.unit(s.first + u), tokens);
      if (tokens.size() > max_content) tokens.resize(max_content);
      tokens.push_back(static_cast<int32_t>(ids_.eos));
    } else {
      const int64_t pair = language.unit(s.first);
      shard.append_segment(2 * pair, tokens);
      tokens.resize(1 + static_cast<size_t>(s.e));
      tokens.push_back(static_cast<int32_t>(ids_.eos));
      second = tokens.size();
      shard.append_segment(2 * pair + 1, tokens);
      tokens.resize(second + static_cast<size_t>(s.f));
      tokens.push_back(static_cast<int32_t>(ids_.eos));
    }
    const auto length = static_cast<int64_t>(tokens.size());
    const int64_t row = b * width;
    candidates.clear();
    for (int64_t i = 0; i < length; ++i) {
      input[row + i] = labels[row + i] = tokens[i];
      positions[row + i] = i;
      masked[row + i] = padding[row + i] = false;
      if (!ids_.is_special(tokens[i])) candidates.push_back(i);
    }
    for (int64_t i = length; i < width; ++i) {
      input[row + i] = labels[row + i] = ids_.pad;
      positions[row + i] = i;
      masked[row + i] = false;
      padding[row + i] = true;
    }
    if (second > 0 && options_.reset_positions) {
      // f restarts where e started: right after <s>'s position 0.
      for (auto i = static_cast<int64_t>(second); i < length; ++i) {
        positions[row + i] = 1 + i - static_cast<int64_t>(second);
      }
    }
    // k of the n candidates, with E[k] = ratio * n exactly (randomized rounding), drawn
    // uniformly without replacement by a partial Fisher-Yates shuffle.
    const auto n = static_cast<int64_t>(candidates.size());
    const int64_t k = std::min<int64_t>(
        n, static_cast<int64_t>(options_.mask_ratio * static_cast<double>(n) + rng.uniform()));
    for (int64_t q = 0; q < k; ++q) {
      std::swap(candidates[q], candidates[q + static_cast<int64_t>(rng.below(n - q))]);
      const int64_t i = row + candidates[q];
      masked[i] = true;
      if (rng.uniform() < options_.mask_token_ratio) input[i] = ids_.mask;
    }
    batch.real_tokens += length;
  }
  return batch;
}

BatchOptions BatchOptions::from_config(const config::Config& cfg, const Tokenizer* tokenizer,
                                       int64_t rank, int64_t ranks) {
  BatchOptions o;
  o.shards = cfg.data.shards;
  if (tokenizer != nullptr) {
    o.tokenizer_path = cfg.data.tokenizer;
    o.tokenizer_hash = tokenizer->hash();
    o.ids = tokenizer->special_ids();
  } else if (cfg.model.vocab_size > 0) {
    // No tokenizer: the model's vocabulary is the one every shard must have, so that a shard
    // with more ids is refused by name at the start instead of indexing past the embeddings.
    o.ids = SpecialIds::for_vocab(cfg.model.vocab_size);
  }
  const auto task = [](const config::TaskDataConfig& d) {
    TaskBatchOptions t;
    t.max_len = d.max_len;
    t.sampling_exponent = d.sampling_exponent;
    t.languages = d.languages;
    return t;
  };
  o.mono = task(cfg.data.mono);
  o.para = task(cfg.data.para);
  const auto& objective_set = objectives::objective_set(cfg.objectives.set);
  o.mono.enabled = objective_set.monolingual;
  o.para.enabled = objective_set.translation_pairs;
  o.truncate_too_long = cfg.data.too_long == "truncate";
  o.verify_shards = cfg.data.verify_shards;
  o.reset_positions = cfg.data.reset_positions;
  o.bucket_pool = cfg.data.bucket_pool;
  o.micro_batch_tokens = cfg.train.micro_batch_tokens;
  o.mask_ratio = cfg.objectives.mask_ratio;
  o.mask_token_ratio = cfg.objectives.mask_token_ratio;
  o.seed = static_cast<uint64_t>(cfg.run.seed);
  o.loader_threads = cfg.data.loader_threads;
  o.prefetch = cfg.data.prefetch;
  o.rank = rank;
  o.ranks = ranks;
  return o;
}

// ---- ShardBatchSource: readers on loader threads, in order, with the consumed state -----------

struct ShardBatchSource::Impl {
  struct Slot {
    Batch batch;
    int64_t language = 0;
    ReaderState after;
    std::exception_ptr error;
  };
  struct Pipeline {
    std::unique_ptr<TaskReader> reader;
    int64_t scheduled = 0;          // jobs handed to loader threads
    int64_t consumed = 0;           // batches returned by next()
    std::map<int64_t, Slot> ready;  // built, by job number
    ReaderState consumed_state;     // the reader state after the last batch next() returned
    std::vector<LanguageCount> counts;
  };

  BatchOptions options;
  std::array<std::unique_ptr<Pipeline>, 2> pipelines;  // by Task
  mutable std::mutex mutex;
  std::condition_variable work_cv, ready_cv;
  bool stopping = false;
  size_t turn = 0;
  std::vector<std::thread> workers;

  Pipeline* pipeline(Task task) const {
    Pipeline* p = pipelines[static_cast<size_t>(task)].get();
    XLME_CHECK(p != nullptr,
               "no {} batches: this batch source was built without the {} task (objectives.set "
               "does not train it)",
               task_key(task), task == Task::kMono ? "MRTD" : "TRTD");
    return p;
  }

  // A pipeline with room in its prefetch window, taking turns; null when none has.
  Pipeline* pick() {
    for (size_t i = 0; i < pipelines.size(); ++i) {
      Pipeline* p = pipelines[(turn + i) % pipelines.size()].get();
      if (p != nullptr && p->scheduled - p->consumed < options.prefetch) {
        turn = (turn + i + 1) % pipelines.size();
        return p;
      }
    }
    return nullptr;
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      Pipeline* p = nullptr;
      work_cv.wait(lock, [&] { return stopping || (p = pick()) != nullptr; });
      if (stopping) return;
      const int64_t number = p->scheduled++;
      Slot slot;
      BatchJob job;
      try {
        job = p->reader->next_job();  // the schedule is sequential: under the lock
      } catch (...) {
        slot.error = std::current_exception();
      }
      lock.unlock();
      if (!slot.error) {
        try {
          slot.batch = p->reader->build(job);
          slot.language = job.language;
          slot.after = std::move(job.after);
        } catch (...) {
          slot.error = std::current_exception();
        }
      }
      job.pool.reset();
      lock.lock();
      p->ready.emplace(number, std::move(slot));
      ready_cv.notify_all();
    }
  }

  void start() {
    stopping = false;
    for (int64_t i = 0; i < options.loader_threads; ++i) workers.emplace_back([this] { work(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    work_cv.notify_all();
    for (auto& w : workers) w.join();
    workers.clear();
  }
};

namespace {

struct SavedTask {
  bool present = false;
  int64_t round = 0;
  std::string settings;
  std::map<std::string, LanguageCursor> cursors;
  std::map<std::string, std::string> shards;  // language -> TaskReader::shard_signatures()
};

struct SavedState {
  int64_t ranks = 0, rank = 0;
  std::array<SavedTask, 2> tasks;
};

SavedState parse_state(const std::string& text, size_t which) {
  SavedState s;
  std::istringstream in(text);
  std::string magic;
  int version = 0;
  in >> magic >> version;
  XLME_CHECK(magic == kStateMagic && version == kStateVersion,
             "saved data state #{} is not an {} v{} state (starts with '{}'); the checkpoint "
             "was written by another version of xlme",
             which, kStateMagic, kStateVersion, text.substr(0, 40));
  std::string word;
  while (in >> word) {
    if (word == "ranks") {
      in >> s.ranks;
    } else if (word == "rank") {
      in >> s.rank;
    } else if (word == "shard") {
      std::string task, name, signature;
      in >> task >> name >> signature;
      s.tasks[task == "mono" ? 0 : 1].shards[name] = signature;
    } else if (word == "mono" || word == "para") {
      SavedTask& t = s.tasks[word == "mono" ? 0 : 1];
      std::string what;
      in >> what;
      if (what == "round") {
        t.present = true;
        in >> t.round >> word >> t.settings;
      } else {
        LanguageCursor c;
        in >> c.pool >> c.batch >> c.consumed;
        t.cursors[what] = c;
      }
    } else {
      XLME_FAIL("saved data state #{}: unexpected '{}'", which, word);
    }
    XLME_CHECK(!in.fail(), "saved data state #{} is malformed near '{}'", which, word);
  }
  XLME_CHECK(s.ranks >= 1, "saved data state #{} names no number of ranks", which);
  return s;
}

// Compares the shards a state was saved with (states without shard lines compare equal) with the
// reader's: fails on a difference unless `allow_change`, then logs it.
void check_shard_set(Task task, const SavedTask& saved, const TaskReader& reader,
                     bool allow_change) {
  if (saved.shards.empty()) return;
  std::map<std::string, std::string> now;
  const auto names = reader.languages();
  const auto signatures = reader.shard_signatures();
  for (size_t j = 0; j < names.size(); ++j) now[names[j]] = signatures[j];
  std::vector<std::string> changes;
  for (const auto& [name, signature] : saved.shards) {
    const auto it = now.find(name);
    if (it == now.end()) {
      changes.push_back(fmt::format("'{}' removed (had {})", name, signature));
    } else if (it->second != signature) {
      changes.push_back(fmt::format("'{}' changed ({} -> {})", name, signature, it->second));
    }
  }
  for (const auto& [name, signature] : now) {
    if (saved.shards.count(name) == 0) {
      changes.push_back(fmt::format("'{}' added ({})", name, signature));
    }
  }
  if (changes.empty()) return;
  XLME_CHECK(allow_change,
             "the {} shards differ from those the checkpoint was trained on (tokens:crc32): {}; "
             "restore the shards (data.shards) or pass --allow-data-change to continue with these",
             task_key(task), fmt::join(changes, ", "));
  spdlog::warn("--allow-data-change: the {} shards differ from the checkpoint's: {}",
               task_key(task), fmt::join(changes, ", "));
}

}  // namespace

ShardBatchSource::ShardBatchSource(const BatchOptions& options) : impl_(std::make_unique<Impl>()) {
  XLME_CHECK(options.loader_threads >= 1 && options.prefetch >= 1,
             "data.loader_threads ({}) and data.prefetch ({}) must be >= 1", options.loader_threads,
             options.prefetch);
  XLME_CHECK(options.mono.enabled || options.para.enabled, "no task enabled: nothing to read");
  impl_->options = options;
  for (const Task task : {Task::kMono, Task::kPara}) {
    if (!(task == Task::kMono ? options.mono : options.para).enabled) continue;
    auto p = std::make_unique<Impl::Pipeline>();
    p->reader = std::make_unique<TaskReader>(options, task);
    p->consumed_state = p->reader->state();
    const auto names = p->reader->languages();
    const auto tokens = p->reader->shard_tokens();
    for (size_t j = 0; j < names.size(); ++j) {
      LanguageCount c;
      c.name = names[j];
      c.probability = p->reader->probabilities()[j];
      c.shard_tokens = tokens[j];
      p->counts.push_back(c);
    }
    impl_->pipelines[static_cast<size_t>(task)] = std::move(p);
  }
  spdlog::info(
      "data: languages, shard tokens, target share p and realized share of tokens read "
      "(this rank){}",
      language_report());
  impl_->start();
}

ShardBatchSource::~ShardBatchSource() {
  impl_->stop();
}

const SpecialIds& ShardBatchSource::special_ids() const {
  for (const auto& p : impl_->pipelines) {
    if (p) return p->reader->special_ids();
  }
  XLME_FAIL("no task enabled");
}

Batch ShardBatchSource::next(Task task) {
  Impl::Pipeline* p = impl_->pipeline(task);
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->ready_cv.wait(lock, [&] { return p->ready.count(p->consumed) > 0; });
  auto node = p->ready.extract(p->consumed);
  ++p->consumed;
  impl_->work_cv.notify_all();
  Impl::Slot& slot = node.mapped();
  if (slot.error) std::rethrow_exception(slot.error);
  p->consumed_state = std::move(slot.after);
  LanguageCount& c = p->counts[slot.language];
  const Batch& b = slot.batch;
  ++c.micro_batches;
  c.sequences += b.input_ids.size(0);
  c.tokens += b.real_tokens;
  c.padding += b.input_ids.numel() - b.real_tokens;
  return std::move(slot.batch);
}

std::vector<LanguageCount> ShardBatchSource::language_counts(Task task) const {
  const Impl::Pipeline* p = impl_->pipeline(task);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return p->counts;
}

std::string ShardBatchSource::language_report() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::string table;
  for (const Task task : {Task::kMono, Task::kPara}) {
    const auto& p = impl_->pipelines[static_cast<size_t>(task)];
    if (!p) continue;
    int64_t read = 0;
    for (const auto& c : p->counts) read += c.tokens;
    for (const auto& c : p->counts) {
      table += fmt::format("\n  {} {:<8} {:>12} tokens  target {:5.1f}%  realized {:5.1f}%",
                           task_key(task), c.name, c.shard_tokens, 100 * c.probability,
                           read > 0 ? 100.0 * static_cast<double>(c.tokens) / read : 0.0);
    }
  }
  return table;
}

std::string ShardBatchSource::state() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::string text = fmt::format("{} {}\nranks {}\nrank {}\n", kStateMagic, kStateVersion,
                                 impl_->options.ranks, impl_->options.rank);
  for (const Task task : {Task::kMono, Task::kPara}) {
    const auto& p = impl_->pipelines[static_cast<size_t>(task)];
    if (!p) continue;
    const ReaderState& s = p->consumed_state;
    text +=
        fmt::format("{} round {} settings {}\n", task_key(task), s.round, p->reader->settings());
    const auto names = p->reader->languages();
    for (size_t j = 0; j < names.size(); ++j) {
      const LanguageCursor& c = s.cursors[j];
      text +=
          fmt::format("{} {} {} {} {}\n", task_key(task), names[j], c.pool, c.batch, c.consumed);
    }
    const auto signatures = p->reader->shard_signatures();
    for (size_t j = 0; j < names.size(); ++j) {
      text += fmt::format("shard {} {} {}\n", task_key(task), names[j], signatures[j]);
    }
  }
  return text;
}

void ShardBatchSource::restore(const std::vector<std::string>& saved) {
  XLME_CHECK(!saved.empty(), "restoring the data state needs the state of at least one rank");
  std::vector<SavedState> states;
  for (size_t i = 0; i < saved.size(); ++i) {
    states.push_back(parse_state(saved[i], i));
    XLME_CHECK(states.back().ranks == static_cast<int64_t>(saved.size()),
               "saved data state #{} was written by one of {} ranks, but {} states were given; "
               "pass the state of every rank of the saving run",
               i, states.back().ranks, saved.size());
  }
  std::array<ReaderState, 2> restored;
  for (const Task task : {Task::kMono, Task::kPara}) {
    const size_t t = static_cast<size_t>(task);
    const auto& p = impl_->pipelines[t];
    if (!p) continue;
    // Every rank's cursors are global: ranks that saved after the same number of micro-batches
    // hold the same state. If some lag, the most advanced state wins (the laggards skip the
    // micro-batches they had not read).
    const SavedTask* best = nullptr;
    for (const auto& s : states) {
      if (s.tasks[t].present && (best == nullptr || s.tasks[t].round > best->round)) {
        best = &s.tasks[t];
      }
    }
    ReaderState state;
    state.cursors.assign(p->reader->languages().size(), LanguageCursor{});
    if (best != nullptr) {
      XLME_CHECK(best->settings == p->reader->settings(),
                 "the saved {} data state was made with {}, this run has {}; the cursors address "
                 "micro-batches of those settings: restore with the same data and train settings",
                 task_key(task), best->settings, p->reader->settings());
      state.round = best->round;
      check_shard_set(task, *best, *p->reader, impl_->options.allow_data_change);
      const auto names = p->reader->languages();
      for (size_t j = 0; j < names.size(); ++j) {
        const auto it = best->cursors.find(names[j]);
        if (it != best->cursors.end()) state.cursors[j] = it->second;  // new languages start at 0
      }
    }
    restored[t] = state;
  }
  impl_->stop();
  for (size_t t = 0; t < restored.size(); ++t) {
    const auto& p = impl_->pipelines[t];
    if (!p) continue;
    p->reader->set_state(restored[t]);
    p->consumed_state = restored[t];
    p->scheduled = p->consumed = 0;
    p->ready.clear();
  }
  impl_->start();
}

}  // namespace xlme::data
