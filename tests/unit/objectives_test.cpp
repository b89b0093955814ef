// Losses and statistics on hand-computed examples, the objectives.set registry, normalization by
// counts summed over micro-batches, and the term sums that training and validation reduce.
#include "xlme/objectives/objectives.h"

#include "xlme/config/objective_set.h"
#include "xlme/objectives/term_sums.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <set>

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

// "correct" counts rows whose first maximal id is the target, as argmax does, on rows as wide
// as a vocabulary (the vectorized reduction's path) with ties between two ids of each row.
TEST(GeneratorTerm, AccuracyCountsTheFirstMaximumOfWideRows) {
  torch::manual_seed(5);
  const int64_t rows = 64, vocab = 16000;
  auto logits = torch::randn({rows, vocab});
  auto targets = torch::empty({rows}, torch::kInt64);
  int64_t expected = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = (r * 977) % vocab, second = (first + 1 + r * 31) % vocab;
    const int64_t lo = std::min(first, second), hi = std::max(first, second);
    logits[r][lo] = 10.0;
    logits[r][hi] = 10.0;
    // Targets: the first maximum, the tied later one, or an ordinary id, in turn.
    const int64_t target = r % 3 == 0 ? lo : r % 3 == 1 ? hi : (lo + 2) % vocab;
    targets[r] = target;
    if (target == lo) ++expected;
  }
  const auto term = generator_term("mlm", logits, targets);
  EXPECT_EQ(term.statistics.at("correct").item<int64_t>(), expected);
  EXPECT_EQ(expected, 22);
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

// --- The objectives.set registry ---------------------------------------------------------------

TEST(ObjectiveSets, UnknownNameListsTheKnownOnes) {
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] { objective_set("electra"); }),
      {"unknown objectives.set 'electra'", "known sets: xlme, xlme-mono, mlm, mlm+tlm"}));
  // The model's architecture and the Objectives come from the same table, with the same error.
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] { model::architecture_for("electra"); }),
      {"unknown objectives.set 'electra'", "known sets: xlme, xlme-mono, mlm, mlm+tlm"}));
  config::ObjectivesConfig c;
  c.set = "xlm-e";
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] { Objectives objectives(c); }),
                                    {"'xlm-e'", "xlme, xlme-mono, mlm, mlm+tlm"}));
}

// The config accepts exactly the table's names, and its error lists them.
TEST(ObjectiveSets, ConfigValidatesAgainstTheTable) {
  EXPECT_EQ(objective_set_names(),
            (Strings{"xlme", "xlme-mono", "mlm", "mlm+tlm", "distill", "veco"}));
  for (const auto& name : objective_set_names()) {
    // VECO's set needs its modules (model.cross_attention), the others refuse them.
    const std::string cross = objective_set(name).cross_attention ? "true" : "false";
    EXPECT_EQ(config::load_config("", {"objectives.set=" + name, "model.cross_attention=" + cross})
                  .objectives.set,
              name);
  }
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] { config::load_config("", {"objectives.set=tlm"}); }),
      {"objectives.set", "got 'tlm'", "one of: xlme, xlme-mono, mlm, mlm+tlm, distill, veco"}));
  // The config reference describes every set from its row.
  EXPECT_TRUE(testing::contains_all(
      config::to_yaml(config::Config{}, /*docs=*/true),
      {"xlme = MLM+TLM+MRTD+TRTD; xlme-mono = MLM+MRTD; mlm = XLM-R-style MLM; mlm+tlm = "
       "XLM-style MLM+TLM; distill = MiniLMv2-style distillation of distill.teacher; veco = "
       "VECO's cross-attention MLM (model.cross_attention=true)"}));
}

