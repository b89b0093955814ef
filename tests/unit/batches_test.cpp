// Training batches against naive references: sampler frequencies vs p_j ∝ m_j^alpha, packing
// (every sentence once, in order, frames), TRTD frames, positions, drop/truncate, the token
// budget, masking statistics and positions, determinism, state save/restore, N -> M re-split,
// prefetch thread counts, and the bad-input messages.
#include "xlme/data/batches.h"
#include "xlme/data/batch_bench.h"
#include "xlme/data/binarize.h"
#include "xlme/data/framing.h"
#include "xlme/data/pair_sides.h"
#include "xlme/data/shard.h"

#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

namespace xlme::data {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

constexpr int64_t kVocab = 2000;

// Sentence i of a test shard: `length(i)` copies of id 4 + i, so that a row tells which
// sentences it holds and in which order.
int64_t sentence_length(int64_t i) {
  return 1 + (i * 7) % 13;
}

void write_mono(const std::string& dir, const std::string& name, int64_t sentences,
                int64_t long_sentence = -1, int64_t long_length = 0) {
  std::vector<std::vector<int32_t>> segments;
  std::vector<int64_t> documents;
  for (int64_t i = 0; i < sentences; ++i) {
    if (i % 5 == 0) documents.push_back(i);
    const int64_t n = i == long_sentence ? long_length : sentence_length(i);
    segments.emplace_back(static_cast<size_t>(n), static_cast<int32_t>(4 + i));
  }
  write_shard(dir + "/mono/" + name, ShardKind::kMono, name, segments, documents, kVocab, 0);
}

// Pair p: e = e_len(p) copies of 4 + p, f = f_len(p) copies of 1000 + p.
int64_t e_len(int64_t p) {
  return 1 + (p * 5) % 11;
}
int64_t f_len(int64_t p) {
  return 1 + (p * 3) % 9;
}

void write_para(const std::string& dir, const std::string& name, int64_t pairs) {
  std::vector<std::vector<int32_t>> segments;
  for (int64_t p = 0; p < pairs; ++p) {
    segments.emplace_back(static_cast<size_t>(e_len(p)), static_cast<int32_t>(4 + p));
    segments.emplace_back(static_cast<size_t>(f_len(p)), static_cast<int32_t>(1000 + p));
  }
  write_shard(dir + "/para/" + name, ShardKind::kPara, name, segments, {}, kVocab, 0);
}

BatchOptions base_options(const std::string& shards) {
  BatchOptions o;
  o.shards = shards;
  o.mono.max_len = 16;
  o.para.max_len = 16;
  o.bucket_pool = 100000;
  o.micro_batch_tokens = 64;
  o.mask_ratio = 0.15;
  o.loader_threads = 2;
  o.prefetch = 3;
  return o;
}

// The tokens of row b up to its padding.
std::vector<int64_t> row_of(const Batch& batch, int64_t b) {
  std::vector<int64_t> row;
  for (int64_t i = 0; i < batch.labels.size(1); ++i) {
    if (batch.padding[b][i].item<bool>()) break;
    row.push_back(batch.labels[b][i].item<int64_t>());
  }
  return row;
}

// Every field of a batch, to compare batches as values.
std::string fingerprint(const Batch& b) {
  const auto bytes = [](const torch::Tensor& t) {
    const torch::Tensor c = t.contiguous();
    return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
  };
  return std::to_string(static_cast<int>(b.task)) + ":" + std::to_string(b.input_ids.size(0)) +
         "x" + std::to_string(b.input_ids.size(1)) + ":" + std::to_string(b.real_tokens) + ":" +
         bytes(b.input_ids) + bytes(b.labels) + bytes(b.masked) + bytes(b.padding) +
         bytes(b.positions);
}

void expect_budget_and_shapes(const Batch& b, int64_t budget) {
  ASSERT_EQ(b.input_ids.dim(), 2);
  EXPECT_LE(b.input_ids.numel(), budget);
  EXPECT_EQ(b.input_ids.scalar_type(), torch::kInt64);
  EXPECT_EQ(b.positions.scalar_type(), torch::kInt64);
  EXPECT_EQ(b.padding.scalar_type(), torch::kBool);
  EXPECT_EQ(b.masked.scalar_type(), torch::kBool);
  EXPECT_EQ(b.real_tokens, b.input_ids.numel() - b.padding.sum().item<int64_t>());
}

TEST(LanguageSampler, FrequenciesFollowTheFormula) {
  const std::vector<double> sizes = {5000, 800, 60, 3};
  for (const double alpha : {0.3, 0.7, 1.0}) {
    const LanguageSampler sampler(sizes, alpha);
    double total = 0;
    for (const double m : sizes) total += std::pow(m, alpha);
    std::vector<int64_t> hits(sizes.size(), 0);
    const int64_t draws = 200000;
    Rng rng(hash_key({7, static_cast<uint64_t>(alpha * 10)}));
    for (int64_t i = 0; i < draws; ++i) ++hits[sampler.pick(rng.uniform())];
    for (size_t j = 0; j < sizes.size(); ++j) {
      const double p = std::pow(sizes[j], alpha) / total;
      EXPECT_NEAR(sampler.probabilities()[j], p, 1e-12);
      const double sigma = std::sqrt(p * (1 - p) / draws);
      EXPECT_NEAR(static_cast<double>(hits[j]) / draws, p, 5 * sigma + 1e-9) << alpha << " " << j;
    }
  }
  EXPECT_TRUE(contains_all(error_message([] {
                             LanguageSampler({1, 2}, 0.0);
                           }),
                           {"alpha must be in (0, 1], got 0"}));
  EXPECT_TRUE(contains_all(error_message([] {
                             LanguageSampler({1, 2}, 1.5);
                           }),
                           {"alpha must be in (0, 1], got 1.5"}));
}

TEST(Batches, MonoPacksEverySentenceOnceInOrderWithinTheBudget) {
  TempDir dir;
  const int64_t n = 300;
  write_mono(dir.path().string(), "de", n, /*long_sentence=*/37, /*long_length=*/40);
  BatchOptions o = base_options(dir.path().string());
  o.para.enabled = false;
  TaskReader reader(o, Task::kMono);
  // One pool = one epoch: read until the cursor enters pool 1.
  std::vector<std::vector<int64_t>> rows;
  while (reader.state().cursors[0].pool == 0) {
    const Batch b = reader.next();
    expect_budget_and_shapes(b, o.micro_batch_tokens);
    for (int64_t r = 0; r < b.labels.size(0); ++r) rows.push_back(row_of(b, r));
  }
  // Each row: <s> whole consecutive sentences </s>; the long one truncated, alone.
  std::map<int64_t, std::pair<int64_t, int64_t>> by_first;  // first sentence -> (last, tokens)
  std::vector<int> seen(n, 0);
  for (const auto& row : rows) {
    ASSERT_GE(row.size(), 3u);
    ASSERT_LE(static_cast<int64_t>(row.size()), o.mono.max_len);
    EXPECT_EQ(row.front(), 0);
    EXPECT_EQ(row.back(), 2);
    std::vector<int64_t> sentences;
    size_t i = 1;
    while (i + 1 < row.size()) {
      const int64_t s = row[i] - 4;
      ASSERT_GE(s, 0);
      size_t j = i;
      while (j + 1 < row.size() && row[j] == row[i]) ++j;
      const auto run = static_cast<int64_t>(j - i);
      if (s == 37) {
        EXPECT_EQ(run, o.mono.max_len - 2);
        EXPECT_EQ(row.size(), static_cast<size_t>(o.mono.max_len));
      } else {
        EXPECT_EQ(run, sentence_length(s)) << "sentence " << s << " split or merged";
      }
      if (!sentences.empty()) {
        EXPECT_EQ(s, (sentences.back() + 1) % n) << "out of order";
      }
      sentences.push_back(s);
      ++seen[s];
      i = j;
    }
    by_first[sentences.front()] = {sentences.back(), static_cast<int64_t>(row.size()) - 2};
  }
  for (int64_t s = 0; s < n; ++s) EXPECT_EQ(seen[s], 1) << "sentence " << s;
  // Rows chain in order from the rotation offset around the whole epoch, and packing is
  // greedy: the next sentence would not have fit, except after the epoch's last row.
  int64_t chained = 0, not_greedy = 0;
  for (const auto& [first, info] : by_first) {
    const int64_t next = (info.first + 1) % n;
    chained += by_first.count(next);
    if (next != 37 && info.first != 37) {
      not_greedy += info.second + sentence_length(next) <= o.mono.max_len - 2;
    }
  }
  EXPECT_EQ(chained, static_cast<int64_t>(by_first.size()));
  EXPECT_LE(not_greedy, 1);
}

// VECO's monolingual pairs: two adjacent sentences of one document per row, each sentence in at
// most one pair, pairs where the stated rule puts them; split_pair then gives whole sentences.
TEST(Batches, VecoSentencePairsAreAdjacentSentencesOfOneDocument) {
  TempDir dir;
  const int64_t n = 300;  // documents of 5 sentences (write_mono); sentence 37 is 40 long
  write_mono(dir.path().string(), "de", n, /*long_sentence=*/37, /*long_length=*/40);
  for (const bool truncate : {false, true}) {
    BatchOptions o = base_options(dir.path().string());
    o.para.enabled = false;
    o.mono.sentence_pairs = true;
    o.mono.max_len = 32;  // every pair fits but those with sentence 37
    o.truncate_too_long = truncate;
    o.ids = SpecialIds::for_vocab(kVocab);
    TaskReader reader(o, Task::kMono);
    std::set<int64_t> firsts;
    while (reader.state().cursors[0].pool == 0) {
      const Batch b = reader.next();
      expect_budget_and_shapes(b, o.micro_batch_tokens);
      const auto sides = split_pair(b, o.ids);
      for (int64_t r = 0; r < b.labels.size(0); ++r) {
        const auto row = row_of(b, r);
        ASSERT_GE(row.size(), 5u);
        const int64_t a = row[1] - 4;
        EXPECT_TRUE(firsts.insert(a).second) << "sentence " << a << " paired twice";
        EXPECT_NE(a % 5, 4) << "sentence " << a << " paired across a document end";
        // <s> a </s> b </s>, b = a + 1, each whole unless 37 made the pair too long.
        const int64_t a_len = a == 37 ? 40 : sentence_length(a);
        const int64_t b_len = a + 1 == 37 ? 40 : sentence_length(a + 1);
        std::vector<int64_t> want{0};
        const auto kept = fit_pair(a_len, b_len, o.mono.max_len, true);
        want.insert(want.end(), static_cast<size_t>(kept->e), 4 + a);
        want.push_back(2);
        want.insert(want.end(), static_cast<size_t>(kept->f), 4 + a + 1);
        want.push_back(2);
        EXPECT_EQ(row, want) << "pair at " << a;
        EXPECT_TRUE(truncate || (a_len == kept->e && b_len == kept->f)) << "kept a cut pair";
        // The sides VECO trains on: the two sentences, each framed <s> ... </s>.
        const auto x = sides.x.labels[r].masked_select(sides.x.padding[r].logical_not());
        const auto y = sides.y.labels[r].masked_select(sides.y.padding[r].logical_not());
        EXPECT_EQ(x.numel(), kept->e + 2);
        EXPECT_EQ(y.numel(), kept->f + 2);
        EXPECT_EQ(x.slice(0, 1, -1).ne(4 + a).sum().item<int64_t>(), 0);
        EXPECT_EQ(y.slice(0, 1, -1).ne(4 + a + 1).sum().item<int64_t>(), 0);
      }
    }
    // The stated rule from where the stream starts: find the rotation that gives these pairs.
    bool matched = false;
    for (int64_t rotation = 0; rotation < n && !matched; ++rotation) {
      std::vector<bool> starts;
      for (int64_t p = 0; p < n; ++p) starts.push_back((rotation + p) % n % 5 == 0);
      std::set<int64_t> want;
      for (const int64_t first : pair_adjacent_sentences(starts)) {
        const int64_t a = (rotation + first) % n;
        if (truncate || (a != 37 && a + 1 != 37)) want.insert(a);  // 37 is cut or dropped
      }
      matched = want == firsts;
    }
    EXPECT_TRUE(matched) << "pairs differ from the rule for every rotation";
    // Two pairs per document of five, less the rotation's cut document and 37's pair.
    EXPECT_GE(firsts.size(), static_cast<size_t>(n / 5 * 2 - 3));
  }
  // max_len must hold the pair frame <s> a </s> b </s>.
  BatchOptions o = base_options(dir.path().string());
  o.mono.sentence_pairs = true;
  o.mono.max_len = 4;
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kMono); }),
                           {"data.mono.max_len (4)", "a pair of adjacent sentences",
                            "at least 5 tokens (<s> a </s> b </s>)"}));
}

