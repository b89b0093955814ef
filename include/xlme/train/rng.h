// The default random generators as state: checkpoints save them, and work that must not change
// training (the start-up dry run, validation) runs on a fork that is undone afterwards.
#pragma once

#include <torch/types.h>

namespace xlme::train {

torch::Tensor cpu_generator_state();
void set_cpu_generator_state(const torch::Tensor& state);

// Saves the default CPU generator's state, and the default CUDA generator's of `device` when it
// is a CUDA device, and restores them at scope exit: whatever random numbers are drawn inside
// (dropout, replacement sampling) the training stream continues as if nothing had been drawn.
class ForkedRng {
 public:
  explicit ForkedRng(const torch::Device& device);
  ~ForkedRng();
  ForkedRng(const ForkedRng&) = delete;
  ForkedRng& operator=(const ForkedRng&) = delete;

  // Seeds the forked generators (CPU and, when present, the CUDA one).
  void seed(uint64_t seed);

 private:
  torch::Device device_;
  torch::Tensor cpu_state_, cuda_state_;
};

}  // namespace xlme::train
