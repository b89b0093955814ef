// Parameter counts per module: counted from a built model, or computed from the config alone
// (for sizes too large to build in a test, e.g. XL's 2.2B parameters).
#pragma once

#include "xlme/config/config.h"
#include "xlme/model/electra.h"

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::model {

struct ModuleParameters {
  std::string module;  // top-level module: embeddings, generator, discriminator, ..._head
  int64_t count = 0;
};

// Per top-level child of `model`, in registration order, from its parameters().
std::vector<ModuleParameters> parameter_counts(const torch::nn::Module& model);

// The same table computed from the config, without building anything.
std::vector<ModuleParameters> analytic_parameter_counts(const config::ModelConfig& config,
                                                        Architecture architecture);

// The count of `module` in `counts` (0 when absent).
int64_t count_of(const std::vector<ModuleParameters>& counts, const std::string& module);

// Sum over every module.
int64_t total_count(const std::vector<ModuleParameters>& counts);

// The parameter table printed by `xlme-pretrain --print-model`: one line per module, the total,
// and the discriminator with its embeddings (what is fine-tuned; the paper's Table 3 figure).
std::string format_parameter_table(const std::vector<ModuleParameters>& counts);

}  // namespace xlme::model