TEST(Batches, TrtdFramesPositionsDropAndTruncate) {
  TempDir dir;
  const int64_t pairs = 200;
  write_para(dir.path().string(), "en-de", pairs);
  for (const bool truncate : {false, true}) {
    for (const bool reset : {false, true}) {
      BatchOptions o = base_options(dir.path().string());
      o.mono.enabled = false;
      o.para.max_len = 14;  // pairs with e + f > 11 are too long
      o.truncate_too_long = truncate;
      o.reset_positions = reset;
      o.mask_ratio = 0;
      TaskReader reader(o, Task::kPara);
      std::set<int64_t> seen;
      while (reader.state().cursors[0].pool == 0) {
        const Batch b = reader.next();
        expect_budget_and_shapes(b, o.micro_batch_tokens);
        EXPECT_FALSE(b.masked.any().item<bool>());
        for (int64_t r = 0; r < b.labels.size(0); ++r) {
          const auto row = row_of(b, r);
          const int64_t p = row.at(1) - 4;
          ASSERT_TRUE(seen.insert(p).second) << "pair " << p << " twice";
          int64_t e = e_len(p), f = f_len(p);
          const bool too_long = e + f > 11;
          EXPECT_TRUE(truncate || !too_long);
          if (too_long) {
            EXPECT_EQ(static_cast<int64_t>(row.size()), o.para.max_len);
            e = std::min(e, std::max<int64_t>(6, 11 - f));
            f = 11 - e;
          }
          std::vector<int64_t> expected = {0};
          expected.insert(expected.end(), e, 4 + p);
          expected.push_back(2);
          expected.insert(expected.end(), f, 1000 + p);
          expected.push_back(2);
          EXPECT_EQ(row, expected) << "pair " << p;
          for (int64_t i = 0; i < static_cast<int64_t>(row.size()); ++i) {
            const int64_t position = b.positions[r][i].item<int64_t>();
            EXPECT_EQ(position, reset && i >= e + 2 ? i - (e + 2) + 1 : i) << p << " " << i;
          }
        }
      }
      int64_t fitting = 0;
      for (int64_t p = 0; p < pairs; ++p) fitting += e_len(p) + f_len(p) <= 11;
      EXPECT_EQ(static_cast<int64_t>(seen.size()), truncate ? pairs : fitting);
      EXPECT_LT(fitting, pairs);
    }
  }
}

