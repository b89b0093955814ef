// Every difference between the LibTorch versions xlme builds against (Debian's 1.13 CPU build and
// the CUDA 2.x build of PyTorch's wheels) is decided here, and only here.
#pragma once

#include "xlme/common/error.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>

// True when the LibTorch being compiled against is at least major.minor.
#define XLME_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace xlme::compat {

// at::scaled_dot_product_attention (fused attention kernels) exists from LibTorch 2.0.
constexpr bool kHasScaledDotProductAttention = XLME_TORCH_AT_LEAST(2, 0);

// at::scaled_dot_product_attention(q, k, v, additive mask, dropout) with its default scale
// 1/sqrt(d_k); q, k, v: [B, H, T, d_k], mask: broadcastable to [B, H, T, T] or undefined.
// Before LibTorch 2.0 it does not exist, and this throws (the caller selects the math kernel).
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& mask,
                                               double dropout) {
#if XLME_TORCH_AT_LEAST(2, 0)
  const auto attn_mask = mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt;
  return at::scaled_dot_product_attention(q, k, v, attn_mask, dropout, /*is_causal=*/false);
#else
  (void)q, (void)k, (void)v, (void)mask, (void)dropout;
  XLME_FAIL(
      "scaled_dot_product_attention needs LibTorch >= 2.0 (this build has {}); use "
      "model.attention=math",
      TORCH_VERSION);
#endif
}

inline bool autocast_enabled(at::DeviceType device) {
#if XLME_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline at::ScalarType autocast_dtype(at::DeviceType device) {
#if XLME_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == at::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                             : at::autocast::get_autocast_cpu_dtype();
#endif
}

// "1.13.0"
constexpr const char* kTorchVersion = TORCH_VERSION;

// at::_fused_adamw_ (one CUDA kernel over every parameter) exists from LibTorch 2.1.
#if XLME_TORCH_AT_LEAST(2, 1) && __has_include(<ATen/ops/_fused_adamw.h>)
#define XLME_HAS_FUSED_ADAMW 1
#else
#define XLME_HAS_FUSED_ADAMW 0
#endif

// xlme's fused CPU AdamW step (optim/optimizer.cpp, AVX2 + FMA) reproduces the rounding of
// LibTorch 1.13's CPU kernels, measured against them; other LibTorch versions and other
// architectures keep LibTorch's own operations.
#if defined(__x86_64__) && TORCH_VERSION_MAJOR == 1
#define XLME_HAS_OWN_CPU_ADAMW 1
#else
#define XLME_HAS_OWN_CPU_ADAMW 0
#endif

// The key of a parameter in an optimizer's per-parameter state map: LibTorch 1.13 keys it by the
// text of the parameter's TensorImpl address, 2.x by the address itself.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap& /*state*/, const at::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// Autocast on `device` (kCPU or kCUDA) to `dtype`, or off. LibTorch 2.4 replaced the per-device
// functions (set_enabled = CUDA, set_cpu_enabled) by ones taking the device type.
inline void set_autocast(at::DeviceType device, bool enabled, at::ScalarType dtype) {
#if XLME_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == at::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

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

// The CUDA caching allocator's statistics (peak memory): newer LibTorch (2.6 has it, 1.13 does
// not) moved StatType from c10::cuda::CUDACachingAllocator to the device-generic
// c10::CachingDeviceAllocator; the header that holds it decides, not a version number.
#ifdef XLME_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <c10/core/CachingDeviceAllocator.h>
namespace xlme::compat {
using CudaStatType = c10::CachingDeviceAllocator::StatType;
}
#else
namespace xlme::compat {
using CudaStatType = c10::cuda::CUDACachingAllocator::StatType;
}
#endif
#endif
