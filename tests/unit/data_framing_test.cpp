// The one data path (framing.h, bucketing.h, masking.h, batch_writer.h) against naive references,
// and its three users agreeing: training's TaskReader, the held-out batches and SyntheticBatches.
#include "xlme/data/batch_writer.h"
#include "xlme/data/batches.h"
#include "xlme/data/bucketing.h"
#include "xlme/data/framing.h"
#include "xlme/data/heldout.h"
#include "xlme/data/masking.h"
#include "xlme/data/pair_sides.h"
#include "xlme/data/shard.h"
#include "xlme/data/synthetic.h"

#include "test_util.h"

#include <algorithm>
#include <set>

namespace xlme::data {
namespace {

using xlme::testing::TempDir;

// A pair's kept lengths by the rule spelled out: the longer side gives up tokens one at a time
// until the pair fits, but never below half the room (rounded up) while the other side can give.
PairLengths naive_fit(int64_t e, int64_t f, int64_t room) {
  const int64_t half = (room + 1) / 2;
  while (e + f > room) {
    if (e > half && (e >= f || f <= room - half)) {
      --e;
    } else {
      --f;
    }
  }
  return {e, f};
}

TEST(DataFraming, FitPairKeepsTrainingsSplitAndDropsUnlessTruncating) {
  const auto kept = fit_pair(10, 10, 18, true);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->e, 8);  // room 15: e keeps half (rounded up), f the rest
  EXPECT_EQ(kept->f, 7);
  EXPECT_FALSE(fit_pair(10, 10, 18, false).has_value());
  const auto whole = fit_pair(7, 8, 18, false);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->e, 7);
  EXPECT_EQ(whole->f, 8);
  for (int64_t max_len = 5; max_len <= 20; ++max_len) {
    for (int64_t e = 0; e <= 25; ++e) {
      for (int64_t f = 0; f <= 25; ++f) {
        const auto got = fit_pair(e, f, max_len, true);
        ASSERT_TRUE(got.has_value());
        const PairLengths want =
            e + f <= max_len - 3 ? PairLengths{e, f} : naive_fit(e, f, max_len - 3);
        EXPECT_EQ(got->e, want.e) << e << "+" << f << " in " << max_len;
        EXPECT_EQ(got->f, want.f) << e << "+" << f << " in " << max_len;
      }
    }
  }
}

TEST(DataFraming, FramesSentencesAndPairs) {
  const auto ids = SpecialIds::for_vocab(100);
  std::vector<int32_t> out;
  frame_sentence({5, 6, 7, 8}, 5, ids, out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 5, 6, 7, 2}));
  frame_sentence({5, 6}, 5, ids, out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 5, 6, 2}));
  const size_t second = frame_pair({5, 6, 7}, {8, 9}, PairLengths{2, 1}, ids, out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 5, 6, 2, 8, 2}));
  EXPECT_EQ(second, 4u);
}

TEST(DataFraming, AdjacentSentencePairsStayInOneDocument) {
  // Documents {0 1 2 3 4} {5} {6 7 8} {9 10}: pairs (0 1) (2 3) (6 7) (9 10); 4, 5 and 8 have
  // no partner in their document.
  std::vector<bool> starts(11, false);
  for (const size_t d : {0, 5, 6, 9}) starts[d] = true;
  EXPECT_EQ(pair_adjacent_sentences(starts), (std::vector<int64_t>{0, 2, 6, 9}));
  EXPECT_TRUE(pair_adjacent_sentences({true}).empty());
  EXPECT_TRUE(pair_adjacent_sentences({}).empty());
  // A stream that starts inside a document (the rotation) pairs from where it starts.
  EXPECT_EQ(pair_adjacent_sentences({false, false, false, true, false}),
            (std::vector<int64_t>{0, 3}));
}