TEST(Batches, MaskingRatioSplitAndPositions) {
  TempDir dir;
  write_synthetic_shards(dir.path().string(), 300, 150000, 80000, 3);
  // <unk> (3) inside sentences: real text has it, and it must never be masked.
  std::vector<std::vector<int32_t>> with_unk;
  for (int i = 0; i < 500; ++i) with_unk.push_back({5, 3, 7, 3, 9, 11, 3, 13, 17, 19});
  write_shard(dir / "mono/xx", ShardKind::kMono, "xx", with_unk, {}, 300, 0);
  BatchOptions o = base_options(dir.path().string());
  o.mono.max_len = 128;
  o.para.max_len = 128;
  o.micro_batch_tokens = 2048;
  o.bucket_pool = 512;
  o.mask_ratio = 0.2;
  o.mask_token_ratio = 0.85;
  const SpecialIds ids = SpecialIds::for_vocab(300);
  for (const Task task : {Task::kMono, Task::kPara}) {
    TaskReader reader(o, task);
    int64_t candidates = 0, selected = 0, replaced = 0, early = 0, late = 0, early_n = 0,
            late_n = 0;
    for (int i = 0; i < 150; ++i) {
      const Batch b = reader.next();
      const auto labels = b.labels.accessor<int64_t, 2>();
      const auto input = b.input_ids.accessor<int64_t, 2>();
      const auto masked = b.masked.accessor<bool, 2>();
      const auto padding = b.padding.accessor<bool, 2>();
      for (int64_t r = 0; r < b.labels.size(0); ++r) {
        int64_t length = 0;
        while (length < b.labels.size(1) && !padding[r][length]) ++length;
        for (int64_t t = 0; t < b.labels.size(1); ++t) {
          const bool special = ids.is_special(labels[r][t]);
          EXPECT_EQ(padding[r][t], labels[r][t] == ids.pad);
          if (special || padding[r][t]) {
            ASSERT_FALSE(masked[r][t]) << "special or padding masked";
            ASSERT_EQ(input[r][t], labels[r][t]);
            continue;
          }
          ++candidates;
          (2 * t < length ? early_n : late_n) += 1;
          if (!masked[r][t]) {
            ASSERT_EQ(input[r][t], labels[r][t]);
            continue;
          }
          ++selected;
          (2 * t < length ? early : late) += 1;
          if (input[r][t] == ids.mask) {
            ++replaced;
          } else {
            ASSERT_EQ(input[r][t], labels[r][t]);
          }
        }
      }
    }
    const double rate = static_cast<double>(selected) / candidates;
    EXPECT_NEAR(rate, 0.2, 5 * std::sqrt(0.2 * 0.8 / candidates)) << candidates;
    EXPECT_NEAR(static_cast<double>(replaced) / selected, 0.85,
                5 * std::sqrt(0.85 * 0.15 / selected));
    // Uniform over positions: the first and second halves of rows are masked alike.
    EXPECT_NEAR(static_cast<double>(early) / early_n, static_cast<double>(late) / late_n, 0.01);
  }
}

