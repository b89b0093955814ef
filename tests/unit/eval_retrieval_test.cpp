// The retrieval probe: sentence ids, mean-pooled sentence embeddings against a one-sentence-at-a-
// time reference, and nearest-neighbour accuracy against a naive loop and hand-made embeddings.
#include "xlme/eval/retrieval.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

#include <cmath>

namespace xlme::eval {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

// The naive reference: cosine with every candidate in a double loop, the first maximum wins.
std::vector<int64_t> naive_nearest(const torch::Tensor& q, const torch::Tensor& c) {
  const auto qa = q.to(torch::kFloat64).contiguous(), ca = c.to(torch::kFloat64).contiguous();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < qa.size(0); ++i) {
    double best = -2;
    int64_t arg = -1;
    for (int64_t j = 0; j < ca.size(0); ++j) {
      double dot = 0, nq = 0, nc = 0;
      for (int64_t h = 0; h < qa.size(1); ++h) {
        const double x = qa[i][h].item<double>(), y = ca[j][h].item<double>();
        dot += x * y;
        nq += x * x;
        nc += y * y;
      }
      const double cosine = nq > 0 && nc > 0 ? dot / std::sqrt(nq * nc) : 0.0;
      if (cosine > best + 1e-12) best = cosine, arg = j;
    }
    out.push_back(arg);
  }
  return out;
}

TEST(Retrieval, NearestNeighboursMatchANaiveLoopWithTiesToTheLowestIndex) {
  torch::manual_seed(3);
  // Small integer entries make exact ties (and duplicate rows) frequent.
  auto candidates = torch::randint(-2, 3, {40, 3}).to(torch::kFloat32);
  candidates[7] = candidates[3];
  candidates[11] = candidates[3] * 2;  // same direction: the same cosine
  candidates[5].zero_();
  const auto queries = torch::randint(-2, 3, {30, 3}).to(torch::kFloat32);
  const auto found = nearest_neighbours(queries, candidates);
  const auto expected = naive_nearest(queries, candidates);
  ASSERT_EQ(found.size(0), 30);
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(found[i].item<int64_t>(), expected[i]) << i;
  // A query equal to candidate 3 finds 3, never its duplicates 7 and 11.
  EXPECT_EQ(nearest_neighbours(candidates.slice(0, 3, 4), candidates)[0].item<int64_t>(), 3);
}

TEST(Retrieval, AccuracyOnHandMadeEmbeddings) {
  // a0 -> b0 (same direction); a1 = (0, 1) is nearest to b2 = (0.1, 1), not to b1 = (1, 1);
  // a2 = (1, 1) -> b1. Backwards: b0 -> a0, b1 -> a2, b2 -> a1.
  const auto a = torch::tensor({1.0, 0.0, 0.0, 1.0, 1.0, 1.0}).view({3, 2});
  const auto b = torch::tensor({3.0, 0.0, 1.0, 1.0, 0.1, 1.0}).view({3, 2});
  const RetrievalAccuracy r = retrieval_accuracy(a, b);
  EXPECT_DOUBLE_EQ(r.a_to_b, 1.0 / 3);
  EXPECT_DOUBLE_EQ(r.b_to_a, 1.0 / 3);
  EXPECT_DOUBLE_EQ(r.mean, 1.0 / 3);
  const RetrievalAccuracy same = retrieval_accuracy(b, b * 5);
  EXPECT_DOUBLE_EQ(same.a_to_b, 1.0);
  EXPECT_DOUBLE_EQ(same.mean, 1.0);
  // Asymmetric: c1 and c2 both point at a's row 2's direction.
  const auto c = torch::tensor({1.0, 0.0, 1.0, 1.0, 2.0, 2.0}).view({3, 2});
  const auto d = torch::tensor({1.0, 0.0, 0.0, 1.0, 1.0, 1.0}).view({3, 2});
  const RetrievalAccuracy asym = retrieval_accuracy(c, d);
  EXPECT_DOUBLE_EQ(asym.a_to_b, 2.0 / 3);  // c0 -> d0, c1 -> d2 (wrong), c2 -> d2
  EXPECT_DOUBLE_EQ(asym.b_to_a, 2.0 / 3);  // d0 -> c0, d1 -> c1 (ties with c2: lowest), d2 -> c1
  EXPECT_DOUBLE_EQ(asym.mean, 2.0 / 3);
  EXPECT_TRUE(contains_all(error_message([&] { retrieval_accuracy(a, b.slice(0, 0, 2)); }),
                           {"same shape", "[3, 2]", "[2, 2]"}));
}

