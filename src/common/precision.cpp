#include "xlme/common/precision.h"

#include <ATen/autocast_mode.h>

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
  was_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, at::kBFloat16);
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

AutocastPause::AutocastPause(const torch::Device& device)
    : device_type_(device.type()), was_enabled_(at::autocast::is_autocast_enabled(device_type_)) {
  if (was_enabled_) at::autocast::set_autocast_enabled(device_type_, false);
}

AutocastPause::~AutocastPause() {
  if (was_enabled_) at::autocast::set_autocast_enabled(device_type_, true);
}

}  // namespace xlme