TEST(DataFraming, PackSentencesEqualsTheStatedRule) {
  // Naive: a sentence joins the open group while the group stays within the room; a sentence
  // over the room closes the open group and makes its own.
  uint64_t state = 7;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> lengths;
    const int64_t max_len = 4 + trial % 20;
    for (int i = 0; i < trial % 37; ++i) {
      state = mix64(state);
      lengths.push_back(static_cast<int64_t>(state % 30));
    }
    const int64_t room = max_len - 2;
    std::vector<std::pair<int64_t, int64_t>> want;
    std::vector<int64_t> open;
    int64_t open_tokens = 0;
    auto close = [&] {
      if (!open.empty()) want.emplace_back(open.front(), open.back() + 1);
      open.clear();
      open_tokens = 0;
    };
    for (int64_t i = 0; i < static_cast<int64_t>(lengths.size()); ++i) {
      if (lengths[i] > room) {
        close();
        want.emplace_back(i, i + 1);
        continue;
      }
      if (!open.empty() && open_tokens + lengths[i] > room) close();
      open.push_back(i);
      open_tokens += lengths[i];
    }
    close();
    EXPECT_EQ(pack_sentences(lengths, max_len), want) << "trial " << trial;
  }
}

TEST(DataBucketing, SortsStablyAndCutsGreedilyWithinTheBudget) {
  const std::vector<int64_t> lengths = {5, 3, 9, 3, 12, 5, 40, 1};
  const Buckets b = bucket_by_length(lengths, 20);
  EXPECT_EQ(b.order, (std::vector<int64_t>{7, 1, 3, 0, 5, 2, 4, 6}));
  // lengths in order 1 3 3 5 | 5 9 | 12 | 40: 4 x 5 = 20 fits, 5 x 5 does not; 40 alone.
  EXPECT_EQ(b.batches, (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 6}, {6, 7}, {7, 8}}));
  EXPECT_TRUE(bucket_by_length({}, 20).batches.empty());
}

TEST(DataMasking, SelectsRandomlyRoundedRatioOfPiecesOnly) {
  const auto ids = SpecialIds::for_vocab(100);
  const std::vector<int64_t> row = {0, 10, 11, 2, 12, 13, 14, 15, 16, 17, 18, 2, 1, 1};
  const int64_t pieces = 9;
  int64_t selected = 0, shown = 0;
  const int trials = 4000;
  for (int t = 0; t < trials; ++t) {
    std::vector<int64_t> input = row;
    bool masked[14] = {};
    Rng rng(hash_key({3, static_cast<uint64_t>(t)}));
    mask_row(input.data(), masked, 12, ids, MaskOptions{0.3, 0.8}, rng);
    int64_t k = 0;
    for (int64_t i = 0; i < 14; ++i) {
      if (masked[i]) {
        ++k;
        EXPECT_FALSE(ids.is_special(row[i])) << i;
        EXPECT_TRUE(input[i] == ids.mask || input[i] == row[i]);
        shown += input[i] == ids.mask;
      } else {
        EXPECT_EQ(input[i], row[i]);
      }
    }
    EXPECT_TRUE(k == 2 || k == 3) << k;  // 0.3 x 9 = 2.7, randomly rounded
    selected += k;
  }
  EXPECT_NEAR(static_cast<double>(selected) / trials, 0.3 * pieces, 0.05);
  EXPECT_NEAR(static_cast<double>(shown) / static_cast<double>(selected), 0.8, 0.03);
}

TEST(DataBatchWriter, WritesRowsPaddingPositionsAndMasksLikeMaskRow) {
  const auto ids = SpecialIds::for_vocab(100);
  BatchWriter writer(Task::kPara, 2, 6, ids, false);
  Rng rng(11), same(11);
  const MaskOptions mask{0.5, 1.0};
  writer.write(0, {0, 5, 2, 6, 7, 2}, 3, /*reset_positions=*/true, mask, rng);
  writer.write(1, {0, 8, 2, 9, 2}, 3, /*reset_positions=*/false, mask, rng);
  const Batch& b = writer.batch();
  EXPECT_EQ(b.real_tokens, 11);
  EXPECT_TRUE(torch::equal(
      b.labels, torch::tensor({0, 5, 2, 6, 7, 2, 0, 8, 2, 9, 2, 1}, torch::kLong).view({2, 6})));
  EXPECT_TRUE(torch::equal(
      b.positions, torch::tensor({0, 1, 2, 1, 2, 3, 0, 1, 2, 3, 4, 5}, torch::kLong).view({2, 6})));
  EXPECT_TRUE(torch::equal(b.padding, b.labels == 1));
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<int64_t> input(b.labels[r].data_ptr<int64_t>(),
                               b.labels[r].data_ptr<int64_t>() + 6);
    bool masked[6] = {};
    mask_row(input.data(), masked, r == 0 ? 6 : 5, ids, mask, same);
    EXPECT_TRUE(torch::equal(b.input_ids[r], torch::tensor(input)));
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b.masked[r][i].item<bool>(), masked[i]);
  }
}

