// --init-from: a fresh run (step 0, new optimizer) that starts from another run's weights. Not
// resume: nothing but weights is taken. Any loader that yields name -> tensor (a pre-training
// checkpoint, an HF XLM-R checkpoint) feeds init_weights.
#pragma once

#include "xlme/checkpoint/weights.h"
#include "xlme/model/electra.h"

#include <map>
#include <string>
#include <vector>

namespace xlme::train {

struct InitReport {
  std::vector<std::string> matched;  // loaded
  std::vector<std::string> missing;  // selected model tensors the source lacks: left as they were
  std::vector<std::string> unexpected;    // source tensors the model does not have: ignored
  std::vector<std::string> not_selected;  // model tensors outside `parts`: left as they were
};

// Every tensor (parameters and buffers) of a pre-training checkpoint folder's model.pt, by its
// parameter name (discriminator.layers.0.attention.query.weight). Verifies the checkpoint first.
std::map<std::string, torch::Tensor> checkpoint_weights(const std::string& folder);

// The weights of a HuggingFace XLM-R (or RoBERTa) checkpoint folder (config.json with model_type
// xlm-roberta or roberta, model.safetensors; keys with or without the "roberta." prefix) under
// xlme's names: the shared token table, the discriminator's embedding LayerNorm and layers
// (query/key/value/output, attention_norm, ffn.intermediate/output, ffn_norm). XLM-R's positions
// start at padding_idx + 1 = 2 and its single token type is added everywhere, so
// embeddings.position.weight row i = position_embeddings[i + 2] + token_type_embeddings[0]. What
// has no counterpart (pooler, LM head) keeps its HF name (reported as unexpected); what XLM-R
// lacks (relative-bias tables, gates, the generator) stays at its initialization.
// With `expected` (the model's tensors, checkpoint::weight_specs) the file's header is checked
// first: a tensor the model has must be F32, F16 or BF16 and no larger than the model's, or the
// error names it; a tensor the model has not is not read (an empty placeholder, reported as
// unexpected). Without it every tensor is read.
std::map<std::string, torch::Tensor> xlmr_weights(const std::string& folder,
                                                  const checkpoint::WeightSpecs& expected = {});

// checkpoint_weights, or xlmr_weights for a folder holding an HF XLM-R checkpoint (config.json
// with model_type xlm-roberta or roberta, no model.pt): what --init-from reads.
std::map<std::string, torch::Tensor> init_source_weights(
    const std::string& folder, const checkpoint::WeightSpecs& expected = {});

// Copies the tensors of `weights` into `model`'s parameters and buffers of the selected part:
// "all"; "generator" (embeddings, generator, generator_head); "discriminator" (embeddings,
// discriminator, discriminator_head, mlm_head). A shape mismatch is an error naming the key and
// both shapes; nothing is copied then. `source` names the origin in messages.
InitReport init_weights(model::ElectraModel& model,
                        const std::map<std::string, torch::Tensor>& weights,
                        const std::string& parts, const std::string& source);

// "init from X: 42 tensors loaded; missing (kept at initialization): a, b; unexpected (ignored):
// c; not selected (train.init_parts=discriminator): 12 tensors"
std::string format_report(const InitReport& report, const std::string& source,
                          const std::string& parts);

}  // namespace xlme::train
