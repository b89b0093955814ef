// Losses and statistics on hand-computed examples, the objective sets, and normalization by
// counts summed over micro-batches.
#include "xlme/objectives/objectives.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>

namespace xlme::objectives {
namespace {

using Strings = std::vector<std::string>;

TEST(GeneratorTerm, HandComputed) {
  // Row 0: uniform over 3 ids, target 1: CE = ln 3, argmax 0 (wrong).
  // Row 1: logits (ln 3, 0, 0), target 0: CE = -ln(3/5) = ln(5/3), argmax 0 (right).
  const auto logits =
      torch::tensor({0.0, 0.0, 0.0, std::log(3.0), 0.0, 0.0}, torch::kDouble).view({2, 3});
  const auto term = generator_term("mlm", logits, torch::tensor({1, 0}, torch::kInt64));
  EXPECT_NEAR(term.loss_sum.item<double>(), std::log(5.0), 1e-12);  // ln 3 + ln 5/3
  EXPECT_EQ(term.count.item<int64_t>(), 2);
  EXPECT_EQ(term.statistics.at("correct").item<int64_t>(), 1);
  EXPECT_EQ(term.weight, 1.0);
  const auto s = summarize(term);
  EXPECT_NEAR(s.at("loss"), std::log(5.0) / 2, 1e-12);
  EXPECT_NEAR(s.at("accuracy"), 0.5, 1e-12);
  EXPECT_FALSE(s.count("precision"));
}

TEST(DiscriminatorTerm, HandComputedWithPadding) {
  // Logits (2, -1, 0.5, 3); only token 0 replaced; token 3 is padding.
  const auto logits = torch::tensor({2.0, -1.0, 0.5, 3.0}, torch::kDouble).view({1, 4});
  const auto replaced = torch::tensor({true, false, false, false}).view({1, 4});
  const auto padding = torch::tensor({false, false, false, true}).view({1, 4});
  const auto term = discriminator_term("mrtd", 50.0, logits, replaced, padding);
  // BCE: y=1, x=2: ln(1+e^-2); y=0, x=-1: ln(1+e^-1); y=0, x=0.5: ln(1+e^0.5).
  const double expected =
      std::log1p(std::exp(-2.0)) + std::log1p(std::exp(-1.0)) + std::log1p(std::exp(0.5));
  EXPECT_NEAR(term.loss_sum.item<double>(), expected, 1e-12);
  EXPECT_EQ(term.count.item<int64_t>(), 3);
  EXPECT_EQ(term.weight, 50.0);
  // Predicted replaced: tokens 0 and 2 (token 3 is padding): 1 true positive, 1 false positive.
  EXPECT_EQ(term.statistics.at("correct").item<int64_t>(), 2);
  EXPECT_EQ(term.statistics.at("true_positive").item<int64_t>(), 1);
  EXPECT_EQ(term.statistics.at("predicted_positive").item<int64_t>(), 2);
  EXPECT_EQ(term.statistics.at("replaced").item<int64_t>(), 1);
  const auto s = summarize(term);
  EXPECT_NEAR(s.at("loss"), expected / 3, 1e-12);
  EXPECT_NEAR(s.at("accuracy"), 2.0 / 3, 1e-12);
  EXPECT_NEAR(s.at("precision"), 0.5, 1e-12);
  EXPECT_NEAR(s.at("recall"), 1.0, 1e-12);
  EXPECT_NEAR(s.at("f1"), 2.0 / 3, 1e-12);
  EXPECT_NEAR(s.at("replaced_fraction"), 1.0 / 3, 1e-12);
}

TEST(Objectives, TermCountsAndStatisticNamesMatchTheTerms) {
  data::Batch batch;
  batch.masked = torch::tensor({false, true, true, false, false, true}).view({2, 3});
  batch.padding = torch::tensor({false, false, false, false, true, true}).view({2, 3});
  EXPECT_EQ(term_count("mlm", batch), 3);
  EXPECT_EQ(term_count("tlm", batch), 3);
  EXPECT_EQ(term_count("mrtd", batch), 4);
  EXPECT_EQ(term_count("trtd", batch), 4);
  // The counts the terms themselves report for the same positions.
  const auto logits = torch::zeros({2, 3});
  const auto disc = discriminator_term("mrtd", 1.0, logits, batch.masked, batch.padding);
  EXPECT_EQ(disc.count.item<int64_t>(), term_count("mrtd", batch));
  const auto gen = generator_term("mlm", torch::zeros({3, 5}), torch::zeros({3}, torch::kLong));
  EXPECT_EQ(gen.count.item<int64_t>(), term_count("mlm", batch));
  for (const auto& term : {disc, gen}) {
    Strings keys;
    for (const auto& [key, value] : term.statistics) keys.push_back(key);
    EXPECT_EQ(keys, statistic_names(term.name)) << term.name;
  }
  EXPECT_TRUE(is_generator_term("tlm"));
  EXPECT_FALSE(is_generator_term("trtd"));
}

TEST(Objectives, SetsAndTheirTerms) {
  config::ObjectivesConfig c;
  auto terms = [&](const std::string& set, data::Task task) {
    c.set = set;
    return Objectives(c).term_names(task);
  };
  EXPECT_EQ(terms("xlme", data::Task::kMono), (Strings{"mlm", "mrtd"}));
  EXPECT_EQ(terms("xlme", data::Task::kPara), (Strings{"tlm", "trtd"}));
  EXPECT_EQ(terms("xlme-mono", data::Task::kMono), (Strings{"mlm", "mrtd"}));
  EXPECT_EQ(terms("xlme-mono", data::Task::kPara), Strings{});
  EXPECT_EQ(terms("mlm", data::Task::kMono), Strings{"mlm"});
  EXPECT_EQ(terms("mlm", data::Task::kPara), Strings{});
  EXPECT_EQ(terms("mlm+tlm", data::Task::kMono), Strings{"mlm"});
  EXPECT_EQ(terms("mlm+tlm", data::Task::kPara), Strings{"tlm"});
}

model::ModelOutput hand_output() {
  model::ModelOutput out;
  out.generator_logits =
      torch::tensor({0.0, 0.0, 0.0, std::log(3.0), 0.0, 0.0}, torch::kDouble).view({2, 3});
  out.generator_targets = torch::tensor({1, 0}, torch::kInt64);
  out.discriminator_logits = torch::tensor({2.0, -1.0, 0.5, 3.0}, torch::kDouble).view({1, 4});
  out.replaced = torch::tensor({true, false, false, false}).view({1, 4});
  out.padding = torch::tensor({false, false, false, true}).view({1, 4});
  return out;
}

TEST(Objectives, TotalLossIsMlmPlusLambdaRtd) {
  config::ObjectivesConfig c;
  c.rtd_weight = 50.0;
  const auto terms = Objectives(c).compute(hand_output(), data::Task::kPara);
  ASSERT_EQ(terms.size(), 2u);
  EXPECT_EQ(terms[0].name, "tlm");
  EXPECT_EQ(terms[1].name, "trtd");
  const double rtd =
      std::log1p(std::exp(-2.0)) + std::log1p(std::exp(-1.0)) + std::log1p(std::exp(0.5));
  // Normalizers as if other micro-batches of the step added 2 masked and 5 real tokens.
  const auto loss = weighted_loss(terms, {{"tlm", torch::tensor(4)}, {"trtd", torch::tensor(8)}});
  EXPECT_NEAR(loss.item<double>(), std::log(5.0) / 4 + 50.0 * rtd / 8, 1e-12);
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] {
                                      weighted_loss(terms, {{"tlm", torch::tensor(4)}});
                                    }),
                                    {"no normalizer", "trtd"}));
}

