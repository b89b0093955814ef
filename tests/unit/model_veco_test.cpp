// objectives.set=veco (VECO's cross-attention MLM): the split of a micro-batch into its two sides,
// an encoder with cross-attention modules that equals the plain encoder when nothing is plugged
// in, the four terms against a hand computation, gradients that reach the cross-attention only
// through the cross-attended terms, a tiny run whose terms fall, parameter counts and FLOPs by
// hand, the config errors, and plug-out / plug-in loading.
#include "xlme/checkpoint/pretrained.h"
#include "xlme/data/pair_sides.h"
#include "xlme/data/synthetic.h"
#include "xlme/finetune/model.h"
#include "xlme/model/cross_attention.h"
#include "xlme/model/electra.h"
#include "xlme/model/parameter_count.h"
#include "xlme/objectives/objectives.h"
#include "xlme/train/distill.h"
#include "xlme/train/performance.h"
#include "xlme/train/trainer.h"

#include "export_fixtures.h"
#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

namespace xlme {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::single_process;
using xlme::testing::TempDir;

const data::SpecialIds kIds = data::SpecialIds::for_vocab(20);  // <mask> = 19

// A host batch of `rows` (labels, padded with <pad>), with <mask> at the (row, position) pairs
// of `masked`.
data::Batch batch_of(data::Task task, const std::vector<std::vector<int64_t>>& rows,
                     const std::set<std::pair<int64_t, int64_t>>& masked) {
  int64_t length = 0;
  for (const auto& row : rows) length = std::max(length, static_cast<int64_t>(row.size()));
  const auto count = static_cast<int64_t>(rows.size());
  data::Batch b;
  b.task = task;
  b.labels = torch::full({count, length}, kIds.pad, torch::kInt64);
  b.padding = torch::ones({count, length}, torch::kBool);
  b.masked = torch::zeros({count, length}, torch::kBool);
  b.positions = torch::arange(length).repeat({count, 1});
  for (int64_t r = 0; r < count; ++r) {
    for (size_t t = 0; t < rows[static_cast<size_t>(r)].size(); ++t) {
      b.labels[r][static_cast<int64_t>(t)] = rows[static_cast<size_t>(r)][t];
      b.padding[r][static_cast<int64_t>(t)] = false;
      ++b.real_tokens;
    }
  }
  for (const auto& [r, t] : masked) b.masked[r][t] = true;
  b.input_ids = b.labels.masked_fill(b.masked, kIds.mask);
  return b;
}

torch::Tensor ids(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<torch::Tensor> out;
  for (const auto& row : rows) out.push_back(torch::tensor(row, torch::kInt64));
  return torch::stack(out);
}

TEST(SplitPair, TranslationPairsSplitAtTheFirstEos) {
  // <s> e </s> f </s>, the second row padded; masked: e's 5, f's 8, f's 11.
  const auto batch = batch_of(data::Task::kPara, {{0, 5, 6, 2, 7, 8, 9, 2}, {0, 10, 2, 11, 2}},
                              {{0, 1}, {0, 5}, {1, 3}});
  const auto sides = data::split_pair(batch, kIds);
  const auto& x = sides.x;
  const auto& y = sides.y;
  EXPECT_TRUE(torch::equal(x.labels, ids({{0, 5, 6, 2}, {0, 10, 2, 1}})));
  EXPECT_TRUE(torch::equal(x.input_ids, ids({{0, 19, 6, 2}, {0, 10, 2, 1}})));
  EXPECT_TRUE(torch::equal(y.labels, ids({{0, 7, 8, 9, 2}, {0, 11, 2, 1, 1}})));
  EXPECT_TRUE(torch::equal(y.input_ids, ids({{0, 7, 19, 9, 2}, {0, 19, 2, 1, 1}})));
  EXPECT_TRUE(torch::equal(x.padding, ids({{0, 0, 0, 0}, {0, 0, 0, 1}}).to(torch::kBool)));
  EXPECT_TRUE(torch::equal(y.padding, ids({{0, 0, 0, 0, 0}, {0, 0, 0, 1, 1}}).to(torch::kBool)));
  EXPECT_TRUE(torch::equal(x.masked, ids({{0, 1, 0, 0}, {0, 0, 0, 0}}).to(torch::kBool)));
  EXPECT_TRUE(torch::equal(y.masked, ids({{0, 0, 1, 0, 0}, {0, 1, 0, 0, 0}}).to(torch::kBool)));
  // Each side's positions start at 0.
  EXPECT_TRUE(torch::equal(y.positions[0], torch::arange(5)));
  EXPECT_EQ(x.real_tokens, 7);
  EXPECT_EQ(y.real_tokens, 8);
  EXPECT_EQ(x.task, data::Task::kPara);
  // XLM-R's sentence-pair framing <s> a </s></s> b </s> (fine-tuning) splits the same way.
  const auto xlmr = data::split_pair(batch_of(data::Task::kPara, {{0, 5, 2, 2, 6, 2}}, {}), kIds);
  EXPECT_TRUE(torch::equal(xlmr.x.labels, ids({{0, 5, 2}})));
  EXPECT_TRUE(torch::equal(xlmr.y.labels, ids({{0, 6, 2}})));
}

TEST(SplitPair, MonolingualSentencePairsSplitBetweenTheTwoSentences) {
  // <s> a </s> b </s> of two adjacent sentences: a = 5 6 7 (its 7 masked), b = 8 9.
  const auto batch =
      batch_of(data::Task::kMono, {{0, 5, 6, 7, 2, 8, 9, 2}, {0, 5, 2, 6, 2}}, {{0, 3}});
  const auto sides = data::split_pair(batch, kIds);
  EXPECT_TRUE(torch::equal(sides.x.labels, ids({{0, 5, 6, 7, 2}, {0, 5, 2, 1, 1}})));
  EXPECT_TRUE(torch::equal(sides.x.input_ids, ids({{0, 5, 6, 19, 2}, {0, 5, 2, 1, 1}})));
  EXPECT_TRUE(torch::equal(sides.y.labels, ids({{0, 8, 9, 2}, {0, 6, 2, 1}})));
  EXPECT_EQ(sides.x.masked.sum().item<int64_t>(), 1);
  EXPECT_EQ(sides.y.masked.sum().item<int64_t>(), 0);
  EXPECT_EQ(sides.x.task, data::Task::kMono);
}

TEST(SplitPair, RefusesRowsThatAreNotFramed) {
  EXPECT_TRUE(contains_all(
      error_message([] {
        data::split_pair(batch_of(data::Task::kMono, {{5, 6, 2}}, {}), kIds);
      }),
      {"VECO splits framed sequences <s> ... </s>", "row 0", "monolingual", "first id 5"}));
  EXPECT_TRUE(
      contains_all(error_message([] {
                     data::split_pair(batch_of(data::Task::kPara, {{0, 5, 6, 2}}, {}), kIds);
                   }),
                   {"row 0 of a translation-pair micro-batch has no </s> between its two sides"}));
  // A packed monolingual sequence has no sentence boundary: VECO needs the reader's pairs.
  EXPECT_TRUE(contains_all(
      error_message([] {
        data::split_pair(batch_of(data::Task::kMono, {{0, 5, 6, 2}, {0, 5, 6, 7, 8, 2}}, {}), kIds);
      }),
      {"row 0 of a monolingual micro-batch has no </s> between its two sides",
       "two adjacent sentences of one document", "objectives.set=veco"}));
}

// The tiny VECO config: one encoder with cross-attention and an MLM head.
config::Config veco_config(bool relative_bias = true) {
  auto c = xlme::testing::tiny_train_config(4, 1, 0.0);
  c.objectives.set = "veco";
  c.model.cross_attention = true;
  c.model.layers = 2;
  c.model.relative_position.enabled = relative_bias;
  return c;
}

// Copies every weight of `from` that `to` has (by name).
void copy_shared_weights(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.named_parameters();
  for (auto& p : to.named_parameters()) {
    ASSERT_TRUE(source.contains(p.key())) << p.key();
    p.value().copy_(source[p.key()]);
  }
}

TEST(VecoModel, CrossAttentionUnpluggedIsThePlainEncoder) {
  auto c = veco_config();
  torch::manual_seed(1);
  model::ElectraModel with(c.model, model::Architecture::kMaskedLm);
  auto plain_config = c.model;
  plain_config.cross_attention = false;
  model::ElectraModel plain(plain_config, model::Architecture::kMaskedLm);
  copy_shared_weights(*with, *plain);
  // The cross-attention modules exist, one per layer, and nothing else differs.
  EXPECT_EQ(with->named_parameters().size(), plain->named_parameters().size() + 2 * (8 + 2));
  EXPECT_TRUE(
      with->named_parameters().contains("discriminator.layers.1.cross_attention.key.weight"));
  EXPECT_TRUE(
      with->named_parameters().contains("discriminator.layers.0.cross_attention_norm.bias"));
  with->eval();
  plain->eval();
  const auto input = torch::randint(4, 60, {2, 12}, torch::kInt64);
  const auto positions = torch::arange(12).repeat({2, 1});
  auto padding = torch::zeros({2, 12}, torch::kBool);
  padding[1].narrow(0, 9, 3).fill_(true);
  const auto a = with->discriminator->hidden_states(input, positions, padding);
  const auto b = plain->discriminator->hidden_states(input, positions, padding);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "state " << i;
}

// Naive cross-attention in double: per head, softmax over the real context tokens of
// q_i . k_j / sqrt(d), by explicit exponentials.
torch::Tensor naive_cross_attention(model::CrossAttentionImpl& m, const torch::Tensor& s,
                                    const torch::Tensor& context, const torch::Tensor& padding) {
  const int64_t batch = s.size(0), length = s.size(1), others = context.size(1);
  const int64_t heads = m.args().heads, d = m.args().hidden_size / heads;
  const auto q = torch::nn::functional::linear(s, m.query->weight, m.query->bias);
  const auto k = torch::nn::functional::linear(context, m.key->weight, m.key->bias);
  const auto v = torch::nn::functional::linear(context, m.value->weight, m.value->bias);
  auto out = torch::zeros_like(q);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < length; ++i) {
        const auto qi = q[b][i].narrow(0, h * d, d);
        std::vector<torch::Tensor> weights;
        torch::Tensor z = torch::zeros({}, q.options());
        for (int64_t j = 0; j < others; ++j) {
          if (padding[b][j].item<bool>()) {
            weights.push_back(torch::zeros({}, q.options()));
            continue;
          }
          weights.push_back(torch::exp((qi * k[b][j].narrow(0, h * d, d)).sum() / std::sqrt(d)));
          z = z + weights.back();
        }
        auto mixed = torch::zeros({d}, q.options());
        for (int64_t j = 0; j < others; ++j) {
          mixed = mixed + weights[static_cast<size_t>(j)] / z * v[b][j].narrow(0, h * d, d);
        }
        out[b][i].narrow(0, h * d, d).copy_(mixed);
      }
    }
  }
  return torch::nn::functional::linear(out, m.output->weight, m.output->bias);
}

