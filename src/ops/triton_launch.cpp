#include "xlme/common/error.h"
#include "xlme/ops/triton.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#ifdef XLME_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>  // the driver's types and prototypes only: its functions come from the runtime
#include <cuda_runtime_api.h>
#endif

namespace xlme::ops::triton {

namespace {

std::mutex launch_counts_mutex;
std::map<std::string, int64_t> launch_counts;  // variant -> launches

void count_launch(const std::string& variant) {
  const std::lock_guard<std::mutex> lock(launch_counts_mutex);
  ++launch_counts[variant];
}

}  // namespace

int64_t launch_count(const std::string& prefix) {
  const std::lock_guard<std::mutex> lock(launch_counts_mutex);
  int64_t total = 0;
  for (const auto& [variant, count] : launch_counts) {
    if (variant.compare(0, prefix.size(), prefix) == 0) total += count;
  }
  return total;
}

const KernelImage* find_image(const std::string& variant, int major, int minor) {
  (void)minor;  // sm_80 code runs on every 8.x GPU; sm_90a only on 9.0
  const int capability = major == 9 && minor == 0 ? 90 : major == 8 ? 80 : -1;
  for (const auto& image : kernel_images()) {
    if (variant == image.variant && image.capability == capability) return &image;
  }
  return nullptr;
}

long long constant(const KernelImage& image, const std::string& name) {
  const std::string all = image.constants;
  size_t at = 0;
  while (at < all.size()) {
    const size_t end = std::min(all.find(',', at), all.size());
    const size_t eq = all.find('=', at);
    if (eq < end && all.compare(at, eq - at, name) == 0) {
      return std::stoll(all.substr(eq + 1, end - eq - 1));
    }
    at = end + 1;
  }
  XLME_FAIL("Triton kernel {} has no compile-time constant {} (it has {})", image.variant, name,
            image.constants);
}

void check_grid(const std::string& variant, const Grid& grid, const std::string& what) {
  static constexpr std::array<int64_t, 3> kLimit{2147483647, 65535, 65535};
  static constexpr std::array<const char*, 3> kName{"x", "y", "z"};
  for (size_t i = 0; i < grid.size(); ++i) {
    XLME_CHECK(grid[i] >= 0 && grid[i] <= kLimit[i],
               "Triton kernel {}: a grid of ({}, {}, {}) programs{} does not fit CUDA's limit in "
               "{} ({} up to {}): use smaller micro-batches or sequences, or XLME_OPS=reference",
               variant, grid[0], grid[1], grid[2], what.empty() ? "" : " (" + what + ")", kName[i],
               grid[i], kLimit[i]);
  }
}

uint32_t dropout_threshold(double p) {
  XLME_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got {}", p);
  return static_cast<uint32_t>(std::min(std::llround(std::ldexp(p, 32)), 0xFFFFFFFFLL));
}

Arg::Arg(std::string type, const void* value, size_t size, bool multiple_of_16)
    : type_(std::move(type)), multiple_of_16_(multiple_of_16) {
  std::memcpy(bytes_.data(), value, size);
}

Arg Arg::pointer(const torch::Tensor& tensor) {
  static const std::map<torch::ScalarType, std::string> names{
      {torch::kBFloat16, "bf16"}, {torch::kFloat16, "fp16"}, {torch::kFloat32, "fp32"},
      {torch::kFloat64, "fp64"},  {torch::kInt64, "i64"},    {torch::kInt32, "i32"},
      {torch::kInt8, "i8"},       {torch::kUInt8, "u8"},     {torch::kBool, "i1"}};
  const auto name = names.find(tensor.scalar_type());
  XLME_CHECK(name != names.end(), "a Triton kernel takes no {} tensor",
             c10::toString(tensor.scalar_type()));
  const void* data = tensor.data_ptr();
  return Arg("*" + name->second, &data, sizeof(data), reinterpret_cast<uintptr_t>(data) % 16 == 0);
}

Arg Arg::i32(int64_t value) {
  XLME_CHECK(value >= INT32_MIN && value <= INT32_MAX,
             "{} does not fit a Triton kernel's i32 argument", value);
  const auto v = static_cast<int32_t>(value);
  return Arg("i32", &v, sizeof(v), value % 16 == 0);
}

Arg Arg::u32(uint64_t value) {
  XLME_CHECK(value <= UINT32_MAX, "{} does not fit a Triton kernel's u32 argument", value);
  const auto v = static_cast<uint32_t>(value);
  return Arg("u32", &v, sizeof(v), value % 16 == 0);
}

Arg Arg::i64(int64_t value) {
  return Arg("i64", &value, sizeof(value), value % 16 == 0);
}
Arg Arg::u64(uint64_t value) {
  return Arg("u64", &value, sizeof(value), value % 16 == 0);
}

Arg Arg::address(const void* address, const std::string& element) {
  return Arg("*" + element, &address, sizeof(address),
             reinterpret_cast<uintptr_t>(address) % 16 == 0);
}

void PhiloxArgs::append_to(std::vector<Arg>& args) const {
  args.push_back(Arg::u64(seed));
  args.push_back(Arg::u32(offset & 0xFFFFFFFFULL));
  args.push_back(Arg::u32(offset >> 32));
  args.push_back(Arg::address(seed_ptr, "i64"));
  args.push_back(Arg::address(offset_ptr, "i64"));
  args.push_back(Arg::i32(captured ? 1 : 0));
}

std::vector<int64_t> PhiloxArgs::to_ints() const {
  return {static_cast<int64_t>(seed), static_cast<int64_t>(offset),
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(seed_ptr)),
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(offset_ptr)), captured ? 1 : 0};
}

