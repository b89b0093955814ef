// The table of xlme's ahead-of-time compiled Triton kernels (ops/triton.h launches them): what
// src/ops/triton/aot.py generates into the build. No LibTorch here: the generated source, a few
// MB of cubin bytes, compiles without it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace xlme::ops::triton {

// One compiled variant for one architecture (the generated table's row).
struct KernelImage {
  const char* variant;  // e.g. "masked_lm_forward_bf16_sample"
  const char* entry;    // the cubin's kernel name
  int capability;       // 90 (sm_90a) or 80 (sm_80)
  const char* arch;
  const unsigned char* cubin;
  size_t cubin_size;
  int num_warps;
  int shared_bytes;       // dynamic shared memory per block
  const char* signature;  // the parameter types in order, e.g. "*bf16,i64,i32,fp32,u64"
  const char* constants;  // the constexpr values it was compiled with, e.g. "ROWS=1,BLOCK=1024"
};

// The value of the compile-time constant `name` of `image` (booleans are 0 or 1); throws when the
// image has no such constant.
long long constant(const KernelImage& image, const std::string& name);

// Every embedded image (the build's src/ops/triton/aot.py output).
const std::vector<KernelImage>& kernel_images();
// The Triton that compiled them.
const char* triton_version();

// The image of `variant` for a GPU of compute capability major.minor: sm_90a's for 9.0, sm_80's
// for 8.x; nullptr when there is none (another architecture, or an unknown variant).
const KernelImage* find_image(const std::string& variant, int major, int minor);

}  // namespace xlme::ops::triton