// The encoder by hand (post-LN, no relative bias): each layer self-attention, then, with
// `context`, the naive cross-attention on the self-attention's output, then the FFN.
torch::Tensor encode_by_hand(model::EncoderImpl& encoder, const data::Batch& side,
                             const torch::Tensor& context = {},
                             const torch::Tensor& context_padding = {}) {
  auto x = encoder.embedding_norm(encoder.embed(side.input_ids, side.positions));
  for (int64_t l = 0; l < encoder.args().layers; ++l) {
    auto& layer = encoder.layer(l);
    auto s = layer.attention_norm(x + layer.attention(x, side.padding, torch::Tensor()));
    if (context.defined()) {
      s = layer.cross_attention_norm(
          s + naive_cross_attention(*layer.cross_attention, s, context, context_padding));
    }
    x = layer.ffn_norm(s + layer.ffn(s));
  }
  return x;
}

// Cross-entropy summed over the masked positions of `side`, by log-softmax of each row.
double masked_cross_entropy(model::ElectraModelImpl& m, const torch::Tensor& hidden,
                            const data::Batch& side) {
  double total = 0;
  for (int64_t b = 0; b < side.labels.size(0); ++b) {
    for (int64_t t = 0; t < side.labels.size(1); ++t) {
      if (!side.masked[b][t].item<bool>()) continue;
      const auto logits =
          m.mlm_head(hidden[b][t].unsqueeze(0), m.embeddings->token->weight).squeeze(0);
      const auto z = torch::logsumexp(logits, 0).item<double>();
      total += z - logits[side.labels[b][t].item<int64_t>()].item<double>();
    }
  }
  return total;
}

