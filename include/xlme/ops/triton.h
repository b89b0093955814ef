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
//
// A caller launches a kernel through its typed launcher, which the build generates from the
// kernel's signature (src/ops/triton/launchers.py writes xlme/ops/triton_launchers.h into the
// build folder): a struct per @triton.jit function with a member per parameter, filled by name;
// its args() are the Args below in signature order, which launch() checks against the variant.
#pragma once

#include "xlme/ops/triton_images.h"

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <optional>
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
  // A device address that is not a tensor's (e.g. the generator's seed under a graph capture),
  // typed "*<element>"; null where the kernel does not read it.
  static Arg address(const void* address, const std::string& element);

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

// Whether `args` keep every ":16" promise of the image's signature (pointers 16-byte aligned,
// integers multiples of 16); the types are check_args' business.
bool keeps_alignment(const KernelImage& image, const std::vector<Arg>& args);

// `variant` + "_aligned" where a GPU of capability major.minor has that image and `args` keep its
// ":16" promises (16-byte loads); else `variant` itself, whose signature promises nothing: an
// input that is not aligned takes the plain kernel, never an error.
std::string aligned_variant(const std::string& variant, int major, int minor,
                            const std::vector<Arg>& args);
std::string aligned_variant(const std::string& variant, const torch::Device& device,
                            const std::vector<Arg>& args);

// Whether `t` is laid out as a kernel with ":16" hints on its pointer and strides needs it: its
// data 16-byte aligned, its last stride 1 and every other stride a multiple of 16 elements.
bool aligned_rows(const torch::Tensor& t);

// `t` itself where aligned_rows(t), else a fresh contiguous copy (LibTorch's allocations are
// aligned): a misaligned input to an aligned-only kernel is copied, never refused. Differentiable.
torch::Tensor aligned_copy(const torch::Tensor& t);

// The image of `variant` for `device`'s GPU; throws, naming the GPU and its capability, when
// none was compiled for it.
const KernelImage& image_for(const std::string& variant, const torch::Device& device);

// A dropout probability p in [0, 1) as the kernels compare their 32-bit Philox words with it:
// round(p * 2^32), kept when the word is at least that.
uint32_t dropout_threshold(double p);

// Whether `variant` can launch on `device` (a CUDA device with an image for its capability).
bool available(const std::string& variant, const torch::Device& device);

// The Philox key and offset of one random kernel call, as the kernels take them (the arguments
// seed, offset_lo, offset_hi, seed_ptr, offset_ptr, captured: src/ops/triton/philox_state.py).
// Outside a CUDA graph capture: the generator's seed and offset as values. Inside one: the
// device addresses the generator writes the seed and the base offset to before every replay,
// and the call's offset within the graph, which the kernel adds to the base (as LibTorch's
// at::cuda::philox::unpack does), so that every replay draws new numbers.
struct PhiloxArgs {
  uint64_t seed = 0;
  uint64_t offset = 0;               // captured: the offset within the graph
  const void* seed_ptr = nullptr;    // captured: the device's int64 seed
  const void* offset_ptr = nullptr;  // captured: the device's int64 base offset
  bool captured = false;

  // The six launch arguments in the kernels' order (a launcher's args() appends them).
  void append_to(std::vector<Arg>& args) const;
  // As integers for an autograd context (the backward draws the same numbers), and back.
  std::vector<int64_t> to_ints() const;
  static PhiloxArgs from_ints(const std::vector<int64_t>& ints);
};

// The arguments from a generator state: at::PhiloxCudaState's fields (captured_: seed_.ptr,
// offset_.ptr and offset_intragraph_; else seed_.val and offset_.val).
PhiloxArgs philox_args(bool captured, uint64_t seed, uint64_t offset, const void* seed_ptr,
                       const void* offset_ptr, uint64_t offset_intragraph);

// LibTorch's CUDA generator for `device`: the arguments of one kernel call, which advances the
// generator's offset by 4 (checkpoints save and restore it), inside a graph capture or not.
PhiloxArgs philox_inputs(const torch::Device& device);

// What a generated launcher's args() reads of its members: the value; throws, naming the kernel
// and the member, where the caller left it unset (an undefined tensor, an empty optional).
[[noreturn]] void launcher_member_unset(const char* kernel, const char* member);
inline const torch::Tensor& launcher_member(const torch::Tensor& tensor, const char* kernel,
                                            const char* member) {
  if (!tensor.defined()) launcher_member_unset(kernel, member);
  return tensor;
}
template <class T>
const T& launcher_member(const std::optional<T>& value, const char* kernel, const char* member) {
  if (!value.has_value()) launcher_member_unset(kernel, member);
  return *value;
}

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
