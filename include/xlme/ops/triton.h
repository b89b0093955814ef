// xlme's Triton kernels, compiled ahead of time and launched from C++ (docs/ops.md).
//
// src/ops/triton/*.py holds the kernels; the build runs src/ops/triton/aot.py, which compiles
// every variant for sm_90a (H100/H200) and sm_80 (A100 and the other 8.x GPUs) on any machine
// (no GPU needed) and embeds the cubins in the library with their entry names, warps, shared
// memory and parameter types. A launch loads the cubin for the device's capability once, through
// the CUDA driver's module and launch calls, which it resolves from the CUDA runtime that LibTorch
// loads (cudaGetDriverEntryPointByVersion): no link to libcuda. It launches on the device's current
// stream. The same kernel sources run on the CPU through Triton's interpreter in the tests
// (tests/python/test_*kernel*.py), against float64 references.
#pragma once

#include "xlme/ops/triton_images.h"

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace xlme::ops::triton {

// One launch argument, typed as a kernel signature names it: "*<dtype>" (a tensor's data),
// i32, u32, i64, u64, fp32. A signature type may end in ":16" (e.g. "*bf16:16", "i32:16"): the
// kernel was compiled assuming a pointer 16-byte aligned or an integer that is a multiple of 16
// (vectorized loads), and the launch checks it.
class Arg {
 public:
  static Arg pointer(const torch::Tensor& tensor);
  static Arg i32(int64_t value);  // range-checked
  static Arg u32(uint64_t value);
  static Arg i64(int64_t value);
  static Arg u64(uint64_t value);
  static Arg f32(double value);

  const std::string& type() const { return type_; }  // as in a signature: "*bf16", "i32", ...
  void* address() { return bytes_.data(); }          // what cuLaunchKernel's parameter array holds
  // An address that is a multiple of 16 bytes, or an integer that is a multiple of 16.
  bool multiple_of_16() const { return multiple_of_16_; }

 private:
  Arg(std::string type, const void* value, size_t size, bool multiple_of_16);
  std::string type_;
  std::array<unsigned char, 8> bytes_{};
  bool multiple_of_16_ = false;
};

// Throws unless `args` match the image's signature in number and types (and the ":16" promises);
// the message names the variant and the first argument that differs.
void check_args(const KernelImage& image, const std::vector<Arg>& args);

// The image of `variant` for `device`'s GPU; throws, naming the GPU and its capability, when
// none was compiled for it.
const KernelImage& image_for(const std::string& variant, const torch::Device& device);

// A dropout probability p in [0, 1) as the kernels compare their 32-bit Philox words with it:
// round(p * 2^32), kept when the word is at least that.
uint32_t dropout_threshold(double p);

// Whether `variant` can launch on `device` (a CUDA device with an image for its capability).
bool available(const std::string& variant, const torch::Device& device);

// LibTorch's CUDA generator for `device`: its Philox key and a fresh counter offset for one
// kernel call (the generator advances; checkpoints save and restore it). Throws inside a CUDA
// graph capture, where the offset lives on the device.
std::pair<uint64_t, uint64_t> philox_inputs(const torch::Device& device);

// A grid of programs (x, y, z), as the callers compute it from their shapes.
using Grid = std::array<int64_t, 3>;

// Throws unless every dimension of `grid` is within CUDA's limits (x up to 2^31 - 1, y and z up
// to 65,535; none negative); the message names the variant, the grid, the dimension, what `what`
// says the grid covers (e.g. "64 queries x 384 sequence-heads") and what to do.
void check_grid(const std::string& variant, const Grid& grid, const std::string& what);

// Launches `variant` on `device`'s current stream with a grid of `grid` blocks (check_grid first;
// `what` is for its message). An empty grid launches nothing.
void launch(const std::string& variant, const torch::Device& device, const Grid& grid,
            std::vector<Arg> args, const std::string& what = "");

// How many launches of variants whose names start with `prefix` this process has made (tests
// check with it that a fused path ran rather than fell back to its reference).
int64_t launch_count(const std::string& prefix);

}  // namespace xlme::ops::triton