model::Encoder tiny_encoder(config::Config& c) {
  c = xlme::testing::tiny_train_config(2, 1, /*dropout=*/0.3);  // dropout: eval mode must be on
  c.model.layers = 3;
  return xlme::testing::make_tiny_model(c, 9)->discriminator;
}

TEST(Retrieval, SentenceEmbeddingsEqualOneSentenceAtATime) {
  config::Config c;
  auto encoder = tiny_encoder(c);
  encoder->train();
  std::vector<std::vector<int64_t>> ids;
  torch::manual_seed(1);
  for (int n = 0; n < 13; ++n) {
    std::vector<int64_t> s{0};
    for (int k = 0; k < 1 + (n * 7) % 11; ++k) s.push_back(4 + (n * 13 + k * 5) % 50);
    s.push_back(2);
    ids.push_back(s);
  }
  EmbeddingOptions options;
  options.batch_size = 4;
  const auto all = sentence_embeddings(encoder, ids, options);  // layers 0..3
  ASSERT_EQ(all.size(), 4u);
  EXPECT_TRUE(encoder->is_training());  // restored
  options.layers = {2};
  const auto middle = sentence_embeddings(encoder, ids, options);
  ASSERT_EQ(middle.size(), 1u);
  EXPECT_TRUE(torch::allclose(middle[0], all[2], 1e-5, 1e-6));

  encoder->eval();
  torch::NoGradGuard no_grad;
  for (size_t n = 0; n < ids.size(); ++n) {
    const auto t = static_cast<int64_t>(ids[n].size());
    const auto input = torch::tensor(ids[n], torch::kLong).view({1, t});
    const auto states = encoder->hidden_states(input, torch::arange(t).view({1, t}),
                                               torch::zeros({1, t}, torch::kBool));
    for (size_t l = 0; l < states.size(); ++l) {
      const auto expected = states[l][0].mean(0);  // every position: no padding here
      EXPECT_TRUE(torch::allclose(all[l][static_cast<int64_t>(n)], expected, 1e-4, 1e-5))
          << "sentence " << n << " layer " << l;
    }
  }
  EXPECT_TRUE(contains_all(error_message([&] {
                             options.layers = {4};
                             sentence_embeddings(encoder, ids, options);
                           }),
                           {"layer 4", "0 (embeddings) to 3"}));
}

TEST(Retrieval, SentenceIdsAreWrappedAndTruncated) {
  xlme::testing::TempDir dir;
  xlme::testing::write_heldout_and_tokenizer(dir.path().string(), 60);
  const data::Tokenizer tokenizer(dir / "spm.model", data::VocabLayout::kOwn);
  const auto& special = tokenizer.special_ids();
  const std::string text = "green house over the river n12";
  const auto pieces = tokenizer.encode(text);
  ASSERT_GT(pieces.size(), 4u);
  const auto full = sentence_ids(tokenizer, text, 100);
  ASSERT_EQ(full.size(), pieces.size() + 2);
  EXPECT_EQ(full.front(), special.bos);
  EXPECT_EQ(full.back(), special.eos);
  for (size_t i = 0; i < pieces.size(); ++i) EXPECT_EQ(full[i + 1], pieces[i]);
  const auto cut = sentence_ids(tokenizer, text, 4);
  EXPECT_EQ(cut, (std::vector<int64_t>{special.bos, pieces[0], pieces[1], special.eos}));
  EXPECT_EQ(sentence_ids(tokenizer, std::vector<std::string>{text, ""}, 4).at(1),
            (std::vector<int64_t>{special.bos, special.eos}));
}

}  // namespace
}  // namespace xlme::eval
