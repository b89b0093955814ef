#include "xlme/train/rng.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace xlme::train {
namespace {

at::Generator default_generator(const torch::Device& device) {
  return device.is_cuda() ? at::globalContext().defaultGenerator(device)
                          : at::detail::getDefaultCPUGenerator();
}

torch::Tensor state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state_of(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace

torch::Tensor cpu_generator_state() {
  return state_of(at::detail::getDefaultCPUGenerator());
}

void set_cpu_generator_state(const torch::Tensor& state) {
  set_state_of(at::detail::getDefaultCPUGenerator(), state);
}

GeneratorStates generator_states(const torch::Device& device) {
  GeneratorStates states;
  states.cpu = cpu_generator_state();
  if (device.is_cuda()) states.device = state_of(default_generator(device));
  return states;
}

void set_generator_states(const GeneratorStates& states, const torch::Device& device) {
  set_cpu_generator_state(states.cpu);
  if (device.is_cuda() && states.device.defined()) {
    set_state_of(default_generator(device), states.device);
  }
}

uint64_t training_seed(uint64_t seed, int rank) {
  return seed + 1 + static_cast<uint64_t>(rank);
}

void seed_generators(uint64_t seed, const torch::Device& device) {
  for (auto generator : {at::detail::getDefaultCPUGenerator(), default_generator(device)}) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(seed);
  }
}

ForkedRng::ForkedRng(const torch::Device& device)
    : device_(device), states_(generator_states(device)) {}

ForkedRng::~ForkedRng() {
  set_generator_states(states_, device_);
}

void ForkedRng::seed(uint64_t seed) {
  seed_generators(seed, device_);
}

}  // namespace xlme::train