TEST(VecoLoss, FourTermsEqualAHandComputation) {
  auto c = veco_config(/*relative_bias=*/false);
  torch::manual_seed(2);
  auto m = train::build_model(c);
  m->to(torch::kFloat64);
  m->eval();
  data::SyntheticBatches source(data::SpecialIds::for_vocab(64), 3, 16, 0.3, 5);
  source.set_sentence_pairs(true);
  const objectives::Objectives objectives(c.objectives);
  for (const auto task : {data::Task::kMono, data::Task::kPara}) {
    const auto batch = source.next(task);
    const auto terms = objectives.compute(m->forward(m->inputs(batch)), task);
    const auto names = objectives.term_names(task);
    ASSERT_EQ(terms.size(), 4u);
    const auto sides = data::split_pair(batch, m->special_ids());
    torch::NoGradGuard no_grad;
    auto& encoder = *m->discriminator;
    const auto hx = encode_by_hand(encoder, sides.x);
    const auto hy = encode_by_hand(encoder, sides.y);
    const auto cx = encode_by_hand(encoder, sides.x, hy, sides.y.padding);
    const auto cy = encode_by_hand(encoder, sides.y, hx, sides.x.padding);
    const double expected[] = {
        masked_cross_entropy(*m, hx, sides.x), masked_cross_entropy(*m, cx, sides.x),
        masked_cross_entropy(*m, hy, sides.y), masked_cross_entropy(*m, cy, sides.y)};
    const int64_t counts[] = {
        sides.x.masked.sum().item<int64_t>(), sides.x.masked.sum().item<int64_t>(),
        sides.y.masked.sum().item<int64_t>(), sides.y.masked.sum().item<int64_t>()};
    const auto batch_counts = objectives.counts(batch);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(terms[i].name, names[i]);
      EXPECT_NEAR(terms[i].loss_sum.item<double>(), expected[i], 1e-9) << names[i];
      EXPECT_GT(expected[i], 0) << names[i];
      EXPECT_EQ(terms[i].count.item<int64_t>(), counts[i]) << names[i];
      EXPECT_EQ(terms[i].weight, 1.0);
    }
    // counts() gives the same numbers from the host batch, before any forward pass, in the
    // order of term_names(): the monolingual terms, then the pair terms.
    const size_t offset = task == data::Task::kMono ? 0 : 4;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(batch_counts[offset + i], static_cast<double>(counts[i])) << names[i];
      EXPECT_EQ(batch_counts[4 - offset + i], 0.0);
    }
  }
  EXPECT_EQ(objectives.term_names(data::Task::kMono),
            (std::vector<std::string>{"mlm_x", "mlm_xy", "mlm_y", "mlm_yx"}));
  EXPECT_EQ(objectives.term_names(data::Task::kPara),
            (std::vector<std::string>{"tlm_x", "tlm_xy", "tlm_y", "tlm_yx"}));
}