TEST(Batches, TokenBudgetPaddingAndRealizedLanguageShares) {
  TempDir dir;
  write_synthetic_shards(dir.path().string(), 32000, 400000, 300000, 11);
  BatchOptions o = base_options(dir.path().string());
  o.mono.max_len = 128;
  o.para.max_len = 128;
  o.micro_batch_tokens = 2048;
  o.bucket_pool = 4096;
  const auto reports = bench_batches(o, 0.3);
  ASSERT_EQ(reports.size(), 2u);
  for (const auto& r : reports) {
    EXPECT_LT(r.padding_fraction(), 0.10) << "task " << static_cast<int>(r.task);
    int64_t tokens = 0;
    for (const auto& c : r.languages) tokens += c.tokens;
    EXPECT_EQ(tokens, r.real_tokens);
    // Micro-batches are nearly full, so token shares follow p_j (tolerance: a few sigma of
    // the micro-batch counts).
    for (const auto& c : r.languages) {
      const double sigma = std::sqrt(c.probability * (1 - c.probability) / r.micro_batches);
      EXPECT_NEAR(static_cast<double>(c.tokens) / r.real_tokens, c.probability, 5 * sigma + 0.02)
          << c.name;
    }
  }
  for (int i = 0; i < 2; ++i) {
    TaskReader reader(o, i == 0 ? Task::kMono : Task::kPara);
    for (int k = 0; k < 200; ++k) expect_budget_and_shapes(reader.next(), o.micro_batch_tokens);
  }
}

