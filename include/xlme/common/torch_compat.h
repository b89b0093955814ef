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

// c10d: LibTorch 2.0 split ProcessGroup into a dispatching ProcessGroup and per-device Backends;
// ProcessGroupGloo/ProcessGroupNCCL became Backends with the same collective methods. xlme holds
// them through this alias.
#if XLME_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace xlme::compat {
using CollectiveGroup = c10d::Backend;
}
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace xlme::compat {
using CollectiveGroup = c10d::ProcessGroup;
}
#endif