// What each row needs: the generator-discriminator pair for the RTD terms, and the data.
TEST(ObjectiveSets, RowsSayWhatEachSetNeeds) {
  std::set<std::string> names;
  for (const auto& set : objective_sets()) {
    EXPECT_TRUE(names.insert(set.name).second) << set.name;
    EXPECT_TRUE(set.monolingual || set.translation_pairs) << set.name << " trains on nothing";
    EXPECT_EQ(model::architecture_for(set.name), set.distillation ? model::Architecture::kEncoder
                                                 : set.discriminator
                                                     ? model::Architecture::kElectra
                                                     : model::Architecture::kMaskedLm);
  }
  const auto& xlme = objective_set("xlme");
  EXPECT_TRUE(xlme.discriminator && xlme.monolingual && xlme.translation_pairs);
  const auto& mono = objective_set("xlme-mono");
  EXPECT_TRUE(mono.discriminator && mono.monolingual && !mono.translation_pairs);
  const auto& mlm = objective_set("mlm");
  EXPECT_TRUE(!mlm.discriminator && mlm.monolingual && !mlm.translation_pairs);
  const auto& xlm = objective_set("mlm+tlm");
  EXPECT_TRUE(!xlm.discriminator && xlm.monolingual && xlm.translation_pairs);
  EXPECT_EQ(xlme.monolingual_terms(), (Strings{"mlm", "mrtd"}));
  EXPECT_EQ(xlme.translation_pair_terms(), (Strings{"tlm", "trtd"}));
  EXPECT_EQ(xlm.translation_pair_terms(), Strings{"tlm"});
  EXPECT_EQ(mono.translation_pair_terms(), Strings{});
  const auto& veco = objective_set("veco");
  EXPECT_TRUE(veco.cross_attention && !veco.discriminator && veco.monolingual &&
              veco.translation_pairs && !veco.distillation);
  EXPECT_EQ(veco.monolingual_terms(), (Strings{"mlm_x", "mlm_xy", "mlm_y", "mlm_yx"}));
  EXPECT_EQ(veco.translation_pair_terms(), (Strings{"tlm_x", "tlm_xy", "tlm_y", "tlm_yx"}));
  for (const char* term : {"mlm_x", "mlm_xy", "tlm_y", "tlm_yx"}) {
    EXPECT_TRUE(is_generator_term(term)) << term;
  }
  const auto& distill = objective_set("distill");
  EXPECT_TRUE(distill.distillation && !distill.discriminator && distill.monolingual &&
              !distill.translation_pairs);
  EXPECT_EQ(distill.monolingual_terms(), (Strings{"qq_kl", "kk_kl", "vv_kl"}));
}

// The step's counts per term: a batch counts for its own task's terms only, and the normalizers
// are the summed counts, at least 1.
TEST(Objectives, CountsAndNormalizers) {
  config::ObjectivesConfig c;
  c.rtd_weight = 20.0;
  const Objectives objectives(c);
  EXPECT_EQ(objectives.term_names(), (Strings{"mlm", "mrtd", "tlm", "trtd"}));
  EXPECT_EQ(objectives.weight("mlm"), 1.0);
  EXPECT_EQ(objectives.weight("trtd"), 20.0);
  data::Batch batch;
  batch.task = data::Task::kPara;
  batch.masked = torch::tensor({false, true, true, false, false, true}).view({2, 3});
  batch.padding = torch::tensor({false, false, false, false, true, true}).view({2, 3});
  EXPECT_EQ(objectives.counts(batch), (std::vector<double>{0, 0, 3, 4}));
  batch.task = data::Task::kMono;
  EXPECT_EQ(objectives.counts(batch), (std::vector<double>{3, 4, 0, 0}));
  // [mlm, mrtd, tlm, trtd, anything after them]
  const auto norms =
      objectives.normalizers(torch::tensor({3.0, 4.0, 0.0, 9.0, 1e9}, torch::kFloat64));
  ASSERT_EQ(norms.size(), 4u);
  EXPECT_EQ(norms.at("mlm").item<float>(), 3.0f);
  EXPECT_EQ(norms.at("mrtd").item<float>(), 4.0f);
  EXPECT_EQ(norms.at("tlm").item<float>(), 1.0f);  // nothing masked anywhere: 0 / 1, not 0 / 0
  EXPECT_EQ(norms.at("trtd").item<float>(), 9.0f);
  EXPECT_EQ(norms.at("tlm").scalar_type(), torch::kFloat32);
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { objectives.normalizers(torch::zeros({3}, torch::kFloat64)); }),
      {"4 terms", "[3]"}));
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