TEST(VecoGradient, ReachesTheCrossAttentionOnlyThroughTheCrossAttendedTerms) {
  auto c = veco_config();
  torch::manual_seed(3);
  auto m = train::build_model(c);
  data::SyntheticBatches source(data::SpecialIds::for_vocab(64), 3, 16, 0.3, 6);
  const auto batch = source.next(data::Task::kPara);
  const objectives::Objectives objectives(c.objectives);
  auto gradient_norms = [&](const std::set<std::string>& used) {
    m->zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (const auto& term : objectives.compute(m->forward(m->inputs(batch)), batch.task)) {
      if (used.count(term.name)) loss = loss + term.loss_sum;
    }
    loss.backward();
    double cross = 0, self = 0;
    for (const auto& p : m->named_parameters()) {
      if (!p.value().grad().defined()) continue;
      const double norm = p.value().grad().norm().item<double>();
      if (p.key().find(".cross_attention") != std::string::npos) cross += norm;
      if (p.key().find(".attention.") != std::string::npos) self += norm;
    }
    return std::pair(cross, self);
  };
  const auto [cross_plain, self_plain] = gradient_norms({"tlm_x", "tlm_y"});
  EXPECT_EQ(cross_plain, 0.0);
  EXPECT_GT(self_plain, 0.0);
  const auto [cross_attended, self_attended] = gradient_norms({"tlm_xy", "tlm_yx"});
  EXPECT_GT(cross_attended, 0.0);
  EXPECT_GT(self_attended, 0.0);  // the self-attention is shared by both passes
}