// The held-out batches and training's reader frame, truncate and drop the same pairs alike.
TEST(DataHeldout, RowsEqualTrainingsRowsForTheSamePairs) {
  TempDir dir;
  std::vector<std::vector<int32_t>> segments;
  HeldoutPair pair{"en-de", "en", "de", {}, {}};
  for (int32_t p = 0; p < 60; ++p) {
    std::vector<int32_t> e(static_cast<size_t>(1 + (p * 5) % 13), 4 + p);
    std::vector<int32_t> f(static_cast<size_t>(1 + (p * 3) % 11), 100 + p);
    segments.push_back(e);
    segments.push_back(f);
    pair.a.push_back(e);
    pair.b.push_back(f);
  }
  write_shard(dir.path().string() + "/para/en-de", ShardKind::kPara, "en-de", segments, {}, 200, 0);
  for (const bool truncate : {false, true}) {
    BatchOptions o;
    o.shards = dir.path().string();
    o.mono.enabled = false;
    o.para.max_len = 16;  // an odd room (13): the two sides cannot split it evenly
    o.truncate_too_long = truncate;
    o.reset_positions = true;
    o.bucket_pool = 60;
    o.micro_batch_tokens = 60;
    o.ids = SpecialIds::for_vocab(200);
    auto rows = [](const std::vector<Batch>& batches) {
      std::multiset<std::vector<int64_t>> out;
      for (const auto& b : batches) {
        for (int64_t r = 0; r < b.labels.size(0); ++r) {
          const auto real = b.padding[r].logical_not();
          auto labels = b.labels[r].masked_select(real).contiguous();
          auto positions = b.positions[r].masked_select(real).contiguous();
          std::vector<int64_t> row(labels.data_ptr<int64_t>(),
                                   labels.data_ptr<int64_t>() + labels.numel());
          row.insert(row.end(), positions.data_ptr<int64_t>(),
                     positions.data_ptr<int64_t>() + positions.numel());
          out.insert(row);
        }
      }
      return out;
    };
    TaskReader reader(o, Task::kPara);
    std::vector<Batch> training;
    while (reader.state().cursors[0].pool == 0) training.push_back(reader.next());
    const auto heldout = heldout_batches({pair}, o, 5);
    EXPECT_EQ(rows(heldout), rows(training)) << "too_long=" << (truncate ? "truncate" : "drop");
    size_t fitting = 0;
    for (size_t p = 0; p < pair.a.size(); ++p) fitting += pair.a[p].size() + pair.b[p].size() <= 13;
    EXPECT_EQ(rows(heldout).size(), truncate ? 60u : fitting);
    EXPECT_LT(fitting, 60u);
  }
}

