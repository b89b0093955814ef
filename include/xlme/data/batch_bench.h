// xlme-data bench: how fast one core assembles and masks training batches (batches.h), on given
// shards or on synthetic ones.
#pragma once

#include "xlme/data/batches.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::data {

struct BatchBenchReport {
  Task task = Task::kMono;
  int64_t micro_batches = 0;
  int64_t sequences = 0;
  int64_t real_tokens = 0;    // tokens in the rows, special tokens included
  int64_t padded_tokens = 0;  // B x T summed: real tokens + padding
  int64_t masked = 0;         // positions selected for prediction
  double seconds = 0;
  std::vector<LanguageCount> languages;  // what was read of each language (pair)

  double tokens_per_second() const { return real_tokens / std::max(seconds, 1e-9); }
  double padding_fraction() const {
    return padded_tokens > 0 ? 1.0 - static_cast<double>(real_tokens) / padded_tokens : 0.0;
  }
};

// Builds micro-batches of every enabled task on the calling thread (one TaskReader, no loader
// threads) for about `seconds` per task; the time covers scheduling, assembly and masking.
std::vector<BatchBenchReport> bench_batches(const BatchOptions& options, double seconds);

// Writes synthetic shards under `dir` (mono/{de,en,fr,ru,zh}, para/{en-de,en-fr,en-ru}) with
// about `mono_tokens` and `para_tokens` tokens in all, sizes falling by language so that the
// sampler has something to do, sentence lengths spread like natural text (4 to 50 tokens, mean
// 27), documents of about 10 sentences, and random non-special ids below `vocab_size`.
void write_synthetic_shards(const std::string& dir, int64_t vocab_size, int64_t mono_tokens,
                            int64_t para_tokens, uint64_t seed);

}  // namespace xlme::data
