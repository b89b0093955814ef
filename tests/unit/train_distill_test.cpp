// objectives.set=distill (MiniLMv2): the relation loss against explicit loops, zero loss for a
// student that is the teacher, a frozen teacher that gets no gradient and no optimizer slot, a
// student whose loss falls, the FLOPs of a step by hand, and the config errors.
#include "xlme/checkpoint/pretrained.h"
#include "xlme/data/synthetic.h"
#include "xlme/model/discriminator.h"
#include "xlme/objectives/objectives.h"
#include "xlme/train/distill.h"
#include "xlme/train/performance.h"
#include "xlme/train/trainer.h"

#include "export_fixtures.h"
#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::single_process;
using xlme::testing::TempDir;

// The naive relation loss: explicit loops in double over batch, relation heads, real queries and
// real keys; the sum over real queries of KL(teacher || student), divided by the relation heads.
double naive_relation_kl_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                             const torch::Tensor& padding, int64_t heads) {
  const auto s = student.to(torch::kFloat64).contiguous();
  const auto t = teacher.to(torch::kFloat64).contiguous();
  const auto pad = padding.contiguous();
  const int64_t batch = s.size(0), length = s.size(1);
  // softmax over the real keys of (a_i . a_j) / sqrt(d) for relation head r.
  auto relation = [&](const torch::Tensor& a, int64_t b, int64_t r, int64_t i) {
    const int64_t d = a.size(2) / heads;
    const auto acc = a.accessor<double, 3>();
    std::vector<double> scores(static_cast<size_t>(length), 0.0);
    double max = -1e300;
    for (int64_t j = 0; j < length; ++j) {
      if (pad[b][j].item<bool>()) continue;
      double dot = 0;
      for (int64_t k = 0; k < d; ++k) dot += acc[b][i][r * d + k] * acc[b][j][r * d + k];
      scores[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(d));
      max = std::max(max, scores[static_cast<size_t>(j)]);
    }
    double z = 0;
    for (int64_t j = 0; j < length; ++j) {
      if (!pad[b][j].item<bool>()) z += std::exp(scores[static_cast<size_t>(j)] - max);
    }
    std::vector<double> p(static_cast<size_t>(length), 0.0);
    for (int64_t j = 0; j < length; ++j) {
      if (!pad[b][j].item<bool>()) p[static_cast<size_t>(j)] = std::exp(scores[j] - max) / z;
    }
    return p;
  };
  double total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < heads; ++r) {
      for (int64_t i = 0; i < length; ++i) {
        if (pad[b][i].item<bool>()) continue;
        const auto ps = relation(s, b, r, i), pt = relation(t, b, r, i);
        for (int64_t j = 0; j < length; ++j) {
          if (pad[b][j].item<bool>()) continue;
          total += pt[j] * (std::log(pt[j]) - std::log(ps[j]));
        }
      }
    }
  }
  return total / static_cast<double>(heads);
}

// [B, T] padding: row 0 full, row 1 with its last `padded` tokens padded.
torch::Tensor padding_mask(int64_t length, int64_t padded) {
  auto padding = torch::zeros({2, length}, torch::kBool);
  padding[1].narrow(0, length - padded, padded).fill_(true);
  return padding;
}

