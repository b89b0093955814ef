// AdamW as the paper trains with it: decoupled weight decay on weight matrices and embeddings,
// none on biases, LayerNorm parameters and other vectors or scalars (as BERT, fairseq, Megatron).
#pragma once

#include "xlme/config/config.h"

#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

namespace xlme::optim {

// True for the parameters that get weight decay: those with two or more dimensions.
bool takes_weight_decay(const torch::Tensor& parameter);

// LibTorch's AdamW with the same state, options and checkpoint format, stepping every parameter
// of a group at once with LibTorch's fused kernel (at::_fused_adamw_, on the CPU as on CUDA): the
// arithmetic of LibTorch's per-parameter loop up to rounding (the kernel orders and fuses the
// operations its own way). On the CPU it is several times faster than the multi-tensor
// (_foreach_) operations that LibTorch's loop performs (docs/performance.md). No amsgrad, no
// maximize (xlme uses neither).
class MultiTensorAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// The global L2 norm of the gradients of `parameters` (those that have one) as a 0-dim float32
// tensor on their device: per-tensor norms in one multi-tensor call, then the norm of those. No
// host synchronization.
torch::Tensor gradient_norm(const std::vector<torch::Tensor>& parameters);
// Multiplies every gradient by `scale` (multi-tensor).
void scale_gradients(const std::vector<torch::Tensor>& parameters, double scale);

// Drops the gradients of `parameters` (each becomes undefined), as PyTorch 2's
// zero_grad(set_to_none=True): the next backward pass hands its gradient buffers over instead of
// adding them to zeros, which saves a fill and an addition over every parameter per step, and a
// parameter the step does not reach keeps no gradient (AdamW leaves it and its moments alone).
void clear_gradients(const std::vector<torch::Tensor>& parameters);

// Two parameter groups: [0] with train.weight_decay, [1] without. Learning rate starts at
// train.lr; the schedule sets it each step with set_learning_rate.
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& parameters,
                                                const config::TrainConfig& train);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace xlme::optim
