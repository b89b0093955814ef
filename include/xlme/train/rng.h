// The default random generators as state: checkpoints save them, and work that must not change
// training (the start-up dry run, validation) runs on a fork that is undone afterwards.
#pragma once

#include <torch/types.h>

namespace xlme::train {

torch::Tensor cpu_generator_state();
void set_cpu_generator_state(const torch::Tensor& state);

// What a rank's checkpoint holds of its random generators: the default CPU generator's state and,
// on a GPU, the default generator of that GPU (undefined on the CPU).
struct GeneratorStates {
  torch::Tensor cpu;
  torch::Tensor device;
};
GeneratorStates generator_states(const torch::Device& device);
// Restores `states` (`device`'s generator only when the states hold one).
void set_generator_states(const GeneratorStates& states, const torch::Device& device);

// The seed of rank `rank`'s dropout and sampling streams: run.seed initializes the model (the
// same weights everywhere), then every rank draws from streams of its own, distinct from the
// initialization's and from every other rank's.
uint64_t training_seed(uint64_t seed, int rank);
// Seeds the default CPU generator and, on a GPU, `device`'s default generator.
void seed_generators(uint64_t seed, const torch::Device& device);

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
  GeneratorStates states_;
};

}  // namespace xlme::train