class Sources : public ::testing::Test {
 protected:
  void SetUp() override {
    write_mono(dir_.path().string(), "de", 400);
    write_mono(dir_.path().string(), "fr", 90);
    write_mono(dir_.path().string(), "ru", 30);
    write_para(dir_.path().string(), "en-de", 300);
    write_para(dir_.path().string(), "en-fr", 60);
  }
  BatchOptions options() const {
    BatchOptions o = base_options(dir_.path().string());
    o.bucket_pool = 64;  // several pools per epoch, a few micro-batches per pool
    o.para.max_len = 24;
    return o;
  }
  TempDir dir_;
};

TEST_F(Sources, DeterministicBySeedAndThreadCountAndEqualToTheSyncReader) {
  auto read = [&](BatchOptions o, int n) {
    ShardBatchSource source(o);
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(fingerprint(source.next(Task::kMono)));
      if (i % 3 != 2) out.push_back(fingerprint(source.next(Task::kPara)));
    }
    return out;
  };
  BatchOptions one = options();
  one.loader_threads = 1;
  one.prefetch = 1;
  BatchOptions three = options();
  three.loader_threads = 3;
  three.prefetch = 5;
  const auto a = read(one, 40), b = read(three, 40);
  EXPECT_EQ(a, b);
  TaskReader mono(options(), Task::kMono), para(options(), Task::kPara);
  std::vector<std::string> sync;
  for (int i = 0; i < 40; ++i) {
    sync.push_back(fingerprint(mono.next()));
    if (i % 3 != 2) sync.push_back(fingerprint(para.next()));
  }
  EXPECT_EQ(a, sync);
  BatchOptions other = options();
  other.seed = 2;
  EXPECT_NE(read(other, 40), a);
}

