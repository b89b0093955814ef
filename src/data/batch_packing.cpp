// The pools and micro-batches of the shard batch pipeline (batches.h): a pool's units packed
// (MRTD) or framed (TRTD) by framing.h, bucketed by bucketing.h, and a micro-batch's rows read
// from the shard, written and masked by batch_writer.h.
#include "xlme/data/batch_writer.h"
#include "xlme/data/bucketing.h"
#include "xlme/data/framing.h"

#include "batches_internal.h"

#include <algorithm>

namespace xlme::data {

std::shared_ptr<const Pool> TaskReader::make_pool(const Language& language, int64_t index) const {
  auto pool = std::make_shared<Pool>();
  pool->index = index;
  const Shard& shard = *language.shard;
  const int64_t begin = index * language.pool_units, end = begin + language.pool_units;
  const int64_t max_len = task_options_.max_len;
  std::vector<Pool::Sequence> sequences;
  // A pair at stream position `position` (`count` units) whose sides are segments `first` and
  // `first + 1`: kept whole, cut or dropped by fit_pair.
  const auto add_pair = [&](int64_t position, int32_t count, int64_t first) {
    const auto kept = fit_pair(shard.segment_length(first), shard.segment_length(first + 1),
                               max_len, options_.truncate_too_long);
    if (!kept) return;
    sequences.push_back(Pool::Sequence{position, count, static_cast<int32_t>(kept->e + kept->f + 3),
                                       static_cast<int32_t>(kept->e),
                                       static_cast<int32_t>(kept->f)});
  };
  if (task_ == Task::kMono && task_options_.sentence_pairs) {
    std::vector<bool> starts;
    for (int64_t i = begin; i < end; ++i) starts.push_back(shard.starts_document(language.unit(i)));
    for (const int64_t first : pair_adjacent_sentences(starts)) {
      add_pair(begin + first, 2, language.unit(begin + first));
    }
  } else if (task_ == Task::kMono) {
    std::vector<int64_t> lengths;
    for (int64_t i = begin; i < end; ++i) lengths.push_back(shard.segment_length(language.unit(i)));
    for (const auto& [first, last] : pack_sentences(lengths, max_len)) {
      int64_t tokens = 0;
      for (int64_t i = first; i < last; ++i) tokens += lengths[i];
      sequences.push_back(Pool::Sequence{begin + first, static_cast<int32_t>(last - first),
                                         static_cast<int32_t>(std::min(tokens, max_len - 2) + 2), 0,
                                         0});
    }
  } else {
    for (int64_t i = begin; i < end; ++i) add_pair(i, 1, 2 * language.unit(i));
  }
  std::vector<int64_t> lengths;
  for (const auto& s : sequences) lengths.push_back(s.length);
  const Buckets buckets = bucket_by_length(lengths, options_.micro_batch_tokens);
  for (const int64_t s : buckets.order) pool->sequences.push_back(sequences[s]);
  pool->batches = buckets.batches;
  Rng rng(hash_key({options_.seed, kSaltShuffle, static_cast<uint64_t>(task_), language.key,
                    static_cast<uint64_t>(index)}));
  for (size_t i = pool->batches.size(); i > 1; --i) {
    std::swap(pool->batches[i - 1], pool->batches[rng.below(i)]);
  }
  return pool;
}

Batch TaskReader::build(const BatchJob& job) const {
  const Pool& pool = *job.pool;
  const Language& language = *languages_[job.language];
  const Shard& shard = *language.shard;
  const auto [begin, end] = pool.batches[job.batch];
  BatchWriter writer(task_, end - begin, pool.sequences[end - 1].length, ids_, pinned_);
  Rng rng(hash_key({options_.seed, kSaltMask, static_cast<uint64_t>(task_), language.key,
                    static_cast<uint64_t>(pool.index), static_cast<uint64_t>(job.batch)}));
  const MaskOptions mask{options_.mask_ratio, options_.mask_token_ratio};
  std::vector<int32_t> e, f, tokens;
  for (int64_t b = 0; b < end - begin; ++b) {
    const Pool::Sequence& s = pool.sequences[begin + b];
    size_t second = 0;  // where f (or b) starts in a pair
    e.clear();
    if (task_ == Task::kMono && !task_options_.sentence_pairs) {
      for (int32_t u = 0; u < s.count; ++u) shard.append_segment(language.unit(s.first + u), e);
      frame_sentence(e, task_options_.max_len, ids_, tokens);
    } else {
      // Two segments: adjacent sentences a and a + 1 (VECO), or a translation pair's e and f.
      const int64_t unit = language.unit(s.first);
      const int64_t first = task_ == Task::kMono ? unit : 2 * unit;
      f.clear();
      shard.append_segment(first, e);
      shard.append_segment(first + 1, f);
      second = frame_pair(e, f, PairLengths{s.e, s.f}, ids_, tokens);
    }
    writer.write(b, tokens, second, options_.reset_positions, mask, rng);
  }
  return std::move(writer.batch());
}

}  // namespace xlme::data
