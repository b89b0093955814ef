// The ELECTRA model: generator head at masked positions, replacement sampling, gradient paths
// (sampled tokens, gdes), and the ablation switches.
#include "xlme/model/electra.h"

#include "xlme/common/precision.h"
#include "xlme/data/masking.h"
#include "xlme/model/parameter_count.h"
#include "xlme/objectives/objectives.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <string>

namespace xlme::model {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

constexpr int64_t kVocab = 40;

config::ModelConfig tiny_config() {
  config::ModelConfig m;
  m.vocab_size = kVocab;
  m.hidden_size = 16;
  m.layers = 2;
  m.heads = 2;
  m.ffn_size = 32;
  m.max_positions = 32;
  m.dropout = 0.0;
  m.attention_dropout = 0.0;
  m.relative_position.num_buckets = 8;
  m.relative_position.max_distance = 16;
  m.generator.layers = 1;
  return m;
}

// Two sequences of 10; the second ends in 3 pads; 5 masked positions.
ModelInputs tiny_inputs() {
  torch::manual_seed(11);
  const auto special = data::SpecialIds::for_vocab(kVocab);
  auto labels = torch::randint(5, kVocab - 1, {2, 10}, torch::kInt64);
  labels.select(1, 0).fill_(special.bos);
  auto padding = torch::zeros({2, 10}, torch::kBool);
  padding[1].narrow(0, 7, 3).fill_(true);
  labels[1].narrow(0, 7, 3).fill_(special.pad);
  auto masked = torch::zeros({2, 10}, torch::kBool);
  for (auto [b, t] : {std::pair{0, 2}, {0, 5}, {0, 9}, {1, 1}, {1, 4}}) masked[b][t] = true;
  data::Batch batch;
  batch.labels = labels;
  batch.input_ids = labels.masked_fill(masked, special.mask);
  batch.masked = masked;
  batch.padding = padding;
  batch.positions = torch::arange(10).repeat({2, 1});
  batch.real_tokens = 17;
  return ModelInputs::from(batch);
}

ElectraModel build(const config::ModelConfig& m, Architecture a = Architecture::kElectra) {
  torch::manual_seed(5);
  ElectraModel model(m, a);
  model->to(torch::kDouble);
  model->eval();
  return model;
}

std::set<std::string> names(const torch::nn::Module& module) {
  std::set<std::string> out;
  for (const auto& p : module.named_parameters()) out.insert(p.key());
  return out;
}

TEST(ModelInputs, MaskedIndexIsFlatAndAscending) {
  const auto in = tiny_inputs();
  EXPECT_TRUE(torch::equal(in.masked_index, torch::tensor({2, 5, 9, 11, 14}, torch::kInt64)));
}

// padded_masked: the real positions first, then the first position that is not masked.
TEST(ModelInputs, PaddedMaskedRepeatsTheFirstUnmaskedPositionAfterTheRealOnes) {
  const auto in = tiny_inputs();  // masked: 2, 5, 9, 11, 14
  const auto padded = in.padded_masked(8);
  EXPECT_TRUE(
      torch::equal(padded.masked_index, torch::tensor({2, 5, 9, 11, 14, 0, 0, 0}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(
      padded.masked_real, torch::tensor({1, 1, 1, 1, 1, 0, 0, 0}, torch::kInt64).to(torch::kBool)));
  EXPECT_TRUE(torch::equal(in.masked_index, torch::tensor({2, 5, 9, 11, 14}, torch::kInt64)));
  auto first_masked = in;
  first_masked.masked_index = torch::tensor({0, 1, 3}, torch::kInt64);
  EXPECT_TRUE(torch::equal(first_masked.padded_masked(5).masked_index,
                           torch::tensor({0, 1, 3, 2, 2}, torch::kInt64)));
  EXPECT_EQ(in.padded_masked(5).masked_real.sum().item<int64_t>(), 5);
  EXPECT_TRUE(contains_all(error_message([&] { in.padded_masked(4); }),
                           {"capacity of 4 masked positions", "20 positions with 5 masked"}));
  EXPECT_TRUE(contains_all(error_message([&] { in.padded_masked(21); }),
                           {"capacity of 21", "20 positions"}));
}

// The bound of data::mask_row's count, hand-computed and never exceeded by it.
TEST(ModelInputs, MaskedCapacityBoundsWhatMaskRowMasks) {
  EXPECT_EQ(masked_capacity(32, 512, 0.15), 32 * 77);  // floor(76.8) + 1
  EXPECT_EQ(masked_capacity(2, 10, 1.0), 20);          // never more than B x T
  EXPECT_EQ(masked_capacity(3, 16, 0.0), 3);
  const auto special = data::SpecialIds::for_vocab(kVocab);
  data::Rng rng(7);
  data::MaskOptions options;
  for (const double ratio : {0.15, 0.5, 0.99}) {
    options.ratio = ratio;
    for (int trial = 0; trial < 2000; ++trial) {
      const int64_t length = 1 + trial % 37;
      std::vector<int64_t> ids(static_cast<size_t>(length));
      for (auto& id : ids) id = 5 + static_cast<int64_t>(rng.below(kVocab - 6));
      ids[0] = special.bos;
      const auto masked = std::make_unique<bool[]>(static_cast<size_t>(length));
      data::mask_row(ids.data(), masked.get(), length, special, options, rng);
      const int64_t count = std::count(masked.get(), masked.get() + length, true);
      ASSERT_LE(count, masked_capacity(1, length, ratio)) << ratio << " " << length;
    }
  }
}

// The generator's rows padded to a capacity give the same terms, draws, discriminator input and
// gradients (float64): the filler rows are ignored and put their position's original back.
TEST(ElectraModel, PaddedMaskedRowsGiveTheSameTermsDrawsAndGradients) {
  for (const Architecture architecture : {Architecture::kElectra, Architecture::kMaskedLm}) {
    SCOPED_TRACE(architecture == Architecture::kElectra ? "electra" : "mlm");
    config::ObjectivesConfig objectives_config;
    if (architecture == Architecture::kMaskedLm) objectives_config.set = "mlm";
    const objectives::Objectives objectives(objectives_config);
    struct Run {
      ModelOutput out;
      std::vector<objectives::Term> terms;
      torch::Tensor loss;
      std::vector<torch::Tensor> grads;
    };
    auto run = [&](const ModelInputs& in) {
      auto model = build(tiny_config(), architecture);
      model->train();
      torch::manual_seed(3);  // the draws
      Run r;
      r.out = model->forward(in);
      r.terms = objectives.compute(r.out, data::Task::kMono);
      std::map<std::string, torch::Tensor> norms;
      for (const auto& t : r.terms) norms[t.name] = torch::tensor(7.0, torch::kDouble);
      r.loss = objectives::weighted_loss(r.terms, norms);
      r.loss.backward();
      for (const auto& p : model->parameters()) r.grads.push_back(p.grad().clone());
      return r;
    };
    const auto in = tiny_inputs();
    const Run plain = run(in);
    const Run padded = run(in.padded_masked(9));
    EXPECT_EQ(padded.out.generator_logits.size(0), 9);
    EXPECT_TRUE(torch::equal(padded.out.generator_targets.narrow(0, 5, 4),
                             torch::full({4}, kIgnoredTarget, torch::kInt64)));
    EXPECT_NEAR(padded.loss.item<double>(), plain.loss.item<double>(), 1e-12);
    ASSERT_EQ(padded.terms.size(), plain.terms.size());
    for (std::size_t i = 0; i < plain.terms.size(); ++i) {
      SCOPED_TRACE(plain.terms[i].name);
      EXPECT_EQ(padded.terms[i].count.item<int64_t>(), plain.terms[i].count.item<int64_t>());
      EXPECT_NEAR(padded.terms[i].loss_sum.item<double>(), plain.terms[i].loss_sum.item<double>(),
                  1e-12);
      for (const auto& [name, value] : plain.terms[i].statistics) {
        EXPECT_EQ(padded.terms[i].statistics.at(name).item<int64_t>(), value.item<int64_t>())
            << name;
      }
    }
    if (architecture == Architecture::kElectra) {
      EXPECT_TRUE(torch::equal(padded.out.sampled.narrow(0, 0, 5), plain.out.sampled));
      EXPECT_TRUE(torch::equal(padded.out.discriminator_input, plain.out.discriminator_input));
      EXPECT_TRUE(torch::equal(padded.out.replaced, plain.out.replaced));
    }
    ASSERT_EQ(padded.grads.size(), plain.grads.size());
    for (std::size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_TRUE(torch::allclose(padded.grads[i], plain.grads[i], 1e-12, 1e-14)) << i;
    }
  }
}

TEST(ElectraModel, ParameterNamesAreExportKeys) {
  const auto model = build(tiny_config());
  const auto all = names(*model);
  for (const char* key :
       {"embeddings.token.weight", "embeddings.position.weight",
        "discriminator.layers.0.attention.query.weight",
        "discriminator.layers.1.attention.relative_bias", "discriminator.layers.1.attention.gate_u",
        "discriminator.layers.1.attention.gate_w", "discriminator.layers.1.ffn.intermediate.weight",
        "discriminator.layers.0.ffn_norm.bias", "discriminator.embedding_norm.weight",
        "generator.layers.0.attention.output.bias", "generator_head.output_bias",
        "generator_head.dense.weight", "discriminator_head.output.weight"}) {
    EXPECT_TRUE(all.count(key)) << key;
  }
  EXPECT_FALSE(all.count("generator.layers.1.attention.query.weight"));  // 1 generator layer
}

TEST(ElectraModel, GeneratorHeadAtMaskedPositionsEqualsFullHeadThenGather) {
  auto model = build(tiny_config());
  const auto in = tiny_inputs();
  const auto out = model->forward(in);
  ASSERT_EQ(out.generator_logits.sizes(), (std::vector<int64_t>{5, kVocab}));
  const auto hidden = model->generator->forward(in.input_ids, in.positions, in.padding);
  const auto full = model->generator_head->forward(hidden.view({20, -1}),
                                                   model->embeddings->token->weight);  // [20, V]
  EXPECT_TRUE(
      torch::allclose(out.generator_logits, full.index_select(0, in.masked_index), 1e-12, 1e-12));
  EXPECT_TRUE(
      torch::equal(out.generator_targets, in.labels.view(-1).index_select(0, in.masked_index)));
}

TEST(ElectraModel, DiscriminatorInputAndLabels) {
  auto model = build(tiny_config());
  const auto in = tiny_inputs();
  const auto out = model->forward(in);
  const auto unmasked = torch::ones({20}, torch::kBool).index_fill(0, in.masked_index, false);
  // Outside the masked positions the discriminator sees the originals and nothing is replaced.
  EXPECT_TRUE(torch::equal(out.discriminator_input.view(-1).masked_select(unmasked),
                           in.labels.view(-1).masked_select(unmasked)));
  EXPECT_TRUE(
      torch::equal(out.discriminator_input.view(-1).index_select(0, in.masked_index), out.sampled));
  EXPECT_TRUE(torch::equal(out.replaced, out.discriminator_input != in.labels));
  EXPECT_EQ(out.discriminator_logits.sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(SampleReplacements, NeverSpecialAndFollowsTheSoftmax) {
  const auto special = data::SpecialIds::for_vocab(10);
  // Every special id has by far the highest logit; id 6 is the most likely ordinary id.
  auto logits = torch::zeros({20000, 10}, torch::kDouble);
  for (auto id : {special.bos, special.pad, special.eos, special.unk, special.mask}) {
    logits.select(1, id).fill_(50.0);
  }
  logits.select(1, 6).fill_(std::log(4.0));
  torch::manual_seed(1);
  const auto sampled = sample_replacements(logits, 1.0, special);
  for (auto id : {special.bos, special.pad, special.eos, special.unk, special.mask}) {
    EXPECT_EQ((sampled == id).sum().item<int64_t>(), 0) << "special id " << id;
  }
  // Ordinary ids 4..8: softmax over {1, 1, 4, 1, 1} -> P(6) = 0.5.
  EXPECT_NEAR((sampled == 6).to(torch::kDouble).mean().item<double>(), 0.5, 0.015);
  // Temperature 0.25 sharpens: P(6) = 4^4 / (4^4 + 4) = 0.985.
  const auto sharp = sample_replacements(logits, 0.25, special);
  EXPECT_NEAR((sharp == 6).to(torch::kDouble).mean().item<double>(), 256.0 / 260.0, 0.01);
}

// float32 logits whose special ids score so far above the rest (by 200) that every ordinary id's
// probability would underflow in a softmax over all ids: the draw is from the softmax over the
// ordinary ids alone, never a special id and never -1. Rows 1 and 3 are ordinary rows beside them.
TEST(SampleReplacements, OrdinaryIdsUnderflowingNextToASpecialIdAreStillDrawn) {
  const auto special = data::SpecialIds::for_vocab(10);
  auto logits = torch::zeros({4000, 10}, torch::kFloat32);
  auto rows = logits.view({1000, 4, 10});
  rows.select(1, 0).select(1, special.mask).fill_(200.0);
  rows.select(1, 2).select(1, special.unk).fill_(200.0);
  logits.select(1, 6).fill_(std::log(4.0f));
  torch::manual_seed(2);
  const auto sampled = sample_replacements(logits, 1.0, special);
  EXPECT_TRUE(sampled.ge(4).logical_and(sampled.le(8)).all().item<bool>());
  // Ordinary ids 4..8, softmax over {1, 1, 4, 1, 1}: P(6) = 0.5 in every kind of row.
  for (int64_t kind = 0; kind < 4; ++kind) {
    const auto of_kind = sampled.view({1000, 4}).select(1, kind);
    EXPECT_NEAR((of_kind == 6).to(torch::kDouble).mean().item<double>(), 0.5, 0.06) << kind;
  }
}

// Under bf16 autocast the generator head returns bf16 logits. The draws must still follow the
// softmax of those logits: sampling in bf16 (bf16 uniforms cap the Gumbel noise near 5.5, bf16
// sums tie and argmax takes the lowest id) gave a total-variation distance of 0.043 here (measured
// with the same draws in PyTorch).
TEST(SampleReplacements, FollowsTheSoftmaxOfBf16LogitsUnderAutocast) {
  constexpr int64_t kVocab = 64, kDraws = 200000;
  const auto special = data::SpecialIds::for_vocab(kVocab);
  // Logits spread over about [-5, 3]: the likely ids and a long tail of unlikely ones.
  const auto ids = torch::arange(kVocab, torch::kFloat32);
  const auto row = (2.0 * torch::sin(1.7 * ids) - 0.03 * ids).to(torch::kBFloat16);  // [V]
  const auto logits = row.expand({kDraws, kVocab});                                  // [N, V]
  torch::manual_seed(3);
  torch::Tensor sampled;
  {
    AutocastScope autocast(torch::kCPU, /*enabled=*/true);
    sampled = sample_replacements(logits, 1.0, special);
  }
  auto allowed = torch::ones({kVocab}, torch::kBool);
  for (auto id : {special.bos, special.pad, special.eos, special.unk, special.mask}) {
    allowed[id] = false;
  }
  const auto p = torch::softmax(row.to(torch::kDouble).masked_fill(allowed.logical_not(), -1e9), 0);
  const auto frequency = torch::bincount(sampled, {}, kVocab).to(torch::kDouble) / kDraws;
  // With correct draws the expected distance is ~0.005 (sampling noise of 2e5 draws over 59 ids).
  const double total_variation = 0.5 * (frequency - p).abs().sum().item<double>();
  EXPECT_LT(total_variation, 0.012);
}

TEST(ElectraModel, SampleEqualToOriginalIsLabelledOriginal) {
  auto model = build(tiny_config());
  const auto in = tiny_inputs();
  const auto originals = in.labels.view(-1).index_select(0, in.masked_index);
  // Make the generator certain of the first masked position's original token: its output bias
  // dominates, so every masked position samples it; there it is the original, elsewhere not.
  const int64_t favoured = originals[0].item<int64_t>();
  {
    torch::NoGradGuard no_grad;
    model->generator_head->output_bias.fill_(-1e3);
    model->generator_head->output_bias[favoured] = 1e3;
  }
  const auto out = model->forward(in);
  EXPECT_TRUE(torch::all(out.sampled == favoured).item<bool>());
  const auto hits = out.sampled == originals;
  EXPECT_GT(hits.sum().item<int64_t>(), 0);
  EXPECT_TRUE(
      torch::equal(out.replaced.view(-1).index_select(0, in.masked_index), hits.logical_not()));
}

// The discriminator's loss reaches neither the generator nor its head: the sampled tokens are
// integers drawn without gradient. With full sharing it does reach the shared embeddings.
TEST(ElectraModel, DiscriminatorLossSendsNoGradientIntoTheGenerator) {
  auto model = build(tiny_config());
  model->train();
  const auto out = model->forward(tiny_inputs());
  out.discriminator_logits.sum().backward();
  for (const auto& p : model->named_parameters()) {
    const bool generator_side = p.key().rfind("generator", 0) == 0;
    const bool has_grad =
        p.value().grad().defined() && p.value().grad().abs().sum().item<double>() > 0;
    if (generator_side) {
      EXPECT_FALSE(has_grad) << p.key();
    }
  }
  EXPECT_GT(model->embeddings->token->weight.grad().abs().sum().item<double>(), 0);
}

TEST(ElectraModel, GdesKeepsDiscriminatorGradientOffTheSharedEmbeddings) {
  auto m = tiny_config();
  m.embedding_sharing = config::EmbeddingSharing::kGdes;
  auto model = build(m);
  model->train();
  const auto in = tiny_inputs();
  auto out = model->forward(in);
  out.discriminator_logits.sum().backward();
  EXPECT_FALSE(model->embeddings->token->weight.grad().defined() &&
               model->embeddings->token->weight.grad().abs().sum().item<double>() > 0);
  EXPECT_GT(model->discriminator->token_delta.grad().abs().sum().item<double>(), 0);
  EXPECT_GT(model->discriminator->position_delta.grad().abs().sum().item<double>(), 0);
  // The generator's loss still trains the shared tables.
  model->zero_grad();
  out = model->forward(in);
  out.generator_logits.logsumexp(1).sum().backward();
  EXPECT_GT(model->embeddings->token->weight.grad().abs().sum().item<double>(), 0);
}

TEST(ElectraModel, MaskedLmBaselineHasNoGenerator) {
  auto model = build(tiny_config(), Architecture::kMaskedLm);
  const auto all = names(*model);
  for (const auto& n : all) {
    EXPECT_NE(n.rfind("generator", 0), 0u) << n;
    EXPECT_NE(n.rfind("discriminator_head", 0), 0u) << n;
  }
  EXPECT_TRUE(all.count("mlm_head.output_bias"));
  const auto in = tiny_inputs();
  const auto out = model->forward(in);
  EXPECT_EQ(out.generator_logits.sizes(), (std::vector<int64_t>{5, kVocab}));
  EXPECT_FALSE(out.discriminator_logits.defined());
  const auto hidden = model->discriminator->forward(in.input_ids, in.positions, in.padding);
  const auto full =
      model->mlm_head->forward(hidden.view({20, -1}), model->embeddings->token->weight);
  EXPECT_TRUE(
      torch::allclose(out.generator_logits, full.index_select(0, in.masked_index), 1e-12, 1e-12));
}

TEST(Encoder, HiddenStatesAreEachLayersOutputAndStopEarly) {
  for (const auto& [norm, value] : config::kNorms.names) {
    auto m = tiny_config();
    m.norm = value;
    auto model = build(m);
    model->eval();
    const auto in = tiny_inputs();
    torch::NoGradGuard no_grad;
    auto full = model->discriminator->forward(in.input_ids, in.positions, in.padding);
    auto states = model->discriminator->hidden_states(in.input_ids, in.positions, in.padding);
    ASSERT_EQ(states.size(), 3u);
    EXPECT_TRUE(torch::equal(states.back(), full)) << norm;
    // Layer 1 by hand from the embedding output; a run that stops at layer 1 agrees.
    auto first = model->discriminator->layers->ptr<EncoderLayerImpl>(0);
    BucketCache buckets(8, 16);
    auto table = toeplitz_bias(first->attention->relative_bias, buckets.get(10, torch::kCPU));
    auto layer1 = first->forward(states[0], in.padding, table);
    EXPECT_TRUE(torch::allclose(states[1], layer1, 1e-6, 1e-6));
    auto partial = model->discriminator->hidden_states(in.input_ids, in.positions, in.padding, 1);
    ASSERT_EQ(partial.size(), 2u);
    EXPECT_TRUE(torch::equal(partial[1], states[1]));
  }
  auto model = build(tiny_config());
  const auto in = tiny_inputs();
  EXPECT_TRUE(testing::contains_all(testing::error_message([&] {
                                      model->discriminator->hidden_states(
                                          in.input_ids, in.positions, in.padding, 3);
                                    }),
                                    {"layer 3 requested", "the encoder has 2 layers"}));
}

TEST(ElectraModel, RejectsUnresolvedVocabulary) {
  auto m = tiny_config();
  m.vocab_size = 0;
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { ElectraModel model(m, Architecture::kElectra); }),
      {"model.vocab_size is 0", "data.tokenizer"}));
  EXPECT_TRUE(testing::contains_all(testing::error_message([] { architecture_for("bert"); }),
                                    {"'bert'", "xlme, xlme-mono, mlm, mlm+tlm"}));
}

// --- Ablation switches: each changes the computation, and nothing else ------------------------

// Copies every parameter `to` shares (same name and shape) with `from`.
void copy_shared(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.named_parameters();
  for (auto& p : to.named_parameters()) {
    if (const auto* s = source.find(p.key()); s && s->sizes() == p.value().sizes()) {
      p.value().copy_(*s);
    }
  }
}

torch::Tensor discriminator_output(ElectraModel& model) {
  const auto in = tiny_inputs();
  return model->discriminator->forward(in.input_ids, in.positions, in.padding);
}

struct Switch {
  std::string name;
  std::function<void(config::ModelConfig&)> apply;
  std::set<std::string> removed, added;  // parameter names (discriminator, layer 0 and shared)
};

TEST(Ablations, EachSwitchChangesTheOutputAndOnlyItsParameters) {
  const std::vector<Switch> switches = {
      {"gate off",
       [](auto& m) { m.relative_position.gated = false; },
       {"discriminator.layers.0.attention.gate_u", "discriminator.layers.0.attention.gate_v",
        "discriminator.layers.0.attention.gate_w"},
       {}},
      {"relative bias off",
       [](auto& m) { m.relative_position.enabled = false; },
       {"discriminator.layers.0.attention.relative_bias", "discriminator.layers.0.attention.gate_u",
        "discriminator.layers.0.attention.gate_v", "discriminator.layers.0.attention.gate_w"},
       {}},
      {"shared table",
       [](auto& m) { m.relative_position.shared_across_layers = true; },
       {"discriminator.layers.0.attention.relative_bias"},
       {"discriminator.relative_bias"}},
      {"pre-LN",
       [](auto& m) { m.norm = config::Norm::kPre; },
       {},
       {"discriminator.final_norm.weight"}},
      {"no absolute positions",
       [](auto& m) { m.absolute_positions = false; },
       {"embeddings.position.weight"},
       {}},
      {"factorized embeddings",
       [](auto& m) { m.embedding_size = 8; },
       {},
       {"discriminator.embedding_projection.weight"}},
  };
  const auto base_config = tiny_config();
  auto base = build(base_config);
  const auto base_names = names(*base);
  const auto base_out = discriminator_output(base);
  for (const auto& s : switches) {
    auto m = base_config;
    s.apply(m);
    auto model = build(m);
    copy_shared(*base, *model);
    const auto switched = names(*model);
    for (const auto& n : s.removed) {
      EXPECT_TRUE(base_names.count(n) && !switched.count(n)) << s.name << ": " << n;
    }
    for (const auto& n : s.added) {
      EXPECT_TRUE(!base_names.count(n) && switched.count(n)) << s.name << ": " << n;
    }
    // Nothing else: the counts differ exactly by what the switch removes or adds.
    EXPECT_EQ(total_count(parameter_counts(*model)),
              total_count(analytic_parameter_counts(m, Architecture::kElectra)))
        << s.name;
    EXPECT_FALSE(torch::allclose(discriminator_output(model), base_out, 1e-6, 1e-6)) << s.name;
  }
}

// Where a switch has a neutral setting of its parameters, the two models agree exactly: the
// switch changes that computation and nothing else.
TEST(Ablations, NeutralParametersReproduceTheSwitchedOffModel) {
  auto m = tiny_config();
  auto gated = build(m);
  const auto gated_out = discriminator_output(gated);
  m.relative_position.gated = false;
  auto plain = build(m);
  copy_shared(*gated, *plain);
  {
    // u = v = 0 gives g_update = g_reset = 1/2; w = -2 makes the factor 1 + 1/2 - 1/2 = 1.
    torch::NoGradGuard no_grad;
    for (auto& p : gated->named_parameters()) {
      if (p.key().find("gate_u") != std::string::npos ||
          p.key().find("gate_v") != std::string::npos)
        p.value().zero_();
      if (p.key().find("gate_w") != std::string::npos) p.value().fill_(-2.0);
    }
  }
  EXPECT_FALSE(torch::allclose(gated_out, discriminator_output(plain), 1e-6, 1e-6));
  EXPECT_TRUE(
      torch::allclose(discriminator_output(gated), discriminator_output(plain), 1e-12, 1e-12));

  m.relative_position.enabled = false;
  auto absolute_only = build(m);
  copy_shared(*plain, *absolute_only);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : plain->named_parameters()) {
      if (p.key().find("relative_bias") != std::string::npos) p.value().zero_();
    }
  }
  EXPECT_TRUE(torch::allclose(discriminator_output(plain), discriminator_output(absolute_only),
                              1e-12, 1e-12));

