// Periodic validation: held-out pairs read and checked, fixed masked micro-batches that cover every
// pair, results equal to a direct computation and equal run after run, and validating between
// steps changes nothing in training.
#include "xlme/train/validation.h"

#include "xlme/data/synthetic.h"
#include "xlme/train/rng.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::TempDir;
using xlme::testing::write_file;

class Validation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      dir_ = new TempDir();
      xlme::testing::write_heldout_and_tokenizer(dir_->path().string(), 40);
      tokenizer_ = new data::Tokenizer(*dir_ / "spm.model", data::VocabLayout::kOwn);
    });
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete dir_;
  }
  inline static xlme::testing::SuiteSetUp setup_;
  void SetUp() override { setup_.check(); }
  static config::Config config() {
    auto c = xlme::testing::tiny_train_config(4, 1, /*dropout=*/0.1);
    c.model.vocab_size = tokenizer_->vocab_size();
    c.model.layers = 2;
    c.data.heldout.dir = dir_->path().string();
    c.data.heldout.max_pairs = 30;
    c.data.mono.max_len = 24;
    c.data.para.max_len = 24;
    c.train.micro_batch_tokens = 96;
    return c;
  }
  static TempDir* dir_;
  static data::Tokenizer* tokenizer_;
};
TempDir* Validation::dir_ = nullptr;
data::Tokenizer* Validation::tokenizer_ = nullptr;

TEST_F(Validation, ReadsPairsAndNamesWhatIsWrong) {
  auto c = config();
  const auto pairs = data::read_heldout(c.data.heldout, *tokenizer_);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].name, "en-de");
  EXPECT_EQ(pairs[1].second_language, "fr");
  EXPECT_EQ(pairs[0].a.size(), 30u);  // max_pairs of 40 lines
  std::istringstream english(xlme::testing::read_file(*dir_ / "en-de.en"));
  std::string line;
  for (int i = 0; i < 4; ++i) std::getline(english, line);
  EXPECT_EQ(pairs[0].a[3], tokenizer_->encode(line));
  c.data.heldout.pairs = {"en-xx"};
  EXPECT_TRUE(contains_all(error_message([&] { data::read_heldout(c.data.heldout, *tokenizer_); }),
                           {"data.heldout.pairs", "en-xx", dir_->path().string()}));
  TempDir bad;
  write_file(bad / "en-de.en", "a\nb\n");
  write_file(bad / "en-de.de", "a\n");
  c.data.heldout.pairs = {};
  c.data.heldout.dir = bad.path().string();
  EXPECT_TRUE(contains_all(error_message([&] { data::read_heldout(c.data.heldout, *tokenizer_); }),
                           {"en-de", "en-de.en has 2 lines", "en-de.de has 1", "line-aligned"}));
}

TEST_F(Validation, BatchesCoverEveryPairAndMaskOnlyPieces) {
  auto c = config();
  c.data.too_long = "truncate";
  const auto pairs = data::read_heldout(c.data.heldout, *tokenizer_);
  const auto special = tokenizer_->special_ids();
  const Validator validator(c, pairs, special);
  const Validator again(c, pairs, special);
  int64_t para_rows = 0, mono_pieces = 0;
  std::set<std::vector<int32_t>> distinct;
  for (const auto& p : pairs) {
    for (size_t i = 0; i < p.a.size(); ++i) {
      // A sentence longer than max_len - 2 is cut to fill a sequence alone.
      auto kept = [&](const std::vector<int32_t>& s) {
        return std::min<int64_t>(static_cast<int64_t>(s.size()), c.data.mono.max_len - 2);
      };
      if (distinct.insert(p.a[i]).second) mono_pieces += kept(p.a[i]);
      mono_pieces += kept(p.b[i]);  // de and fr lines are distinct
    }
  }
  int64_t seen_mono_pieces = 0;
  ASSERT_EQ(validator.micro_batches(), again.micro_batches());
  for (int64_t i = 0; i < validator.micro_batches(); ++i) {
    const auto& b = validator.batches()[static_cast<size_t>(i)];
    const auto& same = again.batches()[static_cast<size_t>(i)];
    EXPECT_TRUE(torch::equal(b.input_ids, same.input_ids));  // fixed masking
    EXPECT_LE(b.input_ids.numel(), c.train.micro_batch_tokens);
    const auto real = b.padding.logical_not();
    const auto specials = (b.labels == special.bos) | (b.labels == special.eos);
    EXPECT_FALSE((b.masked & specials).any().item<bool>());
    EXPECT_FALSE((b.masked & b.padding).any().item<bool>());
    EXPECT_EQ(real.sum().item<int64_t>(), b.real_tokens);
    if (b.task == data::Task::kPara) {
      para_rows += b.input_ids.size(0);
    } else {
      seen_mono_pieces += (real & ~specials).sum().item<int64_t>();
    }
  }
  EXPECT_EQ(para_rows, 60);  // every pair line of both pairs, once (the long ones truncated)
  // data.too_long=drop leaves out the pairs over data.para.max_len, as training does.
  c.data.too_long = "drop";
  int64_t fitting = 0, kept_rows = 0;
  for (const auto& p : pairs) {
    for (size_t i = 0; i < p.a.size(); ++i) {
      fitting += static_cast<int64_t>(p.a[i].size() + p.b[i].size() + 3) <= c.data.para.max_len;
    }
  }
  const Validator dropping(c, pairs, special);
  for (const auto& b : dropping.batches()) {
    if (b.task == data::Task::kPara) kept_rows += b.input_ids.size(0);
  }
  EXPECT_EQ(kept_rows, fitting);
  EXPECT_LT(fitting, 60);
  EXPECT_EQ(seen_mono_pieces, mono_pieces);  // English once, de and fr
  EXPECT_EQ(validator.probe_layer(), 1);     // model.layers / 2
}

