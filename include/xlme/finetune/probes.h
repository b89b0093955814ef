// The evaluations that train nothing (docs/ARCHITECTURE.md#fine-tuning): Tatoeba and BUCC as XTREME
// runs them, retrieval on line-aligned held-out pairs (the demo corpus), and the word-alignment
// probe (AER). All read mean-pooled (or per-word) hidden states of one discriminator layer, or of
// every layer.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/tokenizer.h"
#include "xlme/model/encoder.h"

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace xlme::finetune {

struct ProbeReport {
  nlohmann::ordered_json results;  // per layer and language (pair): the scores
  std::string table;               // for the console: the main score per layer and language
};

// Runs settings.task on `encoder` (finetune.layer, or every layer with sweep_layers) and writes
// prediction files under `predictions_dir` (empty = none).
ProbeReport run_probe(const config::FinetuneConfig& settings, model::Encoder& encoder,
                      const data::Tokenizer& tokenizer, const torch::Device& device,
                      const std::string& predictions_dir);

// The language pairs "<a>-<b>" of a folder holding <a>-<b>.<a> and <a>-<b>.<b> files, sorted;
// `pairs` (finetune.pairs) when not empty, each checked to exist.
std::vector<std::string> find_language_pairs(const std::string& dir,
                                             const std::vector<std::string>& pairs);

// Mean of the hidden states of each word's sub-tokens: the sentence is tokenized word by word
// (as fine-tuning does), run as <s> pieces </s>, and the pieces of word i averaged -> [words, H].
// A word without pieces gets the <unk> id.
torch::Tensor word_vectors(model::Encoder& encoder, const data::Tokenizer& tokenizer,
                           const std::vector<std::string>& words, int64_t layer,
                           const torch::Device& device);

}  // namespace xlme::finetune