TEST(VecoTraining, AllFourTermsOfBothTasksFall) {
  auto c = veco_config();
  c.train.lr = 1e-2;
  c.train.steps = 40;
  xlme::testing::RepeatingBatches source(data::SpecialIds::for_vocab(64), 4, 16, 0.3, 12);
  source.set_sentence_pairs(true);
  torch::manual_seed(4);
  train::Trainer trainer(c, train::build_model(c), source, single_process());
  const auto first = trainer.train_step();
  train::StepRecord last;
  for (int i = 1; i < 40; ++i) last = trainer.train_step();
  for (const char* term :
       {"mlm_x", "mlm_xy", "mlm_y", "mlm_yx", "tlm_x", "tlm_xy", "tlm_y", "tlm_yx"}) {
    EXPECT_LT(last.terms.at(term).at("loss"), 0.7 * first.terms.at(term).at("loss")) << term;
    std::cout << "[ veco     ] " << term << " " << first.terms.at(term).at("loss") << " at step 1, "
              << last.terms.at(term).at("loss") << " at step 40" << std::endl;
  }
  // The step's FLOPs: each micro-batch at its own length.
  EXPECT_DOUBLE_EQ(first.flops, static_cast<double>(first.tokens) *
                                    train::training_flops_per_token(c, 16, nullptr));
}

TEST(VecoCounts, AnalyticCountsEqualTheModulesWithEverySharing) {
  for (const auto& [sharing, value] : config::kLayerSharings.names) {
    auto c = veco_config();
    c.model.share_layers = value;
    model::ElectraModel m(c.model, model::Architecture::kMaskedLm);
    const auto built = model::parameter_counts(*m);
    const auto analytic = model::analytic_parameter_counts(c.model, model::Architecture::kMaskedLm);
    ASSERT_EQ(built.size(), analytic.size()) << sharing;
    for (size_t i = 0; i < built.size(); ++i) {
      EXPECT_EQ(built[i].module, analytic[i].module) << sharing;
      EXPECT_EQ(built[i].count, analytic[i].count) << sharing << ": " << built[i].module;
    }
  }
  // By hand: 32 wide, 2 layers: q, k, v, output (4 x (32 x 32 + 32)) and a LayerNorm (64) each.
  auto c = veco_config();
  auto plain = c.model;
  plain.cross_attention = false;
  const auto with = model::analytic_parameter_counts(c.model, model::Architecture::kMaskedLm);
  const auto without = model::analytic_parameter_counts(plain, model::Architecture::kMaskedLm);
  EXPECT_EQ(model::count_of(with, "discriminator") - model::count_of(without, "discriminator"),
            2 * (4 * (32 * 32 + 32) + 2 * 32));
}

TEST(VecoFlops, PerTokenByHand) {
  auto c = veco_config();
  // Per token of a micro-batch of length 16, each side ~8 tokens long: the encoder twice (2
  // layers of 8h^2 + 4hf + 4 * 8 * h), the cross-attention (8h^2 + 4 * 8 * h per layer) and the
  // MLM head twice at the masked 15% (2 * (h * h + h * V)), forward and backward (x 3).
  const double h = 32, f = 64, v = 64, layers = 2, side = 8, r = c.objectives.mask_ratio;
  const double layer = 8 * h * h + 4 * h * f + 4 * side * h;
  const double cross = 8 * h * h + 4 * side * h;
  const double head = r * 2 * (h * h + h * v);
  EXPECT_DOUBLE_EQ(train::training_flops_per_token(c, 16, nullptr),
                   3 * (2 * layers * layer + layers * cross + 2 * head));
}

TEST(VecoConfig, ErrorsNameBothKeys) {
  EXPECT_TRUE(contains_all(error_message([] { config::load_config("", {"objectives.set=veco"}); }),
                           {"objectives.set=veco", "model.cross_attention", "is false",
                            "set model.cross_attention=true"}));
  EXPECT_TRUE(contains_all(
      error_message([] { config::load_config("", {"model.cross_attention=true"}); }),
      {"model.cross_attention=true", "objectives.set is xlme", "--set objectives.set=veco"}));
  EXPECT_NO_THROW(config::load_config("", {"objectives.set=veco", "model.cross_attention=true"}));
}

