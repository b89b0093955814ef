// The trainer's step: gradient accumulation equals one larger batch, a resumed run equals an
// uninterrupted one bit for bit, non-finite updates are skipped and counted, and losses fall.
#include "xlme/train/trainer.h"

#include "xlme/data/synthetic.h"
#include "xlme/train/performance.h"
#include "xlme/train/rng.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::expect_same_parameters;
using xlme::testing::single_process;
using xlme::testing::TempDir;

config::Config tiny_config(int64_t batch, int64_t micro_batches, double dropout) {
  return xlme::testing::tiny_train_config(batch, micro_batches, dropout);
}

model::ElectraModel make_model(const config::Config& c, uint64_t seed) {
  return xlme::testing::make_tiny_model(c, seed);
}

data::SyntheticBatches make_source(const config::Config& c, int64_t batch) {
  return data::SyntheticBatches(data::SpecialIds::for_vocab(c.model.vocab_size), batch, 16, 0.15,
                                /*seed=*/11);
}

TEST(Trainer, MicroBatchCountFollowsTheTokenBudget) {
  auto c = tiny_config(4, 3, 0.0);
  auto source = make_source(c, 4);
  Trainer trainer(c, make_model(c, 1), source, single_process());
  EXPECT_EQ(trainer.micro_batches_per_task(), 3);
}

TEST(Trainer, AccumulatedMicroBatchesEqualOneLargerBatch) {
  // Near-zero temperature makes replacement sampling an argmax, the same whether one batch of 8
  // or two of 4 draw the noise; dropout is off.
  auto small = tiny_config(/*batch=*/4, /*micro_batches=*/2, 0.0);
  auto large = tiny_config(/*batch=*/8, /*micro_batches=*/1, 0.0);
  small.model.generator.sampling_temperature = large.model.generator.sampling_temperature = 1e-6;
  auto small_source = make_source(small, 4);
  auto large_source = make_source(large, 8);
  Trainer accumulated(small, make_model(small, 3), small_source, single_process());
  Trainer direct(large, make_model(large, 3), large_source, single_process());
  for (int step = 0; step < 2; ++step) {
    const StepRecord a = accumulated.train_step();
    const StepRecord b = direct.train_step();
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * std::abs(b.loss));
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * b.grad_norm);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.terms.at("mlm").at("accuracy"), b.terms.at("mlm").at("accuracy"));
  }
  expect_same_parameters(accumulated.model(), direct.model(), 1e-6);
}

// MFU counts each micro-batch's attention at its own length, not at data.*.max_len.
TEST(Trainer, StepFlopsCountEachMicroBatchAtItsLength) {
  auto c = tiny_config(2, 2, 0.0);
  c.data.mono.max_len = c.data.para.max_len = 64;  // the synthetic sequences are 16 long
  auto source = make_source(c, 2);
  Trainer trainer(c, make_model(c, 1), source, single_process());
  const StepRecord record = trainer.train_step();
  EXPECT_EQ(record.tokens, 2 * 2 * 2 * 16);  // 2 tasks x 2 micro-batches x 2 sequences x 16
  EXPECT_DOUBLE_EQ(record.flops,
                   static_cast<double>(record.tokens) * training_flops_per_token(c, 16));
  EXPECT_LT(record.flops, static_cast<double>(record.tokens) * step_flops_per_token(c));
}

// run.seed makes the model, identical on every rank; dropout and sampling then draw from the
// rank's own stream (every rank used to draw the same dropout masks and sampling noise).
TEST(Trainer, EachRankDrawsFromItsOwnStream) {
  auto c = tiny_config(2, 1, 0.1);
  c.run.seed = 7;
  auto source = make_source(c, 2);
  Trainer trainer(c, make_model(c, 7), source, single_process());
  EXPECT_EQ(at::detail::getDefaultCPUGenerator().current_seed(), training_seed(7, 0));
  EXPECT_NE(training_seed(7, 0), 7u);  // not the initialization's stream again
  EXPECT_NE(training_seed(7, 0), training_seed(7, 1));
}