// TRTD pairs over data.para.max_len are cut (or dropped, data.too_long) by training's rule: the
// longer side gives up tokens first, each side keeping at least half the room if it needs it.
TEST(ValidationBatches, TruncateTrtdPairsAsTrainingDoesAndHonourTooLong) {
  auto c = xlme::testing::tiny_train_config(4, 1, /*dropout=*/0);
  c.data.para.max_len = 18;
  c.train.micro_batch_tokens = 64;
  const auto special = data::SpecialIds::for_vocab(c.model.vocab_size);
  data::HeldoutPair pair;
  pair.name = "en-de";
  pair.first_language = "en";
  pair.second_language = "de";
  pair.a = {{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, {40, 41, 42}};
  pair.b = {{20, 21, 22, 23, 24, 25, 26, 27, 28, 29}, {50, 51}};
  auto para_rows = [&](const std::string& too_long) {
    c.data.too_long = too_long;
    const Validator validator(c, {pair}, special);
    std::vector<std::vector<int64_t>> rows;
    for (const auto& b : validator.batches()) {
      if (b.task != data::Task::kPara) continue;
      for (int64_t r = 0; r < b.labels.size(0); ++r) {
        const auto row = b.labels[r].masked_select(b.padding[r].logical_not()).contiguous();
        rows.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
      }
    }
    return rows;
  };
  // 10 + 10 tokens in 18 - 3: e keeps 8, f 7 (training's make_pool keeps the same).
  const std::vector<std::vector<int64_t>> truncated = {
      {0, 40, 41, 42, 2, 50, 51, 2},
      {0, 10, 11, 12, 13, 14, 15, 16, 17, 2, 20, 21, 22, 23, 24, 25, 26, 2}};
  EXPECT_EQ(para_rows("truncate"), truncated);
  EXPECT_EQ(para_rows("drop"), std::vector<std::vector<int64_t>>{truncated[0]});
}

TEST_F(Validation, UnigramFloorsAreTheMostFrequentShareAndTheEntropyOfTheMaskedOriginals) {
  const auto c = config();
  const Validator validator(c, data::read_heldout(c.data.heldout, *tokenizer_),
                            tokenizer_->special_ids());
  // Counted here position by position over the validator's own micro-batches.
  for (const auto& [task, term] : {std::pair{data::Task::kMono, std::string("mlm")},
                                   std::pair{data::Task::kPara, std::string("tlm")}}) {
    std::map<int64_t, int> counts;
    int total = 0;
    for (const auto& b : validator.batches()) {
      if (b.task != task) continue;
      for (int64_t r = 0; r < b.labels.size(0); ++r) {
        for (int64_t i = 0; i < b.labels.size(1); ++i) {
          if (!b.masked[r][i].item<bool>()) continue;
          ++counts[b.labels[r][i].item<int64_t>()];
          ++total;
        }
      }
    }
    ASSERT_GT(total, 20) << term;
    int most = 0;
    double entropy = 0;
    for (const auto& [id, n] : counts) {
      most = std::max(most, n);
      entropy -= n / static_cast<double>(total) * std::log(n / static_cast<double>(total));
    }
    EXPECT_DOUBLE_EQ(validator.unigram_accuracy().at(term), static_cast<double>(most) / total)
        << term;
    EXPECT_NEAR(validator.unigram_loss().at(term), entropy, 1e-12) << term;
    // A model no better than the frequencies: its loss on these targets is that entropy exactly.
    EXPECT_GT(entropy, 1.0) << term;
  }
  EXPECT_EQ(validator.unigram_accuracy().count("mrtd"), 0u);  // generator terms only
  EXPECT_EQ(validator.unigram_loss().count("trtd"), 0u);
}

TEST_F(Validation, EqualsADirectComputationAndLeavesTrainingUntouched) {
  const auto c = config();
  const auto pairs = data::read_heldout(c.data.heldout, *tokenizer_);
  const Validator validator(c, pairs, tokenizer_->special_ids());
  auto model = xlme::testing::make_tiny_model(c, 4);
  auto comm = xlme::testing::single_process();
  model->train();
  torch::manual_seed(77);
  const auto first = validator.run(model, *comm, torch::kCPU, false);
  const double next_random = torch::rand({1}).item<double>();
  torch::manual_seed(77);
  const auto second = validator.run(model, *comm, torch::kCPU, false);
  EXPECT_EQ(torch::rand({1}).item<double>(), next_random);  // the training stream is untouched
  EXPECT_TRUE(model->is_training());
  ASSERT_EQ(first.terms.size(), 4u);
  for (const auto& [name, s] : first.terms) {
    for (const auto& [key, value] : s)
      EXPECT_EQ(value, second.terms.at(name).at(key)) << name << key;
  }
  EXPECT_EQ(first.retrieval_mean.mean, second.retrieval_mean.mean);

  // The retrieval probe: the retrieval module on the pairs' wrapped sentences at layer 1, cut
  // to data.mono.max_len (how many are cut depends on the SentencePiece version's vocabulary).
  eval::EmbeddingOptions options;
  options.layers = {1};
  auto wrapped = [&](const std::vector<int32_t>& pieces) {
    const auto kept = std::min<size_t>(pieces.size(), static_cast<size_t>(c.data.mono.max_len - 2));
    std::vector<int64_t> ids{0};
    ids.insert(ids.end(), pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(kept));
    ids.push_back(2);
    return ids;
  };
  for (const auto& p : pairs) {
    std::vector<std::vector<int64_t>> a, b;
    for (size_t i = 0; i < p.a.size(); ++i) {
      a.push_back(wrapped(p.a[i]));
      b.push_back(wrapped(p.b[i]));
    }
    const auto expected =
        eval::retrieval_accuracy(eval::sentence_embeddings(model->discriminator, a, options)[0],
                                 eval::sentence_embeddings(model->discriminator, b, options)[0]);
    EXPECT_DOUBLE_EQ(first.retrieval.at(p.name).a_to_b, expected.a_to_b);
    EXPECT_DOUBLE_EQ(first.retrieval.at(p.name).b_to_a, expected.b_to_a);
  }

  // The terms: every micro-batch forward in eval mode with its seed, sums summarized.
  model->eval();
  torch::NoGradGuard no_grad;
  objectives::Objectives objectives(c.objectives);
  std::map<std::string, objectives::Term> sums;
  {
    ForkedRng fork(torch::kCPU);
    const uint64_t seed = c.run.seed * 0x5eed + 17;
    for (size_t i = 0; i < validator.batches().size(); ++i) {
      fork.seed(seed + i);
      const auto& batch = validator.batches()[i];
      for (auto& t :
           objectives.compute(model->forward(model::ModelInputs::from(batch)), batch.task)) {
        auto [it, fresh] = sums.try_emplace(t.name, t);
        if (fresh) continue;
        it->second.loss_sum = it->second.loss_sum + t.loss_sum;
        it->second.count = it->second.count + t.count;
        for (auto& [k, v] : t.statistics) it->second.statistics[k] = it->second.statistics[k] + v;
      }
    }
  }
  model->train();
  for (const auto& [name, term] : sums) {
    const auto expected = objectives::summarize(term);
    for (const auto& [key, value] : expected) {
      // Loss sums: float64 over micro-batches there, float32 here.
      EXPECT_NEAR(first.terms.at(name).at(key), value, 1e-6 * std::max(1.0, std::abs(value)))
          << name << " " << key;
    }
  }
}

TEST_F(Validation, ValidatingBetweenStepsDoesNotChangeTraining) {
  auto c = config();
  c.train.micro_batch_tokens = 4 * 16;
  c.train.tokens_per_task = 4 * 16;
  const auto pairs = data::read_heldout(c.data.heldout, *tokenizer_);
  const Validator validator(c, pairs, tokenizer_->special_ids());
  auto run = [&](bool validate) {
    data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 5);
    Trainer trainer(c, xlme::testing::make_tiny_model(c, 8), source,
                    xlme::testing::single_process());
    for (int step = 0; step < 3; ++step) {
      if (validate)
        validator.run(trainer.model(), *xlme::testing::single_process(), torch::kCPU, false);
      trainer.train_step();
    }
    return trainer.model();
  };
  auto plain = run(false);
  auto validated = run(true);
  xlme::testing::expect_same_parameters(plain, validated, 0);
}

}  // namespace
}  // namespace xlme::train
