// Every difference between the LibTorch versions xlme builds against (Debian's 1.13 CPU build and
// the CUDA 2.x build of PyTorch's wheels) is decided here, and only here.
#pragma once

#include <torch/version.h>

// True when the LibTorch being compiled against is at least major.minor.
#define XLME_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace xlme::compat {

// at::scaled_dot_product_attention (fused attention kernels) exists from LibTorch 2.0.
constexpr bool kHasScaledDotProductAttention = XLME_TORCH_AT_LEAST(2, 0);

// "1.13.0"
constexpr const char* kTorchVersion = TORCH_VERSION;

}  // namespace xlme::compat