TEST(DistillRelations, LossEqualsExplicitLoopsWithPadding) {
  torch::manual_seed(3);
  const auto padding = padding_mask(/*length=*/6, /*padded=*/2);
  // Student 8 wide, teacher 12 wide: 4 relation heads of 2 and 3 dimensions. Large values so
  // that the relations are far from uniform.
  const auto student = 2 * torch::randn({2, 6, 8}, torch::kFloat64);
  const auto teacher = 2 * torch::randn({2, 6, 12}, torch::kFloat64);
  const double naive = naive_relation_kl_sum(student, teacher, padding, 4);
  EXPECT_GT(naive, 0.5);
  EXPECT_NEAR(objectives::relation_kl_sum(student, teacher, padding, 4).item<double>(), naive,
              1e-9 * naive);
  // Garbage at the padded positions changes nothing: padded keys and queries are left out.
  auto noisy = student.clone();
  noisy[1].narrow(0, 4, 2).normal_(0, 100);
  EXPECT_NEAR(objectives::relation_kl_sum(noisy, teacher, padding, 4).item<double>(), naive,
              1e-9 * naive);
  // float32 projections are computed in float32.
  EXPECT_NEAR(objectives::relation_kl_sum(student.to(torch::kFloat32), teacher.to(torch::kFloat32),
                                          padding, 4)
                  .item<double>(),
              naive, 1e-4 * naive);

  // The terms of a step: each relation's sum over the real tokens (10 here), weighted 1/3, so
  // that L is the mean over the three relations of the KL per relation head and real query.
  model::ModelOutput out;
  out.padding = padding;
  const auto other = [&](int64_t width) { return torch::randn({2, 6, width}, torch::kFloat64); };
  out.student_attention = {student, other(8), other(8)};
  out.teacher_attention = {teacher, other(12), other(12)};
  config::Config c;
  c.objectives.set = "distill";
  c.distill.relation_heads = 4;
  const objectives::Objectives objectives(c.objectives, c.distill);
  EXPECT_EQ(objectives.term_names(), (std::vector<std::string>{"qq_kl", "kk_kl", "vv_kl"}));
  EXPECT_TRUE(objectives.term_names(data::Task::kPara).empty());
  const auto terms = objectives.compute(out, data::Task::kMono);
  ASSERT_EQ(terms.size(), 3u);
  double expected = 0;
  const std::pair<const torch::Tensor*, const torch::Tensor*> sides[] = {
      {&out.student_attention.query, &out.teacher_attention.query},
      {&out.student_attention.key, &out.teacher_attention.key},
      {&out.student_attention.value, &out.teacher_attention.value}};
  for (size_t n = 0; n < 3; ++n) {
    const double sum = naive_relation_kl_sum(*sides[n].first, *sides[n].second, padding, 4);
    EXPECT_NEAR(terms[n].loss_sum.item<double>(), sum, 1e-9 * sum) << terms[n].name;
    EXPECT_EQ(terms[n].count.item<int64_t>(), 10) << terms[n].name;
    expected += sum / 10 / 3;
  }
  std::map<std::string, torch::Tensor> normalizers;
  for (const auto& name : objectives.term_names()) normalizers[name] = torch::tensor(10.0);
  EXPECT_NEAR(objectives::weighted_loss(terms, normalizers).item<double>(), expected,
              1e-9 * expected);
}

TEST(DistillRelations, HiddenCosineSumsOverRealTokens) {
  const auto padding = padding_mask(3, 1);
  auto student = torch::zeros({2, 3, 2}, torch::kFloat64);
  auto teacher = torch::zeros({2, 3, 2}, torch::kFloat64);
  // Row 0: cos 1, 0, -1 -> 0 + 1 + 2; row 1: cos 1, 1 and a padded token -> 0.
  student[0][0] = torch::tensor({1.0, 0.0}, torch::kFloat64);
  teacher[0][0] = torch::tensor({2.0, 0.0}, torch::kFloat64);
  student[0][1] = torch::tensor({1.0, 0.0}, torch::kFloat64);
  teacher[0][1] = torch::tensor({0.0, 3.0}, torch::kFloat64);
  student[0][2] = torch::tensor({1.0, 1.0}, torch::kFloat64);
  teacher[0][2] = torch::tensor({-1.0, -1.0}, torch::kFloat64);
  student[1].fill_(1.0);
  teacher[1].fill_(2.0);
  teacher[1][2] = torch::tensor({-1.0, 0.0}, torch::kFloat64);
  EXPECT_NEAR(objectives::hidden_cosine_sum(student, teacher, padding).item<double>(), 3.0, 1e-12);
}

// A tiny trained XLM-E run as the teacher (1 layer, 32 wide, 64 ids, no tokenizer) and a config
// that distills it into a student of the same shape with 4 relation heads.
struct Distillation {
  TempDir dir;
  std::string teacher_run;
  config::Config config;
};

std::unique_ptr<Distillation> tiny_distillation() {
  auto d = std::make_unique<Distillation>();
  xlme::testing::make_tiny_checkpoint(xlme::testing::tiny_train_config(2, 1, 0.0),
                                      d->dir / "teacher");
  d->teacher_run = d->dir / "teacher";
  d->config = xlme::testing::tiny_train_config(2, 1, 0.0);
  d->config.objectives.set = "distill";
  d->config.distill.teacher = d->teacher_run;
  d->config.distill.relation_heads = 4;
  return d;
}

// The student that is the teacher: the teacher's weights copied into the same shapes.
TEST(DistillStudent, ZeroLossWhenTheStudentIsTheTeacher) {
  auto d = tiny_distillation();
  for (const double cosine : {0.0, 0.5}) {
    auto c = d->config;
    c.distill.hidden_cosine = cosine;
    auto student = build_model(c);
    student->eval();
    data::SyntheticBatches source(data::SpecialIds::for_vocab(64), 3, 16, 0.15, 5);
    const auto batch = source.next(data::Task::kMono);
    const objectives::Objectives objectives(c.objectives, c.distill);
    auto losses = [&] {
      torch::NoGradGuard no_grad;
      const auto terms =
          objectives.compute(student->forward(model::ModelInputs::from(batch)), data::Task::kMono);
      std::map<std::string, double> out;
      for (const auto& t : terms) out[t.name] = t.loss_sum.item<double>() / t.count.item<double>();
      return out;
    };
    const auto before = losses();
    ASSERT_EQ(before.size(), cosine > 0 ? 4u : 3u);
    for (const auto& [name, loss] : before) EXPECT_GT(loss, 1e-3) << name << " before the copy";

    const auto teacher_weights = student->teacher()->model->named_parameters();
    {
      torch::NoGradGuard no_grad;
      for (auto& item : student->named_parameters()) {
        item.value().copy_(teacher_weights[item.key()]);
      }
    }
    for (const auto& [name, loss] : losses()) EXPECT_NEAR(loss, 0.0, 1e-6) << name;
  }
}

