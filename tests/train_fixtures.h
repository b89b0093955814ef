// A tiny trainer set-up shared by the trainer's unit and multi-process tests.
#pragma once

#include "xlme/data/spm_trainer.h"
#include "xlme/data/synthetic.h"
#include "xlme/train/distill.h"
#include "xlme/train/trainer.h"

#include "test_util.h"

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

// The model of objectives.set (a distillation student with its teacher from distill.teacher).
inline model::ElectraModel make_tiny_model(const config::Config& c, uint64_t seed) {
  torch::manual_seed(seed);
  return train::build_model(c);
}

// The same micro-batch of each task every step (the stream restarts at 0 before each): something a
// tiny model can memorize, so that its losses must fall.
struct RepeatingBatches : data::SyntheticBatches {
  using data::SyntheticBatches::SyntheticBatches;
  data::Batch next(data::Task task) override {
    restore({"0 0"});
    return data::SyntheticBatches::next(task);
  }
};

// One process on `device` (the trainer computes on its communicator's device).
inline std::shared_ptr<dist::Communicator> single_process(
    const torch::Device& device = torch::kCPU) {
  return dist::Communicator::create(dist::LaunchInfo{}, device, "gloo", std::chrono::seconds(1));
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

// Held-out translation pairs en-de and en-fr in `dir` (`<dir>/en-<x>.{en,<x>}`, `lines` pairs
// each, distinct sentences) whose "translations" are the English words with an affix, and a
// SentencePiece model trained on them at `<dir>/spm.model` (<mask> included: 60 ids).
inline void write_heldout_and_tokenizer(const std::string& dir, int lines) {
  unsigned state = 5;
  auto next = [&state] { return (state = state * 1103515245u + 12345u) >> 16; };
  const std::vector<std::string> words = {"house", "river", "green", "small", "water", "city",
                                          "over",  "under", "light", "stone", "tree",  "bird"};
  std::string en, de, fr;
  for (int line = 0; line < lines; ++line) {
    const int n = 3 + line % 5;
    for (int w = 0; w < n; ++w) {
      const std::string& word = words[next() % words.size()];
      const char* sep = w ? " " : "";
      en += sep + word;
      de += sep + word + "en";
      fr += sep + ("le" + word);
    }
    const std::string tag = " n" + std::to_string(line);  // keeps every sentence distinct
    en += tag + "\n";
    de += tag + "\n";
    fr += tag + "\n";
  }
  write_file(dir + "/en-de.en", en);
  write_file(dir + "/en-de.de", de);
  write_file(dir + "/en-fr.en", en);
  write_file(dir + "/en-fr.fr", fr);
  write_file(dir + "/spm_corpus/mono/en.txt", en);
  write_file(dir + "/spm_corpus/mono/de.txt", de);
  write_file(dir + "/spm_corpus/mono/fr.txt", fr);
  data::SpmTrainingOptions options;
  options.corpus_dir = dir + "/spm_corpus";
  options.out_model = dir + "/spm.model";
  options.spm.vocab_size = 60;
  options.spm.character_coverage = 1.0;
  options.spm.max_sentences = 10000;
  data::train_sentencepiece(options);
}

}  // namespace xlme::testing
