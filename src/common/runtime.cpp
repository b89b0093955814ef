#include "xlme/common/runtime.h"

#include "xlme/common/error.h"
#include "xlme/common/torch_compat.h"

#include <dlfcn.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sched.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

namespace xlme::runtime {
namespace {

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

BlasInfo detect_blas() {
  BlasInfo info;
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info where{};
  if (sgemm == nullptr || dladdr(sgemm, &where) == 0 || where.dli_fname == nullptr) {
    info.name = "LibTorch's built-in BLAS";  // e.g. MKL linked statically into the CUDA wheel
    return info;
  }
  char resolved[PATH_MAX];
  info.library = realpath(where.dli_fname, resolved) ? resolved : where.dli_fname;
  std::string lower = info.library;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (contains(lower, "openblas")) {
    info.name = "OpenBLAS";
    using ConfigFn = char* (*)();
    if (auto config = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
      info.detail = config();
    }
  } else if (contains(lower, "mkl")) {
    info.name = "MKL";
  } else if (contains(lower, "blis")) {
    info.name = "BLIS";
  } else if (contains(lower, "atlas")) {
    info.name = "ATLAS";
  } else {
    info.name = "reference BLAS";
    info.reference = true;
  }
  return info;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

ThreadSettings configure_threads(int64_t requested) {
  ThreadSettings settings;
  settings.intra_op = requested > 0 ? static_cast<int>(requested) : available_cores();
  at::set_num_threads(settings.intra_op);
  using SetThreadsFn = void (*)(int);
  if (auto set_blas =
          reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas(settings.intra_op);
    settings.blas = settings.intra_op;
  }
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  settings.omp_wait_policy = policy ? policy : "";
  return settings;
}

void ensure_passive_omp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // Only reached when the re-execution failed; the caller goes on with spinning threads.
  unsetenv("OMP_WAIT_POLICY");
}

bool release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
  return true;
#else
  return false;
#endif
}

std::string build_description() {
  return fmt::format(
      "xlme {} (LibTorch {}, {}, fused attention: {})", XLME_VERSION, compat::kTorchVersion,
      torch::cuda::is_available() ? fmt::format("CUDA with {} GPU(s)", torch::cuda::device_count())
                                  : std::string("CPU only"),
      compat::kHasScaledDotProductAttention ? "yes" : "no");
}

}  // namespace xlme::runtime