TEST(DistillStudent, TheTeacherGetsNoGradientAndNoOptimizerSlot) {
  auto d = tiny_distillation();
  auto c = d->config;
  c.distill.hidden_cosine = 1.0;  // every part of the student gets a gradient
  auto model = build_model(c);
  const model::Teacher& teacher = *model->teacher();
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : teacher.model->named_parameters()) {
    EXPECT_FALSE(item.value().requires_grad()) << item.key();
    before[item.key()] = item.value().clone();
  }
  EXPECT_FALSE(teacher.model->is_training());
  // The student's parameters are its own: embeddings and discriminator, no generator or head.
  int64_t student = 0;
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.key().rfind("embeddings.", 0) == 0 ||
                item.key().rfind("discriminator.", 0) == 0)
        << item.key();
    student += item.value().numel();
  }
  data::SyntheticBatches source(data::SpecialIds::for_vocab(64), 2, 16, 0.15, 5);
  Trainer trainer(c, model, source, single_process());
  EXPECT_EQ(trainer.parameter_count(), student);  // what the optimizer holds
  EXPECT_GT(teacher_parameter_count(teacher), 0);
  trainer.train_step();
  trainer.train_step();
  EXPECT_FALSE(teacher.model->is_training());  // the trainer put the student in training mode
  for (const auto& item : teacher.model->named_parameters()) {
    EXPECT_FALSE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), before.at(item.key()))) << item.key();
  }

  // One more backward by hand: every student parameter gets a gradient, no teacher parameter.
  const auto batch = source.next(data::Task::kMono);
  const objectives::Objectives objectives(c.objectives, c.distill);
  const auto terms =
      objectives.compute(model->forward(model::ModelInputs::from(batch)), data::Task::kMono);
  std::map<std::string, torch::Tensor> normalizers;
  for (const auto& name : objectives.term_names()) normalizers[name] = torch::tensor(32.0);
  objectives::weighted_loss(terms, normalizers).backward();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
  }
  for (const auto& item : teacher.model->named_parameters()) {
    EXPECT_FALSE(item.value().grad().defined()) << item.key();
  }
}

// The same micro-batch every step: the tiny student can fit the teacher's relations on it.
TEST(DistillStudent, LossFallsOverThirtySteps) {
  auto d = tiny_distillation();
  auto c = d->config;
  c.train.lr = 1e-2;
  c.train.warmup_steps = 2;
  c.train.steps = 30;
  c.model.hidden_size = 16;  // a narrower student than the 32-wide teacher
  c.model.ffn_size = 32;
  xlme::testing::RepeatingBatches source(data::SpecialIds::for_vocab(64), 4, 16, 0.15, 11);
  torch::manual_seed(4);
  Trainer trainer(c, build_model(c), source, single_process());
  const StepRecord first = trainer.train_step();
  StepRecord last;
  for (int i = 1; i < 30; ++i) last = trainer.train_step();
  EXPECT_EQ(last.step, 30);
  for (const char* term : {"qq_kl", "kk_kl", "vv_kl"}) {
    EXPECT_LT(last.terms.at(term).at("loss"), 0.7 * first.terms.at(term).at("loss")) << term;
  }
  EXPECT_LT(last.loss, 0.7 * first.loss);
  std::cout << "[ distill  ] relation loss " << first.loss << " at step 1, " << last.loss
            << " at step 30" << std::endl;
  EXPECT_NEAR(first.loss,
              (first.terms.at("qq_kl").at("loss") + first.terms.at("kk_kl").at("loss") +
               first.terms.at("vv_kl").at("loss")) /
                  3,
              1e-6);
  // The step's FLOPs include the teacher's forward.
  EXPECT_DOUBLE_EQ(first.flops, static_cast<double>(first.tokens) *
                                    training_flops_per_token(c, 16, trainer.model()->teacher()));
}