TEST_F(Sources, StateRestoreEqualsContinuousReading) {
  for (const int64_t ranks : {1, 2}) {
    BatchOptions o = options();
    o.ranks = ranks;
    o.rank = ranks - 1;
    ShardBatchSource continuous(o);
    std::vector<std::string> expected;
    for (int i = 0; i < 30; ++i) {
      expected.push_back(fingerprint(continuous.next(Task::kMono)));
      expected.push_back(fingerprint(continuous.next(Task::kPara)));
    }
    ShardBatchSource first(o);
    std::vector<std::string> got;
    for (int i = 0; i < 12; ++i) {
      got.push_back(fingerprint(first.next(Task::kMono)));
      got.push_back(fingerprint(first.next(Task::kPara)));
    }
    const std::string saved = first.state();
    EXPECT_LT(saved.size(), 600u) << saved;
    ShardBatchSource second(o);
    second.next(Task::kMono);  // whatever it read before is forgotten
    std::vector<std::string> states(static_cast<size_t>(ranks), saved);
    second.restore(states);
    for (int i = 12; i < 30; ++i) {
      got.push_back(fingerprint(second.next(Task::kMono)));
      got.push_back(fingerprint(second.next(Task::kPara)));
    }
    EXPECT_EQ(got, expected) << ranks << " ranks";
  }
}

TEST_F(Sources, ResplitFromTwoToThreeRanksCoversTheSameDataOnce) {
  // Each rank's reads are keyed by its place in its language's global micro-batch sequence, so
  // the reference for language j is a one-language, one-rank reader of j.
  std::map<std::string, int64_t> read_per_language[2];
  std::multiset<std::string> got[2];
  auto run = [&](int64_t ranks, int rounds, const std::vector<std::string>& saved) {
    std::vector<std::unique_ptr<ShardBatchSource>> sources;
    for (int64_t r = 0; r < ranks; ++r) {
      BatchOptions o = options();
      o.ranks = ranks;
      o.rank = r;
      sources.push_back(std::make_unique<ShardBatchSource>(o));
      if (!saved.empty()) sources.back()->restore(saved);
    }
    for (int i = 0; i < rounds; ++i) {
      for (auto& s : sources) {
        for (const Task task : {Task::kMono, Task::kPara}) {
          got[static_cast<int>(task)].insert(fingerprint(s->next(task)));
        }
      }
    }
    std::vector<std::string> states;
    for (auto& s : sources) {
      states.push_back(s->state());
      for (const Task task : {Task::kMono, Task::kPara}) {
        for (const auto& c : s->language_counts(task)) {
          read_per_language[static_cast<int>(task)][c.name] += c.micro_batches;
        }
      }
    }
    return states;
  };
  const auto saved = run(2, 15, {});
  run(3, 11, saved);
  for (const Task task : {Task::kMono, Task::kPara}) {
    const int t = static_cast<int>(task);
    std::multiset<std::string> expected;
    int64_t total = 0;
    for (const auto& [name, count] : read_per_language[t]) {
      BatchOptions o = options();
      (task == Task::kMono ? o.mono : o.para).languages = {name};
      TaskReader reader(o, task);
      for (int64_t i = 0; i < count; ++i) expected.insert(fingerprint(reader.next()));
      total += count;
    }
    EXPECT_EQ(total, 2 * 15 + 3 * 11);
    EXPECT_EQ(got[t].size(), expected.size());
    EXPECT_TRUE(got[t] == expected) << "task " << t << ": repeated or skipped micro-batches";
  }
}

TEST_F(Sources, RestoreRejectsForeignStates) {
  BatchOptions o = options();
  o.ranks = 2;
  ShardBatchSource source(o);
  source.next(Task::kMono);
  const std::string saved = source.state();
  EXPECT_TRUE(contains_all(error_message([&] { source.restore({saved}); }),
                           {"was written by one of 2 ranks, but 1 states were given"}));
  BatchOptions bigger = o;
  bigger.micro_batch_tokens = 128;
  ShardBatchSource other(bigger);
  EXPECT_TRUE(
      contains_all(error_message([&] {
                     other.restore({saved, saved});
                   }),
                   {"the saved mono data state was made with max_len=16,micro_batch_tokens=64",
                    "this run has max_len=16,micro_batch_tokens=128"}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             other.restore({"garbage", "x"});
                           }),
                           {"saved data state #0 is not an xlme-batches v1 state"}));
}