PhiloxArgs PhiloxArgs::from_ints(const std::vector<int64_t>& ints) {
  XLME_CHECK(ints.size() == 5, "PhiloxArgs::from_ints takes the 5 integers of to_ints, not {}",
             ints.size());
  PhiloxArgs a;
  a.seed = static_cast<uint64_t>(ints[0]);
  a.offset = static_cast<uint64_t>(ints[1]);
  a.seed_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(ints[2]));
  a.offset_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(ints[3]));
  a.captured = ints[4] != 0;
  return a;
}

PhiloxArgs philox_args(bool captured, uint64_t seed, uint64_t offset, const void* seed_ptr,
                       const void* offset_ptr, uint64_t offset_intragraph) {
  PhiloxArgs a;
  a.captured = captured;
  if (captured) {
    XLME_CHECK(seed_ptr != nullptr && offset_ptr != nullptr,
               "a captured Philox state without the device addresses of its seed and offset");
    a.seed_ptr = seed_ptr;
    a.offset_ptr = offset_ptr;
    a.offset = offset_intragraph;
  } else {
    a.seed = seed;
    a.offset = offset;
  }
  return a;
}

Arg Arg::f32(double value) {
  const auto v = static_cast<float>(value);
  return Arg("fp32", &v, sizeof(v), false);
}

void launcher_member_unset(const char* kernel, const char* member) {
  XLME_FAIL(
      "Triton kernel {}: the launch leaves its argument {} unset (a member of the kernel's "
      "launcher, xlme/ops/triton_launchers.h)",
      kernel, member);
}

void check_args(const KernelImage& image, const std::vector<Arg>& args) {
  std::vector<std::string> types;
  for (const char *p = image.signature, *start = p;; ++p) {
    if (*p == ',' || *p == '\0') {
      types.emplace_back(start, p);
      if (*p == '\0') break;
      start = p + 1;
    }
  }
  XLME_CHECK(args.size() == types.size(),
             "Triton kernel {} takes {} arguments ({}), the launch passes {}", image.variant,
             types.size(), image.signature, args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const size_t hint = types[i].find(":16");
    const std::string type = types[i].substr(0, hint);
    XLME_CHECK(args[i].type() == type,
               "Triton kernel {}: argument {} is {} in its signature ({}), the launch passes {}",
               image.variant, i, type, image.signature, args[i].type());
    XLME_CHECK(hint == std::string::npos || args[i].multiple_of_16(),
               "Triton kernel {}: argument {} ({}) must be {} (the kernel was compiled assuming "
               "it), the launch passes one that is not",
               image.variant, i, types[i],
               type[0] == '*' ? "a 16-byte aligned address" : "a multiple of 16");
  }
}

