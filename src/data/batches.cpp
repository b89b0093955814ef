// The reader of the shard batch pipeline (batches.h): the options, and a task's shards opened and
// checked.
#include "xlme/data/batches.h"

#include "xlme/common/error.h"
#include "xlme/config/objective_set.h"

#include "batches_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <algorithm>
#include <filesystem>

namespace xlme::data {
namespace {

namespace fs = std::filesystem;

// The settings a task's reader needs to make sense of, checked before any shard is opened.
void check_options(const BatchOptions& options, Task task, const TaskBatchOptions& task_options) {
  const char* key = task_key(task);
  const bool pairs = task == Task::kPara || task_options.sentence_pairs;
  XLME_CHECK(task_options.max_len >= (pairs ? 5 : 3),
             "data.{}.max_len ({}) is smaller than the special-token frame: {} needs at least {} "
             "tokens ({}); raise data.{}.max_len",
             key, task_options.max_len,
             task == Task::kPara ? "TRTD"
             : pairs             ? "a pair of adjacent sentences (objectives.set=veco)"
                                 : "MRTD",
             pairs ? 5 : 3,
             task == Task::kPara ? "<s> e </s> f </s>"
             : pairs             ? "<s> a </s> b </s>"
                                 : "<s> x </s>",
             key);
  XLME_CHECK(task_options.max_len <= options.micro_batch_tokens,
             "data.{}.max_len ({}) exceeds train.micro_batch_tokens ({}): one sequence must fit "
             "in a micro-batch",
             key, task_options.max_len, options.micro_batch_tokens);
  XLME_CHECK(task_options.sampling_exponent > 0 && task_options.sampling_exponent <= 1,
             "data.{}.sampling_exponent must be in (0, 1], got {}", key,
             task_options.sampling_exponent);
  XLME_CHECK(options.mask_ratio >= 0 && options.mask_ratio <= 1 && options.mask_token_ratio >= 0 &&
                 options.mask_token_ratio <= 1,
             "objectives.mask_ratio ({}) and objectives.mask_token_ratio ({}) must be in [0, 1]",
             options.mask_ratio, options.mask_token_ratio);
  XLME_CHECK(options.ranks >= 1 && options.rank >= 0 && options.rank < options.ranks,
             "rank {} of {} ranks is out of range", options.rank, options.ranks);
  XLME_CHECK(options.bucket_pool >= 1, "data.bucket_pool ({}) must be >= 1", options.bucket_pool);
}

// The languages that have a shard (a .idx) in the task's folder `dir` of data.shards, sorted; a
// .bin without its .idx is named in a warning. Throws when there is none.
std::vector<std::string> shard_languages(const BatchOptions& options, Task task,
                                         const fs::path& dir) {
  const char* key = task_key(task);
  XLME_CHECK(!options.shards.empty(),
             "data.shards is not set; binarize a corpus with xlme-data binarize --out DIR and pass "
             "--set data.shards=DIR");
  XLME_CHECK(fs::is_directory(options.shards),
             "shard folder '{}' (data.shards) not found; run xlme-data binarize --input CORPUS "
             "--out {}",
             options.shards, options.shards);
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
  return available;
}

// Language `name`'s shard in `dir`, checked: of the task's kind, binarized with data.tokenizer,
// not empty.
std::unique_ptr<Shard> open_shard(const BatchOptions& options, Task task, const fs::path& dir,
                                  const std::string& name) {
  const char* key = task_key(task);
  auto shard = std::make_unique<Shard>((dir / name).string(), options.verify_shards);
  const ShardKind kind = task == Task::kMono ? ShardKind::kMono : ShardKind::kPara;
  XLME_CHECK(shard->kind() == kind, "shard '{}.idx' is not a {} shard; move it out of {}",
             shard->stem(), key, dir.string());
  if (!options.tokenizer_path.empty()) {
    shard->check_tokenizer(options.tokenizer_hash, options.tokenizer_path);
  }
  XLME_CHECK(shard->sequences() > 0 && shard->header().tokens > 0,
             "shard '{}.idx' has no tokens; re-run xlme-data binarize or remove '{}' from "
             "data.{}.languages",
             shard->stem(), name, key);
  return shard;
}

}  // namespace

TaskReader::TaskReader(const BatchOptions& options, Task task)
    : options_(options),
      task_(task),
      task_options_(task == Task::kMono ? options.mono : options.para) {
  check_options(options, task, task_options_);
  const char* key = task_key(task);
  const fs::path dir = fs::path(options.shards) / key;
  const std::vector<std::string> available = shard_languages(options, task, dir);
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
    language->shard = open_shard(options, task, dir, name);
    language->key = hash_name(name);
    language->units = language->shard->sequences();
    language->rotation =
        static_cast<int64_t>(hash_key({options.seed, kSaltRotation, language->key}) %
                             static_cast<uint64_t>(language->units));
    language->pool_units = std::min(options.bucket_pool, language->units);
    languages_.push_back(std::move(language));
  }
  // Every shard shares one vocabulary: data.tokenizer's, or the first shard's.
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
  o.mono.sentence_pairs = objective_set.cross_attention;
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

}  // namespace xlme::data
