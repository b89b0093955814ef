// --init-from: a fresh run (step 0, new optimizer) that starts from another run's weights. Not
// resume: nothing but weights is taken. Any loader that yields name -> tensor (a pre-training
// checkpoint here; export folders later) feeds init_weights.
#pragma once

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