TEST_F(Sources, RestoreRefusesAChangedShardSetUnlessAllowed) {
  ShardBatchSource first(options());
  for (int i = 0; i < 5; ++i) first.next(Task::kMono);
  const std::string saved = first.state();
  EXPECT_TRUE(contains_all(saved, {"shard mono fr ", "shard para en-de "}));
  // fr deleted, ru binarized again with more text, el new: the languages would vanish, change
  // and appear silently.
  std::filesystem::remove(dir_ / "mono/fr.idx");
  std::filesystem::remove(dir_ / "mono/fr.bin");
  write_mono(dir_.path().string(), "ru", 31);
  write_mono(dir_.path().string(), "el", 20);
  ShardBatchSource changed(options());
  EXPECT_TRUE(
      contains_all(error_message([&] { changed.restore({saved}); }),
                   {"the mono shards differ from those the checkpoint was trained on",
                    "'fr' removed", "'ru' changed", "'el' added", "pass --allow-data-change"}));
  BatchOptions allowed = options();
  allowed.allow_data_change = true;
  ShardBatchSource continued(allowed);
  EXPECT_NO_THROW(continued.restore({saved}));
  EXPECT_NO_THROW(continued.next(Task::kMono));
}

TEST_F(Sources, LanguageReportShowsTargetAndRealizedShares) {
  ShardBatchSource source(options());
  for (int i = 0; i < 40; ++i) source.next(Task::kMono);
  const auto counts = source.language_counts(Task::kMono);
  int64_t read = 0;
  for (const auto& c : counts) read += c.tokens;
  const std::string report = source.language_report();
  for (const auto& c : counts) {
    EXPECT_TRUE(contains_all(
        report, {fmt::format("mono {:<8} {:>12} tokens  target {:5.1f}%  realized {:5.1f}%", c.name,
                             c.shard_tokens, 100 * c.probability,
                             100.0 * static_cast<double>(c.tokens) / read)}));
  }
  EXPECT_TRUE(contains_all(report, {"para en-de", "realized   0.0%"}));
}

TEST(Batches, ParallelOnlyShardsNameTheObjectivesThatNeedMonolingualText) {
  TempDir dir;
  write_para(dir.path().string(), "en-de", 20);
  BatchOptions o = base_options(dir.path().string());
  EXPECT_NO_THROW(TaskReader(o, Task::kPara));
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kMono); }),
                           {"has no mono/*.idx shards for MLM and MRTD, which every "
                            "objectives.set trains on monolingual text"}));
}

TEST_F(Sources, LoaderErrorsReachTheConsumerWithTheirMessage) {
  std::vector<std::vector<int32_t>> long_pairs(20, std::vector<int32_t>(3, 7));
  write_shard(dir_ / "para/en-xx", ShardKind::kPara, "en-xx", long_pairs, {}, kVocab, 0);
  BatchOptions o = options();
  o.para.max_len = 5;  // every pair of en-xx has e + f = 6 > 2
  o.para.languages = {"en-xx"};
  ShardBatchSource source(o);
  EXPECT_NO_THROW(source.next(Task::kMono));
  EXPECT_TRUE(contains_all(error_message([&] { source.next(Task::kPara); }),
                           {"every pair of 'en-xx' is longer than data.para.max_len (5)",
                            "set data.too_long=truncate"}));
  BatchOptions mono_only = options();
  mono_only.para.enabled = false;
  ShardBatchSource mono(mono_only);
  EXPECT_TRUE(contains_all(error_message([&] { mono.next(Task::kPara); }),
                           {"no para batches: this batch source was built without the TRTD task"}));
}

TEST_F(Sources, BadInputMessages) {
  BatchOptions o = options();
  o.shards = dir_ / "none";
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kMono); }),
                           {"shard folder '" + (dir_ / "none") + "' (data.shards) not found",
                            "run xlme-data binarize"}));
  std::filesystem::create_directories(dir_ / "empty");
  o.shards = dir_ / "empty";
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kPara); }),
                           {"'" + (dir_ / "empty") + "' (data.shards) has no para/*.idx shards"}));
  o = options();
  o.mono.languages = {"de", "el"};
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kMono); }),
                           {"data.mono.languages names 'el', but '" + (dir_ / "mono") +
                            "' has no el.idx shard; available: de, fr, ru"}));
  o = options();
  o.tokenizer_path = "other.model";
  o.tokenizer_hash = 42;
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kMono); }),
                           {"was binarized with another tokenizer", "than 'other.model'"}));
  o = options();
  o.para.max_len = 4;
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kPara); }),
                           {"data.para.max_len (4) is smaller than the special-token frame: TRTD "
                            "needs at least 5 tokens (<s> e </s> f </s>)"}));
  o = options();
  o.mono.max_len = 2;
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kMono); }),
                           {"data.mono.max_len (2) is smaller than the special-token frame"}));
  o = options();
  o.para.sampling_exponent = 1.2;
  EXPECT_TRUE(contains_all(error_message([&] { TaskReader(o, Task::kPara); }),
                           {"data.para.sampling_exponent must be in (0, 1], got 1.2"}));
  EXPECT_TRUE(contains_all(
      error_message([] { config::load_config("", {"data.mono.sampling_exponent=0"}); }),
      {"data.mono.sampling_exponent: 0 is out of range: expected a number in (0.0, 1.0]"}));
  EXPECT_TRUE(contains_all(
      error_message([] { config::load_config("", {"data.para.sampling_exponent=1.5"}); }),
      {"data.para.sampling_exponent: 1.5 is out of range"}));
}