// --- Term sums ---------------------------------------------------------------------------------

// The terms of hand_output() for `task`, with the logits scaled by `scale` (another micro-batch).
std::vector<Term> hand_terms(const Objectives& objectives, data::Task task, double scale) {
  auto out = hand_output();
  out.generator_logits = out.generator_logits * scale;
  out.discriminator_logits = out.discriminator_logits * scale;
  return objectives.compute(out, task);
}

// Naive reference: the terms' fields added one by one, in double.
std::map<std::string, Term> naive_sums(const std::vector<std::vector<Term>>& micro_batches) {
  std::map<std::string, Term> sums;
  for (const auto& terms : micro_batches) {
    for (const auto& t : terms) {
      auto [it, fresh] = sums.try_emplace(t.name, t);
      if (fresh) continue;
      it->second.loss_sum = it->second.loss_sum + t.loss_sum;
      it->second.count = it->second.count + t.count;
      for (const auto& [k, v] : t.statistics)
        it->second.statistics[k] = it->second.statistics[k] + v;
    }
  }
  return sums;
}

TEST(TermSums, AddedMicroBatchesSummarizeLikeTheirSums) {
  config::ObjectivesConfig c;
  c.rtd_weight = 50.0;
  const Objectives objectives(c);
  const std::vector<std::vector<Term>> micro = {hand_terms(objectives, data::Task::kMono, 1.0),
                                                hand_terms(objectives, data::Task::kMono, -2.0),
                                                hand_terms(objectives, data::Task::kPara, 0.5)};
  TermSums sums(objectives);
  for (const auto& terms : micro) sums.add(terms);
  EXPECT_EQ(sums.names(), (Strings{"mlm", "mrtd", "tlm", "trtd"}));
  const auto summary = sums.summary();
  const auto naive = naive_sums(micro);
  double total = 0;
  for (const auto& [name, term] : naive) {
    const auto expected = summarize(term);
    ASSERT_EQ(summary.at(name).size(), expected.size()) << name;
    for (const auto& [key, value] : expected) {
      EXPECT_NEAR(summary.at(name).at(key), value, 1e-12) << name << " " << key;
    }
    total += (name == "mlm" || name == "tlm" ? 1.0 : 50.0) * expected.at("loss");
  }
  // Two mono micro-batches: mlm = (ln 5 + CE at -2x logits) / 4 masked positions. At -2x, row 0
  // stays uniform (ln 3) and row 1 is (-2 ln 3, 0, 0) with target 0: ln((1/9 + 2) / (1/9)).
  const double ce_scaled = std::log(3.0) + std::log(19.0);
  EXPECT_NEAR(summary.at("mlm").at("loss"), (std::log(5.0) + ce_scaled) / 4, 1e-12);
  EXPECT_NEAR(sums.total_loss(), total, 1e-9);
}

