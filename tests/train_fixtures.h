// A tiny trainer set-up shared by the trainer's unit and multi-process tests.
#pragma once

#include "xlme/train/trainer.h"

#include <gtest/gtest.h>

#include <chrono>

namespace xlme::testing {

// The tiny model, steps of `micro_batches` micro-batches of `batch` sequences of 16 tokens.
inline config::Config tiny_train_config(int64_t batch, int64_t micro_batches, double dropout) {
  config::Config c = config::load_config(
      "", {"model.vocab_size=64", "model.hidden_size=32", "model.layers=1", "model.heads=2",
           "model.ffn_size=64", "model.max_positions=64", "model.generator.layers=1",
           "data.mono.max_len=16", "data.para.max_len=16", "finetune.max_len=64", "train.steps=20",
           "train.warmup_steps=2", "train.lr=1e-3", "run.device=cpu"});
  c.model.dropout = dropout;
  c.model.attention_dropout = dropout;
  c.train.micro_batch_tokens = batch * 16;
  c.train.tokens_per_task = batch * 16 * micro_batches;
  return c;
}

inline model::ElectraModel make_tiny_model(const config::Config& c, uint64_t seed) {
  torch::manual_seed(seed);
  return model::ElectraModel(c.model, model::architecture_for(c.objectives.set));
}

inline std::shared_ptr<dist::Communicator> single_process() {
  return dist::Communicator::create(dist::LaunchInfo{}, "gloo", std::chrono::seconds(1));
}

// Every parameter equal (atol 0) or close.
inline void expect_same_parameters(model::ElectraModel& a, model::ElectraModel& b, double atol) {
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    const auto& other = pb[item.key()];
    if (atol == 0) {
      EXPECT_TRUE(torch::equal(item.value(), other)) << item.key();
    } else {
      EXPECT_TRUE(torch::allclose(item.value(), other, /*rtol=*/1e-4, atol)) << item.key();
    }
  }
}

}  // namespace xlme::testing
