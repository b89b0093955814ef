#include "xlme/common/precision.h"

#include "xlme/common/torch_compat.h"

#include <ATen/Context.h>

namespace xlme {

bool uses_bf16(const std::string& precision, const torch::Device& device) {
  return precision == "bf16" || (precision == "auto" && device.is_cuda());
}

void enable_tf32(const torch::Device& device) {
  if (!device.is_cuda()) return;
  at::globalContext().setAllowTF32CuBLAS(true);
  at::globalContext().setAllowTF32CuDNN(true);
}

AutocastScope::AutocastScope(const torch::Device& device, bool enabled)
    : device_type_(device.type()), enabled_(enabled) {
  if (!enabled_) return;
  was_enabled_ = compat::autocast_enabled(device_type_);
  previous_dtype_ = compat::autocast_dtype(device_type_);
  compat::set_autocast(device_type_, true, at::kBFloat16);
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  compat::set_autocast(device_type_, was_enabled_, previous_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

}  // namespace xlme