TEST(Objectives, MaskedLmOutputCannotFeedRtd) {
  config::ObjectivesConfig c;
  auto out = hand_output();
  out.discriminator_logits = torch::Tensor();
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { Objectives(c).compute(out, data::Task::kMono); }),
      {"mrtd", "objectives.set=xlme"}));
  c.set = "mlm";
  EXPECT_EQ(Objectives(c).compute(out, data::Task::kMono).size(), 1u);
}

// Two micro-batches normalized by the step's summed counts give the loss and gradient of one
// batch holding both.
TEST(Objectives, MicroBatchesNormalizedByStepCountsEqualOneBatch) {
  torch::manual_seed(2);
  const auto logits = torch::randn({7, 5}, torch::kDouble).requires_grad_(true);
  const auto targets = torch::randint(0, 5, {7}, torch::kInt64);
  const auto d_logits = torch::randn({3, 6}, torch::kDouble).requires_grad_(true);
  const auto replaced = torch::rand({3, 6}) < 0.3;
  const auto padding = torch::zeros({3, 6}, torch::kBool);
  padding[2].narrow(0, 4, 2).fill_(true);

  auto whole = [&](int64_t g0, int64_t g1, int64_t d0, int64_t d1) {
    return std::vector<Term>{
        generator_term("mlm", logits.narrow(0, g0, g1 - g0), targets.narrow(0, g0, g1 - g0)),
        discriminator_term("mrtd", 50.0, d_logits.narrow(0, d0, d1 - d0),
                           replaced.narrow(0, d0, d1 - d0), padding.narrow(0, d0, d1 - d0))};
  };
  const auto one = whole(0, 7, 0, 3);
  const std::map<std::string, torch::Tensor> norms = {{"mlm", one[0].count},
                                                      {"mrtd", one[1].count}};
  const auto one_loss = weighted_loss(one, norms);
  const auto grads_one = torch::autograd::grad({one_loss}, {logits, d_logits});

  const auto first = whole(0, 3, 0, 1), second = whole(3, 7, 1, 3);
  EXPECT_EQ((first[1].count + second[1].count).item<int64_t>(), 16);  // 18 tokens, 2 pads
  const auto split_loss = weighted_loss(first, norms) + weighted_loss(second, norms);
  const auto grads_split = torch::autograd::grad({split_loss}, {logits, d_logits});
  EXPECT_NEAR(split_loss.item<double>(), one_loss.item<double>(), 1e-12);
  EXPECT_TRUE(torch::allclose(grads_split[0], grads_one[0], 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(grads_split[1], grads_one[1], 1e-12, 1e-12));
}

}  // namespace
}  // namespace xlme::objectives
