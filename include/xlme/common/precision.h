// train.precision: fp32, or bf16 autocast with fp32 master weights (docs/ARCHITECTURE.md#training).
// The parameters, gradients and optimizer state stay fp32; inside the forward pass autocast runs
// matrix products (and what it lists as safe) in bf16 and keeps reductions and losses in fp32.
#pragma once

#include <torch/types.h>

#include <string>

namespace xlme {

// "auto": bf16 on CUDA, fp32 on the CPU; "bf16" / "fp32": as named (bf16 on the CPU uses
// LibTorch's CPU autocast, fast only with AVX512-BF16 or AMX).
bool uses_bf16(const std::string& precision, const torch::Device& device);

// On CUDA, lets fp32 matrix products use TF32 tensor cores (what autocast leaves in fp32).
void enable_tf32(const torch::Device& device);

// bf16 autocast on `device` while in scope when `enabled`, then the previous state again and the
// autocast cache cleared. Put the forward pass inside, not the backward pass.
class AutocastScope {
 public:
  AutocastScope(const torch::Device& device, bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  torch::DeviceType device_type_;
  bool enabled_;
  bool was_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

// Autocast off on `device` while in scope, its cast cache kept: a backward pass inside a step-wide
// AutocastScope runs in the dtypes its forward chose (as outside any scope) while the bf16 copies
// of the weights that autocast cached stay for the next micro-batch.
class AutocastPause {
 public:
  explicit AutocastPause(const torch::Device& device);
  ~AutocastPause();
  AutocastPause(const AutocastPause&) = delete;
  AutocastPause& operator=(const AutocastPause&) = delete;

 private:
  torch::DeviceType device_type_;
  bool was_enabled_;
};

}  // namespace xlme