TEST(DataHeldout, VecoPairsConsecutiveSentencesOfALanguage) {
  // en: 5 5 | 6 6 6 | 7 | 8 8 (4 distinct) and de: 10 | 11 11 | 12 (3, the last alone).
  HeldoutPair pair{
      "en-de", "en", "de", {{5, 5}, {6, 6, 6}, {7}, {8, 8}}, {{10}, {11, 11}, {12}, {}}};
  BatchOptions o;
  o.para.enabled = false;
  o.mono.max_len = 8;
  o.mono.sentence_pairs = true;
  o.micro_batch_tokens = 64;
  o.ids = SpecialIds::for_vocab(50);
  std::multiset<std::vector<int64_t>> rows;
  for (const auto& b : heldout_batches({pair}, o, 5)) {
    for (int64_t r = 0; r < b.labels.size(0); ++r) {
      auto labels = b.labels[r].masked_select(b.padding[r].logical_not()).contiguous();
      rows.emplace(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel());
    }
  }
  // en's first pair 5 5 + 6 6 6 fits 8 - 3 = 5; 7 + 8 8 too. de pairs 10 with 11 11.
  EXPECT_EQ(rows, (std::multiset<std::vector<int64_t>>{
                      {0, 5, 5, 2, 6, 6, 6, 2}, {0, 7, 2, 8, 8, 2}, {0, 10, 2, 11, 11, 2}}));
  o.mono.max_len = 7;  // 5 5 + 6 6 6 no longer fits: dropped (data.too_long=drop)
  EXPECT_EQ(heldout_batches({pair}, o, 5).front().labels.size(0), 2);
}

TEST(DataSynthetic, SentencePairsAreFramedLikeTranslationPairs) {
  const auto ids = SpecialIds::for_vocab(50);
  SyntheticBatches pairs(ids, 3, 10, 0.3, 9);
  pairs.set_sentence_pairs(true);
  const Batch mono = pairs.next(Task::kMono);
  EXPECT_EQ(mono.task, Task::kMono);
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(mono.labels[r][5].item<int64_t>(), ids.eos);  // <s> a </s> b </s>
    EXPECT_EQ(mono.labels[r][9].item<int64_t>(), ids.eos);
  }
  const auto sides = split_pair(mono, ids);
  EXPECT_EQ(sides.x.labels.size(1), 6);  // <s> a </s>: the 4 pieces before </s> at 5
  EXPECT_EQ(sides.y.labels.size(1), 5);  // <s> b </s>: the other 3
}

TEST(DataSynthetic, FramedMaskedAndSplitOverRanksAndBatches) {
  const auto ids = SpecialIds::for_vocab(50);
  SyntheticBatches one(ids, 4, 10, 0.3, 9);
  SyntheticBatches rank0(ids, 2, 10, 0.3, 9, 0, 2), rank1(ids, 2, 10, 0.3, 9, 1, 2);
  for (const Task task : {Task::kMono, Task::kPara}) {
    const Batch b = one.next(task);
    ASSERT_EQ(b.labels.sizes(), (std::vector<int64_t>{4, 10}));
    EXPECT_EQ(b.real_tokens, 40);
    EXPECT_FALSE(b.padding.any().item<bool>());
    for (int64_t r = 0; r < 4; ++r) {
      EXPECT_EQ(b.labels[r][0].item<int64_t>(), ids.bos);
      EXPECT_EQ(b.labels[r][9].item<int64_t>(), ids.eos);
      for (int64_t i = 1; i < 9; ++i) {
        const int64_t id = b.labels[r][i].item<int64_t>();
        if (task == Task::kPara && i == 5) {
          EXPECT_EQ(id, ids.eos);  // <s> e </s> f </s>, </s> at length / 2
        } else {
          EXPECT_TRUE(id >= 4 && id < ids.mask) << id;
        }
      }
      // 0.3 of 8 or 7 pieces, randomly rounded; every selected piece shown as <mask>.
      const int64_t k = b.masked[r].sum().item<int64_t>();
      EXPECT_TRUE(k == 2 || k == 3) << k;
    }
    EXPECT_TRUE(torch::equal(b.input_ids, b.labels.masked_fill(b.masked, ids.mask)));
    const Batch a0 = rank0.next(task), a1 = rank1.next(task);
    EXPECT_TRUE(torch::equal(b.input_ids, torch::cat({a0.input_ids, a1.input_ids})));
    EXPECT_TRUE(torch::equal(b.masked, torch::cat({a0.masked, a1.masked})));
  }
  EXPECT_EQ(one.state(), "4 4");
}

}  // namespace
}  // namespace xlme::data
