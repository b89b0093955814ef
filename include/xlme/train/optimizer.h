// AdamW as the paper trains with it: decoupled weight decay on weight matrices and embeddings,
// none on biases, LayerNorm parameters and other vectors or scalars (as BERT, fairseq, Megatron).
#pragma once

#include "xlme/config/config.h"

#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

namespace xlme::train {

// True for the parameters that get weight decay: those with two or more dimensions.
bool takes_weight_decay(const torch::Tensor& parameter);

// Two parameter groups: [0] with train.weight_decay, [1] without. Learning rate starts at
// train.lr; the schedule sets it each step with set_learning_rate.
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& parameters,
                                                const config::TrainConfig& train);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace xlme::train