// A VECO checkpoint loads plug-out by default (the self-attention stack, like any
// discriminator) and plug-in on request; other checkpoints refuse plug-in.
TEST(VecoPretrained, PlugOutByDefaultPlugInOnRequest) {
  TempDir dir;
  auto c = veco_config();
  c.train.steps = 2;
  const auto veco = xlme::testing::make_tiny_checkpoint(c, (dir.path() / "veco").string());
  const auto out = checkpoint::load_pretrained(veco.path);
  EXPECT_EQ(out.objective_set, "veco");
  EXPECT_FALSE(out.model.cross_attention);
  for (const auto& p : out.discriminator->named_parameters()) {
    EXPECT_EQ(p.key().find("cross_attention"), std::string::npos) << p.key();
  }
  checkpoint::PretrainedOptions plug_in;
  plug_in.cross_attention = true;
  const auto in = checkpoint::load_pretrained(veco.path, plug_in);
  EXPECT_TRUE(in.model.cross_attention);
  const auto trained = veco.model->named_parameters();
  int64_t cross = 0;
  for (const auto& p : in.discriminator->named_parameters()) {
    ASSERT_TRUE(trained.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), trained[p.key()])) << p.key();
    cross += p.key().find("cross_attention") != std::string::npos;
  }
  EXPECT_EQ(cross, 2 * (8 + 2));
  auto plain_config = xlme::testing::tiny_train_config(4, 1, 0.0);
  plain_config.train.steps = 2;
  const auto plain =
      xlme::testing::make_tiny_checkpoint(plain_config, (dir.path() / "plain").string());
  EXPECT_TRUE(contains_all(error_message([&] { checkpoint::load_pretrained(plain.path, plug_in); }),
                           {plain.path, "has no cross-attention", "objectives.set=xlme",
                            "finetune.cross_attention=plug-out"}));
}

// Plug-in fine-tuning of a sentence pair: each side with cross-attention to the other's last
// hidden states, the head on the mean of both sides' <s>.
TEST(VecoFinetune, PlugInRunsEachSideAgainstTheOther) {
  auto c = veco_config();
  torch::manual_seed(5);
  model::DiscriminatorModel backbone(c.model, /*with_head=*/false);
  finetune::FinetuneModel m(backbone->embeddings, backbone->discriminator,
                            finetune::HeadKind::kSequence, 3, 0.0);
  m->eval();
  ASSERT_TRUE(m->plugs_in());
  // <s> a </s></s> b </s>, as featurize_pairs frames a pair.
  const auto input = ids({{0, 5, 6, 2, 2, 7, 8, 9, 2}, {0, 10, 2, 2, 11, 2, 1, 1, 1}});
  const auto padding = input.eq(1);
  const auto positions = torch::arange(9).repeat({2, 1});
  const auto logits = m->forward(input, positions, padding);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 3}));
  // What fine-tuning calls: the host batch split before it moves to the device.
  EXPECT_TRUE(torch::equal(m->forward_host(input, positions, padding, torch::kCPU), logits));
  data::Batch pair;
  pair.task = data::Task::kPara;
  pair.input_ids = pair.labels = input;
  pair.padding = padding;
  pair.positions = positions;
  pair.masked = torch::zeros_like(padding);
  const auto sides = data::split_pair(pair, kIds);
  torch::NoGradGuard no_grad;
  auto& e = *m->encoder;
  const auto& x = sides.x;
  const auto& y = sides.y;
  const auto hx = e.forward(x.input_ids, x.positions, x.padding);
  const auto hy = e.forward(y.input_ids, y.positions, y.padding);
  const auto cx = e.forward_with_context(x.input_ids, x.positions, x.padding, hy, y.padding);
  const auto cy = e.forward_with_context(y.input_ids, y.positions, y.padding, hx, x.padding);
  const auto first = ((cx.select(1, 0) + cy.select(1, 0)) / 2).unsqueeze(1);
  EXPECT_TRUE(torch::allclose(logits, m->sequence_head->forward(first), 1e-5, 1e-6));
  // The context matters: against itself instead of the other side the answer differs.
  EXPECT_FALSE(torch::allclose(
      cx, e.forward_with_context(x.input_ids, x.positions, x.padding, hx, x.padding), 1e-4, 1e-5));
}

}  // namespace
}  // namespace xlme
