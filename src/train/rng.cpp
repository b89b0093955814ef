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

ForkedRng::ForkedRng(const torch::Device& device) : device_(device) {
  cpu_state_ = cpu_generator_state();
  if (device_.is_cuda()) cuda_state_ = state_of(default_generator(device_));
}

ForkedRng::~ForkedRng() {
  set_cpu_generator_state(cpu_state_);
  if (device_.is_cuda()) set_state_of(default_generator(device_), cuda_state_);
}

void ForkedRng::seed(uint64_t seed) {
  auto cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_current_seed(seed);
  }
  if (device_.is_cuda()) {
    auto cuda = default_generator(device_);
    std::lock_guard<std::mutex> lock(cuda.mutex());
    cuda.set_current_seed(seed);
  }
}

}  // namespace xlme::train
