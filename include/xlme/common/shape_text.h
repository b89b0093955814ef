// How messages show a tensor's shape: "[2, 3, 4]" ("[]" for a scalar). Without LibTorch, so that
// code which never includes it (safetensors headers, weight lists) shows shapes the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace xlme {

// "[2, 3, 4]" for the `rank` sizes at `sizes`.
std::string shape_text(const int64_t* sizes, std::size_t rank);

// The same for a std::vector<int64_t> or a c10::IntArrayRef (tensor.sizes()).
template <typename Sizes>
std::string shape_text(const Sizes& sizes) {
  return shape_text(sizes.data(), sizes.size());
}

}  // namespace xlme