// The checkpoint records the method; it loads as a discriminator without a head, and not with
// the generator.
TEST(DistillStudent, CheckpointRecordsTheMethodAndLoadsAsADiscriminator) {
  auto d = tiny_distillation();
  const auto student = xlme::testing::make_tiny_checkpoint(d->config, d->dir / "student");
  const auto p = checkpoint::load_pretrained(student.path);
  EXPECT_EQ(p.objective_set, "distill");
  ASSERT_TRUE(p.run_config.has_value());
  EXPECT_EQ(p.run_config->distill.teacher, d->teacher_run);
  EXPECT_TRUE(p.discriminator->discriminator_head.is_empty());
  checkpoint::PretrainedOptions options;
  options.with_generator = true;
  EXPECT_TRUE(
      contains_all(error_message([&] { checkpoint::load_pretrained(student.path, options); }),
                   {student.path, "distilled with objectives.set=distill", "no --with-generator"}));
}

TEST(DistillFlops, PerTokenByHand) {
  config::Config c;
  c.objectives.set = "distill";
  c.model.vocab_size = 100;
  c.model.hidden_size = 32;
  c.model.ffn_size = 64;
  c.model.layers = 2;
  c.model.heads = 2;
  config::ModelConfig t = c.model;
  t.hidden_size = 64;
  t.ffn_size = 128;
  t.layers = 3;
  model::DiscriminatorModel teacher_model(t, false);
  model::Teacher teacher;
  teacher.model = teacher_model.ptr();
  teacher.encoder = teacher_model->discriminator;
  teacher.layer = 2;
  // T = 16. Student layer: 8*32^2 + 4*32*64 + 4*16*32 = 18432; one layer below the last, the
  // last one's Q, K, V (6*32^2 = 6144) and the relations (6*16*32 = 3072): 27648.
  // Teacher layer: 8*64^2 + 4*64*128 + 4*16*64 = 69632; one layer below layer 2, its Q, K, V
  // (6*64^2 = 24576) and the relations (6*16*64 = 6144): 100352. 3 * 27648 + 100352.
  EXPECT_DOUBLE_EQ(training_flops_per_token(c, 16, &teacher), 183296.0);
  // With the hidden cosine every layer of both runs: student 2 * 18432 + 3072 = 39936, teacher
  // 3 * 69632 + 6144 = 215040.
  teacher.hidden = true;
  EXPECT_DOUBLE_EQ(training_flops_per_token(c, 16, &teacher), 3 * 39936.0 + 215040.0);
  EXPECT_TRUE(contains_all(error_message([&] { training_flops_per_token(c, 16); }),
                           {"objectives.set=distill need the teacher"}));
}

TEST(DistillConfig, ErrorsNameTheKeyAndTheValue) {
  auto d = tiny_distillation();
  auto with = [&](const std::function<void(config::Config&)>& change) {
    auto c = d->config;
    change(c);
    return error_message([&] { build_model(c); });
  };
  EXPECT_TRUE(contains_all(with([](auto& c) { c.distill.relation_heads = 3; }),
                           {"distill.relation_heads (3) must divide both hidden sizes",
                            "model.hidden_size 32", "teacher's (32"}));
  EXPECT_TRUE(contains_all(with([](auto& c) { c.distill.teacher = ""; }),
                           {"objectives.set=distill needs distill.teacher"}));
  const std::string missing = d->dir / "no-such-run";
  EXPECT_TRUE(contains_all(with([&](auto& c) { c.distill.teacher = missing; }),
                           {"distill.teacher '" + missing + "' not found"}));
  EXPECT_TRUE(contains_all(with([](auto& c) { c.distill.teacher_layer = 2; }),
                           {"distill.teacher_layer is 2", "has 1 layers"}));
  EXPECT_TRUE(contains_all(with([](auto& c) { c.distill.teacher_layer = 0; }),
                           {"distill.teacher_layer is 0"}));
  EXPECT_TRUE(contains_all(
      with([](auto& c) {
        c.model.hidden_size = 16;
        c.distill.hidden_cosine = 1;
      }),
      {"distill.hidden_cosine (1) compares the last hidden states", "model.hidden_size is 16"}));
  EXPECT_TRUE(contains_all(with([](auto& c) { c.model.vocab_size = 65; }),
                           {"vocabulary of 64 ids", "the student (model.vocab_size", "has 65"}));
  // A folder that is not a model: load_pretrained's message, behind the key.
  std::filesystem::create_directories(d->dir / "empty");
  EXPECT_TRUE(contains_all(
      with([&](auto& c) { c.distill.teacher = d->dir / "empty"; }),
      {"distill.teacher '" + (d->dir / "empty") + "'", "neither a pre-training checkpoint"}));
  // The schema's errors name the key.
  EXPECT_TRUE(
      contains_all(error_message([] { config::load_config("", {"distill.relation_heads=0"}); }),
                   {"distill.relation_heads"}));
  EXPECT_TRUE(contains_all(error_message([] { config::load_config("", {"distill.teachers=x"}); }),
                           {"distill.teachers"}));
}

}  // namespace
}  // namespace xlme::train
