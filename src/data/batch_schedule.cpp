// The schedule of the shard batch pipeline (batches.h): which language (pair) each rank reads in
// each round, and each language's cursor through its pools' micro-batches.
#include "xlme/common/error.h"

#include "batches_internal.h"

#include <algorithm>

namespace xlme::data {
namespace {

double uniform_of(uint64_t key) {
  return static_cast<double>(key >> 11) * 0x1.0p-53;
}

}  // namespace

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
  const char* key = task_key(task_);
  while (true) {
    const auto size = static_cast<int64_t>(pool(language, cursor.pool)->batches.size());
    if (cursor.batch < size) return cursor;
    empty = size == 0 ? empty + 1 : 0;
    XLME_CHECK(empty <= epoch_pools,
               "{} of '{}' is longer than data.{}.max_len ({}) and data.too_long is drop: "
               "nothing is left to read; set data.too_long=truncate, raise data.{}.max_len or "
               "remove '{}' from data.{}.languages",
               task_ == Task::kPara ? "every pair"
                                    : "every pair of adjacent sentences (objectives.set=veco; a "
                                      "document of one sentence gives none)",
               l.name, key, task_options_.max_len, key, l.name, key);
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

}  // namespace xlme::data