bool keeps_alignment(const KernelImage& image, const std::vector<Arg>& args) {
  size_t index = 0;
  for (const char *p = image.signature, *start = p;; ++p) {
    if (*p == ',' || *p == '\0') {
      const std::string type(start, p);
      if (index < args.size() && type.size() > 3 && type.compare(type.size() - 3, 3, ":16") == 0 &&
          !args[index].multiple_of_16()) {
        return false;
      }
      ++index;
      if (*p == '\0') break;
      start = p + 1;
    }
  }
  return true;
}

std::string aligned_variant(const std::string& variant, int major, int minor,
                            const std::vector<Arg>& args) {
  const KernelImage* aligned = find_image(variant + "_aligned", major, minor);
  return aligned != nullptr && keeps_alignment(*aligned, args) ? variant + "_aligned" : variant;
}

bool aligned_rows(const torch::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (t.dim() > 0 && t.stride(-1) != 1) return false;
  for (int64_t dim = 0; dim + 1 < t.dim(); ++dim) {
    if (t.stride(dim) % 16 != 0) return false;
  }
  return true;
}

torch::Tensor aligned_copy(const torch::Tensor& t) {
  return aligned_rows(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

#ifdef XLME_WITH_CUDA

namespace {

// The driver calls a launch needs, resolved through the CUDA runtime (as c10's DriverAPI does):
// LibTorch already loads the runtime, and the runtime finds the driver.
struct Driver {
  decltype(&cuModuleLoadData) module_load_data = nullptr;
  decltype(&cuModuleGetFunction) module_get_function = nullptr;
  decltype(&cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&cuLaunchKernel) launch_kernel = nullptr;
  decltype(&cuGetErrorString) get_error_string = nullptr;
  decltype(&cuCtxGetCurrent) ctx_get_current = nullptr;
};

template <typename F>
void resolve(const char* name, F* out) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult status{};
  C10_CUDA_CHECK(
      cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &status));
  XLME_CHECK(status == cudaDriverEntryPointSuccess && function != nullptr,
             "the CUDA driver has no {} (CUDA 12.0 or later needed for xlme's Triton kernels)",
             name);
  *out = reinterpret_cast<F>(function);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    resolve("cuModuleLoadData", &r.module_load_data);
    resolve("cuModuleGetFunction", &r.module_get_function);
    resolve("cuFuncSetAttribute", &r.func_set_attribute);
    resolve("cuLaunchKernel", &r.launch_kernel);
    resolve("cuGetErrorString", &r.get_error_string);
    resolve("cuCtxGetCurrent", &r.ctx_get_current);
    return r;
  }();
  return d;
}

void check_driver(CUresult result, const char* what, const KernelImage& image) {
  if (result == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (driver().get_error_string(result, &text) != CUDA_SUCCESS) text = "unknown error";
  XLME_FAIL("{} for Triton kernel {} ({}): CUDA driver error {}: {}", what, image.variant,
            image.arch, static_cast<int>(result), text);
}

struct Loaded {
  const KernelImage* image = nullptr;
  CUfunction function = nullptr;
};

// Loads each (variant, device) once; modules stay loaded for the process.
Loaded load(const std::string& variant, const torch::Device& device) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, Loaded> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(variant, static_cast<int>(device.index()));
  const auto found = loaded.find(key);
  if (found != loaded.end()) return found->second;
  const KernelImage* image = &image_for(variant, device);
  CUcontext context = nullptr;
  check_driver(driver().ctx_get_current(&context), "cuCtxGetCurrent", *image);
  if (context == nullptr) C10_CUDA_CHECK(cudaFree(nullptr));  // makes the primary context current
  CUmodule module = nullptr;
  check_driver(driver().module_load_data(&module, image->cubin), "cuModuleLoadData", *image);
  Loaded result{image, nullptr};
  check_driver(driver().module_get_function(&result.function, module, image->entry),
               "cuModuleGetFunction", *image);
  if (image->shared_bytes > 48 * 1024) {
    check_driver(
        driver().func_set_attribute(
            result.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, image->shared_bytes),
        "cuFuncSetAttribute", *image);
  }
  loaded.emplace(key, result);
  return result;
}

}  // namespace