  // A table shared across layers equals per-layer tables that are all the same.
  auto per_layer_config = tiny_config();
  auto shared_config = per_layer_config;
  shared_config.relative_position.shared_across_layers = true;
  auto per_layer = build(per_layer_config);
  auto shared = build(shared_config);
  copy_shared(*per_layer, *shared);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : per_layer->named_parameters()) {
      if (p.key().rfind("discriminator.layers.", 0) == 0 &&
          p.key().find("relative_bias") != std::string::npos) {
        p.value().copy_(shared->discriminator->relative_bias);
      }
    }
  }
  EXPECT_TRUE(
      torch::allclose(discriminator_output(per_layer), discriminator_output(shared), 1e-12, 1e-12));
}

// One training step through the objectives reaches every parameter (gradients finite, non-zero).
TEST(ElectraModel, FullStepTrainsEveryParameter) {
  auto m = tiny_config();
  m.dropout = 0.1;
  m.attention_dropout = 0.1;
  auto model = build(m);
  model->train();
  config::ObjectivesConfig objectives_config;
  const objectives::Objectives objectives(objectives_config);
  const auto out = model->forward(tiny_inputs());
  const auto terms = objectives.compute(out, data::Task::kMono);
  std::map<std::string, torch::Tensor> norms;
  for (const auto& t : terms) norms[t.name] = t.count;
  objectives::weighted_loss(terms, norms).backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0) << p.key();
  }
}

}  // namespace
}  // namespace xlme::model