TEST(Trainer, ResumedRunEqualsTheUninterruptedRun) {
  const auto c = tiny_config(4, 2, /*dropout=*/0.1);
  TempDir dir;
  auto straight_source = make_source(c, 4);
  Trainer straight(c, make_model(c, 5), straight_source, single_process());
  for (int i = 0; i < 4; ++i) straight.train_step();

  std::string checkpoint;
  {
    auto source = make_source(c, 4);
    Trainer first(c, make_model(c, 5), source, single_process());
    first.train_step();
    first.train_step();
    checkpoint = first.save_checkpoint(CheckpointManager(dir / "ckpt", 2, 0));
    first.train_step();  // work after the checkpoint, lost by the "crash"
  }
  torch::manual_seed(999);  // the resumed process starts from other random state
  auto source = make_source(c, 4);
  Trainer resumed(c, make_model(c, 6), source, single_process());
  resumed.load_checkpoint(checkpoint);
  EXPECT_EQ(resumed.step(), 2);
  resumed.train_step();
  resumed.train_step();
  EXPECT_EQ(resumed.step(), straight.step());
  EXPECT_EQ(resumed.tokens_seen(), straight.tokens_seen());
  expect_same_parameters(resumed.model(), straight.model(), /*atol=*/0);
}

TEST(Trainer, NonFiniteGradientSkipsTheUpdateAndCounts) {
  auto c = tiny_config(4, 1, 0.0);
  c.train.max_bad_steps = 2;
  auto source = make_source(c, 4);
  Trainer trainer(c, make_model(c, 7), source, single_process());
  auto& weight = trainer.model()->discriminator_head->output->weight;
  std::vector<torch::Tensor> before;
  for (const auto& p : trainer.model()->parameters()) before.push_back(p.detach().clone());

  const auto hook = weight.register_hook(
      [](torch::Tensor grad) { return grad * std::numeric_limits<float>::quiet_NaN(); });
  const StepRecord bad = trainer.train_step();
  EXPECT_TRUE(bad.skipped);
  EXPECT_EQ(trainer.skipped_steps(), 1);
  const auto after = trainer.model()->parameters();
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i]));

  weight.remove_hook(hook);
  const StepRecord good = trainer.train_step();  // resets the run of bad steps
  EXPECT_FALSE(good.skipped);
  EXPECT_FALSE(torch::equal(trainer.model()->parameters()[0], before[0]));

  weight.register_hook(
      [](torch::Tensor grad) { return grad * std::numeric_limits<float>::infinity(); });
  EXPECT_TRUE(trainer.train_step().skipped);
  EXPECT_TRUE(contains_all(error_message([&] { trainer.train_step(); }),
                           {"2 optimizer steps in a row had a non-finite loss or gradient norm",
                            "train.max_bad_steps"}));
  EXPECT_EQ(trainer.skipped_steps(), 3);
}

TEST(Trainer, AllFourLossesFallOnALearnableStream) {
  // The same micro-batch every step: something the tiny model can memorize.
  auto c = tiny_config(4, 1, 0.0);
  c.train.lr = 3e-3;
  c.train.warmup_steps = 2;
  c.train.steps = 60;
  struct Repeating : data::SyntheticBatches {
    using data::SyntheticBatches::SyntheticBatches;
    data::Batch next(data::Task task) override {
      restore({"0 0"});
      return data::SyntheticBatches::next(task);
    }
  } source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 11);
  Trainer trainer(c, make_model(c, 8), source, single_process());
  const StepRecord first = trainer.train_step();
  StepRecord last;
  for (int i = 1; i < 60; ++i) last = trainer.train_step();
  for (const char* term : {"mlm", "tlm", "mrtd", "trtd"}) {
    EXPECT_LT(last.terms.at(term).at("loss"), first.terms.at(term).at("loss")) << term;
  }
  EXPECT_GT(last.terms.at("mlm").at("accuracy"), first.terms.at("mlm").at("accuracy"));
}

}  // namespace
}  // namespace xlme::train
