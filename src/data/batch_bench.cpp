#include "xlme/data/batch_bench.h"

#include "xlme/common/error.h"
#include "xlme/data/sampler.h"
#include "xlme/data/shard.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace xlme::data {

std::vector<BatchBenchReport> bench_batches(const BatchOptions& options, double seconds) {
  using Clock = std::chrono::steady_clock;
  std::vector<BatchBenchReport> reports;
  for (const Task task : {Task::kMono, Task::kPara}) {
    if (!(task == Task::kMono ? options.mono : options.para).enabled) continue;
    TaskReader reader(options, task);
    BatchBenchReport r;
    r.task = task;
    const auto names = reader.languages();
    const auto shard_tokens = reader.shard_tokens();
    for (size_t j = 0; j < names.size(); ++j) {
      LanguageCount c;
      c.name = names[j];
      c.probability = reader.probabilities()[j];
      c.shard_tokens = shard_tokens[j];
      r.languages.push_back(c);
    }
    const auto start = Clock::now();
    do {
      const BatchJob job = reader.next_job();
      const Batch batch = reader.build(job);
      const int64_t rows = batch.input_ids.size(0), cells = batch.input_ids.numel();
      ++r.micro_batches;
      r.sequences += rows;
      r.real_tokens += batch.real_tokens;
      r.padded_tokens += cells;
      const bool* masked = batch.masked.data_ptr<bool>();
      r.masked += std::count(masked, masked + cells, true);
      LanguageCount& c = r.languages[job.language];
      ++c.micro_batches;
      c.sequences += rows;
      c.tokens += batch.real_tokens;
      c.padding += cells - batch.real_tokens;
      r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    } while (r.seconds < seconds);
    reports.push_back(std::move(r));
  }
  return reports;
}

void write_synthetic_shards(const std::string& dir, int64_t vocab_size, int64_t mono_tokens,
                            int64_t para_tokens, uint64_t seed) {
  XLME_CHECK(vocab_size > 6, "a synthetic vocabulary needs more than 6 ids, got {}", vocab_size);
  Rng rng(hash_key({seed, 0x73796e}));
  // Ids 4 .. vocab_size - 2: never <s>, <pad>, </s>, <unk> or <mask>.
  const auto token = [&] { return static_cast<int32_t>(4 + rng.below(vocab_size - 5)); };
  const auto length = [&] { return static_cast<int64_t>(4 + rng.below(24) + rng.below(24)); };
  const auto sentence = [&](int64_t n) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& id : s) id = token();
    return s;
  };
  const std::vector<std::pair<std::string, double>> mono = {
      {"de", 0.38}, {"en", 0.3}, {"fr", 0.18}, {"ru", 0.1}, {"zh", 0.04}};
  for (const auto& [name, share] : mono) {
    std::vector<std::vector<int32_t>> sentences;
    std::vector<int64_t> documents;
    int64_t tokens = 0;
    while (tokens < static_cast<int64_t>(share * static_cast<double>(mono_tokens))) {
      if (rng.below(10) == 0 || documents.empty()) {
        documents.push_back(static_cast<int64_t>(sentences.size()));
      }
      sentences.push_back(sentence(length()));
      tokens += static_cast<int64_t>(sentences.back().size());
    }
    write_shard((std::filesystem::path(dir) / "mono" / name).string(), ShardKind::kMono, name,
                sentences, documents, vocab_size, 0);
  }
  const std::vector<std::pair<std::string, double>> para = {
      {"en-de", 0.6}, {"en-fr", 0.3}, {"en-ru", 0.1}};
  for (const auto& [name, share] : para) {
    std::vector<std::vector<int32_t>> segments;
    int64_t tokens = 0;
    while (tokens < static_cast<int64_t>(share * static_cast<double>(para_tokens))) {
      const int64_t e = length();
      // f within +-25% of e: translations track their source's length.
      const int64_t f = std::max<int64_t>(1, e * (75 + static_cast<int64_t>(rng.below(51))) / 100);
      segments.push_back(sentence(e));
      segments.push_back(sentence(f));
      tokens += e + f;
    }
    write_shard((std::filesystem::path(dir) / "para" / name).string(), ShardKind::kPara, name,
                segments, {}, vocab_size, 0);
  }
}

}  // namespace xlme::data