PhiloxArgs philox_inputs(const torch::Device& device) {
  auto generator = at::cuda::detail::getDefaultCUDAGenerator(device.index());
  std::lock_guard<std::mutex> lock(generator.mutex());
  const auto state = at::check_generator<at::CUDAGeneratorImpl>(generator)->philox_cuda_state(4);
  return state.captured_
             ? philox_args(true, 0, 0, state.seed_.ptr, state.offset_.ptr, state.offset_intragraph_)
             : philox_args(false, state.seed_.val, state.offset_.val, nullptr, nullptr, 0);
}

const KernelImage& image_for(const std::string& variant, const torch::Device& device) {
  const auto* properties = at::cuda::getDeviceProperties(device.index());
  const KernelImage* image = find_image(variant, properties->major, properties->minor);
  XLME_CHECK(image != nullptr,
             "no compiled Triton kernel {} for {} (compute capability {}.{}); xlme compiles them "
             "for sm_90a and sm_80: set XLME_OPS=reference to run without them",
             variant, properties->name, properties->major, properties->minor);
  return *image;
}

std::string aligned_variant(const std::string& variant, const torch::Device& device,
                            const std::vector<Arg>& args) {
  const auto* properties = at::cuda::getDeviceProperties(device.index());
  return aligned_variant(variant, properties->major, properties->minor, args);
}

bool available(const std::string& variant, const torch::Device& device) {
  if (!device.is_cuda()) return false;
  const auto* properties = at::cuda::getDeviceProperties(device.index());
  return find_image(variant, properties->major, properties->minor) != nullptr;
}

void launch(const std::string& variant, const torch::Device& device, const Grid& grid,
            std::vector<Arg> args, const std::string& what) {
  XLME_CHECK(device.is_cuda() && device.has_index(),
             "Triton kernel {} launches on a CUDA device with an index, not {}", variant,
             device.str());
  check_grid(variant, grid, what);
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  const Loaded kernel = load(variant, device);
  check_args(*kernel.image, args);
  // Triton's kernels take two more pointers after their own arguments (global and profiling
  // scratch); aot.py refuses kernels that need either, so both are null.
  CUdeviceptr global_scratch = 0, profile_scratch = 0;
  std::vector<void*> params;
  params.reserve(args.size() + 2);
  for (auto& arg : args) params.push_back(arg.address());
  params.push_back(&global_scratch);
  params.push_back(&profile_scratch);
  const auto stream = c10::cuda::getCurrentCUDAStream(device.index());
  check_driver(
      driver().launch_kernel(kernel.function, static_cast<unsigned>(grid[0]),
                             static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2]),
                             32 * static_cast<unsigned>(kernel.image->num_warps), 1, 1,
                             static_cast<unsigned>(kernel.image->shared_bytes), stream.stream(),
                             params.data(), nullptr),
      "cuLaunchKernel", *kernel.image);
  count_launch(variant);
}

#else  // a LibTorch without CUDA: nothing launches

PhiloxArgs philox_inputs(const torch::Device& device) {
  XLME_FAIL("no CUDA generator for {}: this xlme was built without CUDA", device.str());
}

const KernelImage& image_for(const std::string& variant, const torch::Device& device) {
  XLME_FAIL("no Triton kernel {} on {}: this xlme was built without CUDA", variant, device.str());
}

std::string aligned_variant(const std::string& variant, const torch::Device&,
                            const std::vector<Arg>&) {
  return variant;
}

bool available(const std::string&, const torch::Device&) {
  return false;
}

void launch(const std::string& variant, const torch::Device& device, const Grid&, std::vector<Arg>,
            const std::string&) {
  XLME_FAIL("Triton kernel {} cannot launch on {}: this xlme was built without CUDA", variant,
            device.str());
}

#endif

}  // namespace xlme::ops::triton