// Rank 0 saw only monolingual micro-batches and rank 1 only pairs: both lay out every term, so the
// element-wise sum of their flat tensors (what the all-reduce computes) holds the sums of all.
TEST(TermSums, FlatLayoutIsTheSameOnEveryRank) {
  const Objectives objectives{config::ObjectivesConfig{}};
  const auto mono = hand_terms(objectives, data::Task::kMono, 1.0);
  const auto para = hand_terms(objectives, data::Task::kPara, 3.0);
  TermSums rank0(objectives), rank1(objectives), both(objectives);
  rank0.add(mono);
  rank1.add(para);
  both.add(mono);
  both.add(para);
  // mlm [loss, count, correct], mrtd [loss, count, correct, predicted_positive, replaced,
  // true_positive], then tlm and trtd likewise.
  EXPECT_EQ(rank0.flat_size(), 18);
  const auto flat0 = rank0.flatten(torch::kCPU), flat1 = rank1.flatten(torch::kCPU);
  ASSERT_EQ(flat0.sizes(), flat1.sizes());
  EXPECT_EQ(flat0.scalar_type(), torch::kFloat64);
  EXPECT_NEAR(flat0[0].item<double>(), std::log(5.0), 1e-12);  // mlm loss sum
  EXPECT_EQ(flat0[1].item<double>(), 2.0);                     // mlm count
  EXPECT_EQ(flat0[2].item<double>(), 1.0);                     // mlm correct
  EXPECT_EQ(flat0[4].item<double>(), 3.0);                     // mrtd count
  EXPECT_TRUE(torch::equal(flat0.narrow(0, 9, 9), torch::zeros({9}, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(flat1.narrow(0, 0, 9), torch::zeros({9}, torch::kFloat64)));

  const TermSums reduced = rank0.unflatten(flat0 + flat1);
  EXPECT_EQ(reduced.summary(), both.summary());
  EXPECT_EQ(reduced.total_loss(), both.total_loss());
  // A term nothing was added to reads as zeros.
  EXPECT_EQ(rank0.summary().at("tlm").at("loss"), 0.0);
  EXPECT_EQ(rank0.summary().at("tlm").at("accuracy"), 0.0);

  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { rank0.unflatten(torch::zeros({17}, torch::kFloat64)); }),
      {"expected [18] values", "mlm, mrtd, tlm, trtd", "[17]"}));
}

TEST(TermSums, StepsOfAnIntervalAddUp) {
  const Objectives objectives{config::ObjectivesConfig{}};
  TermSums step1(objectives), step2(objectives), both(objectives);
  step1.add(hand_terms(objectives, data::Task::kMono, 1.0));
  step2.add(hand_terms(objectives, data::Task::kMono, -1.0));
  both.add(hand_terms(objectives, data::Task::kMono, 1.0));
  both.add(hand_terms(objectives, data::Task::kMono, -1.0));
  TermSums interval;  // starts with no terms and takes over the first step's
  interval.add(step1.unflatten(step1.flatten(torch::kCPU)));
  interval.add(step2.unflatten(step2.flatten(torch::kCPU)));
  EXPECT_EQ(interval.names(), both.names());
  const auto got = interval.summary(), expected = both.summary();
  for (const auto& [name, s] : expected) {
    for (const auto& [key, value] : s) EXPECT_NEAR(got.at(name).at(key), value, 1e-12) << name;
  }
}

TEST(TermSums, RejectsATermOfAnotherSet) {
  config::ObjectivesConfig c;
  c.set = "mlm";
  const Objectives mlm(c);
  TermSums sums(mlm);
  const auto xlme_terms = hand_terms(Objectives{config::ObjectivesConfig{}}, data::Task::kMono, 1);
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] { sums.add(xlme_terms); }),
                                    {"objective term mrtd", "summed terms (mlm)"}));
}

TEST(TermSums, LogTextAndFields) {
  const TermSummaries terms = {
      {"mlm", {{"loss", 7.125}, {"accuracy", 0.0512}}},
      {"mrtd", {{"loss", 0.4213}, {"accuracy", 0.8}, {"f1", 0.12}, {"precision", 0.5}}}};
  EXPECT_EQ(log_text(terms), " | mlm 7.125 acc 0.051 | mrtd 0.4213 acc 0.800 f1 0.120");
  const std::vector<std::pair<std::string, double>> expected = {{"loss/mlm", 7.125},
                                                                {"accuracy/mlm", 0.0512},
                                                                {"loss/mrtd", 0.4213},
                                                                {"accuracy/mrtd", 0.8},
                                                                {"f1/mrtd", 0.12}};
  EXPECT_EQ(log_fields(terms), expected);
}

}  // namespace
}  // namespace xlme::objectives