// The whole path on real text: SentencePiece, binarize, then batches whose rows decode back to
// the sentences; the in-memory writer makes the same files as binarize.
TEST(Batches, FromBinarizedShardsWithTheConfiguredTokenizer) {
  TempDir dir;
  std::string text;
  const char* const words[] = {"the", "house", "green", "Haus", "grün", "small", "Licht", "über"};
  unsigned state = 3;
  std::vector<std::string> lines;
  for (int i = 0; i < 120; ++i) {
    std::string line;
    for (int w = 0; w < 2 + i % 5; ++w) {
      state = state * 1103515245u + 12345u;
      line += (w ? " " : "") + std::string(words[(state >> 16) % 8]);
    }
    lines.push_back(line);
    text += line + "\n";
  }
  write_file(dir / "train.txt", text);
  const std::string command = "spm_train --input=" + (dir / "train.txt") +
                              " --model_prefix=" + (dir / "m") +
                              " --vocab_size=30 --bos_id=0 --pad_id=1 --eos_id=2 --unk_id=3 "
                              ">" +
                              (dir / "train.log") + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir / "train.log");
  const Tokenizer tokenizer(dir / "m.model", VocabLayout::kOwn);
  write_file(dir / "raw/mono/de.txt", text);
  BinarizeOptions b;
  b.input_dir = dir / "raw";
  b.out_dir = dir / "shards";
  binarize(b, tokenizer);

  std::vector<std::vector<int32_t>> encoded;
  for (const auto& line : lines) encoded.push_back(tokenizer.encode(line));
  write_shard(dir / "copy/mono/de", ShardKind::kMono, "de", encoded, {0}, tokenizer.vocab_size(),
              tokenizer.hash());
  EXPECT_EQ(read_file(dir / "copy/mono/de.bin"), read_file(dir / "shards/mono/de.bin"));
  EXPECT_EQ(read_file(dir / "copy/mono/de.idx").substr(sizeof(ShardHeader)),
            read_file(dir / "shards/mono/de.idx").substr(sizeof(ShardHeader)));

  config::Config cfg = config::load_config(
      "", {"data.shards=" + (dir / "shards"), "data.tokenizer=" + (dir / "m.model"),
           "data.mono.max_len=32", "data.para.max_len=32", "train.micro_batch_tokens=256",
           "objectives.set=xlme-mono"});
  BatchOptions o = BatchOptions::from_config(cfg, &tokenizer, 0, 1);
  EXPECT_FALSE(o.para.enabled);
  EXPECT_EQ(o.ids.mask, tokenizer.vocab_size() - 1);
  ShardBatchSource source(o);
  const Batch batch = source.next(Task::kMono);
  std::vector<int32_t> row;
  for (const int64_t id : row_of(batch, 0)) row.push_back(static_cast<int32_t>(id));
  std::string twice;  // the stream wraps around: the rotation may start anywhere
  for (int round = 0; round < 2; ++round) {
    for (const auto& line : lines) twice += line + " ";
  }
  const std::string decoded = tokenizer.decode(row);
  EXPECT_GT(decoded.size(), 4u);
  EXPECT_NE(twice.find(decoded), std::string::npos) << decoded;

  o.tokenizer_hash = tokenizer.hash() + 1;
  EXPECT_TRUE(contains_all(
      error_message([&] { ShardBatchSource{o}; }),
      {"shard '" + (dir / "shards/mono/de") + ".idx' was binarized with another tokenizer",
       "than '" + (dir / "m.model") + "'"}));
}

}  // namespace
}  // namespace xlme::data
