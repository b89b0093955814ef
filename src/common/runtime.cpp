#include "xlme/common/runtime.h"

#include <torch/version.h>
#include "xlme/common/error.h"

#include <dlfcn.h>
#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#include <malloc.h>
#endif
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace xlme::runtime {
namespace {

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

std::string blas_name() {
  return at::hasMKL() ? "MKL, linked into LibTorch" : "LibTorch's built-in BLAS";
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

namespace {

// A count in [1, 4096] from the start of `text` ("8", "8(x2)"), or 0.
int leading_count(const char* text) {
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long parsed = std::strtol(text, &end, 10);
  return end != text && parsed >= 1 && parsed <= 4096 ? static_cast<int>(parsed) : 0;
}

}  // namespace

LocalRanks local_ranks_from_env() {
  if (const int n = leading_count(std::getenv("LOCAL_WORLD_SIZE"))) return {n, "LOCAL_WORLD_SIZE"};
  if (const int n = leading_count(std::getenv("SLURM_NTASKS_PER_NODE"))) {
    return {n, "SLURM_NTASKS_PER_NODE"};
  }
  // SLURM_TASKS_PER_NODE lists the nodes' counts in order ("2(x3),1"); SLURM_NODEID picks ours.
  const char* tasks = std::getenv("SLURM_TASKS_PER_NODE");
  if (tasks != nullptr && *tasks != '\0') {
    const char* node_id = std::getenv("SLURM_NODEID");
    long node = node_id != nullptr ? std::strtol(node_id, nullptr, 10) : 0;
    for (const char* p = tasks; *p != '\0';) {
      char* end = nullptr;
      const long count = std::strtol(p, &end, 10);
      if (end == p || count < 1) break;
      long repeat = 1;
      if (end[0] == '(' && end[1] == 'x') {
        repeat = std::strtol(end + 2, &end, 10);
        if (*end == ')') ++end;
      }
      if (node < repeat) return {static_cast<int>(std::min(count, 4096L)), "SLURM_TASKS_PER_NODE"};
      node -= repeat;
      p = *end == ',' ? end + 1 : end;
    }
  }
  return {1, ""};
}

ThreadSettings configure_threads(int64_t requested, const LocalRanks& counted) {
  ThreadSettings settings;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (requested > 0) {
    settings.intra_op = static_cast<int>(requested);
    settings.source = "run.threads";
  } else if (omp != nullptr && *omp != '\0') {
    // The launcher's share of the node's cores (torchrun sets 1 per rank unless told otherwise;
    // a SLURM script sets $SLURM_CPUS_PER_TASK). OpenMP allows a list per nesting level ("4,2"):
    // the first is this level's.
    char* end = nullptr;
    const long parsed = std::strtol(omp, &end, 10);
    XLME_CHECK(end != omp && (*end == '\0' || *end == ',') && parsed >= 1 && parsed <= 4096,
               "OMP_NUM_THREADS='{}' is not a thread count in [1, 4096]; set it to the cores each "
               "process may use, or set run.threads",
               omp);
    settings.intra_op = static_cast<int>(parsed);
    settings.source = "OMP_NUM_THREADS";
  } else if (const LocalRanks local =
                 local_ranks_from_env().count > 1 ? local_ranks_from_env() : counted;
             local.count > 1) {
    // Several ranks on this host, each with every core: divide them.
    const int cores = available_cores();
    settings.intra_op = std::max(1, cores / local.count);
    settings.source =
        fmt::format("{} cores / {} local ranks ({})", cores, local.count, local.source);
  } else {
    settings.intra_op = available_cores();
    settings.source = "every available core";
  }
  at::set_num_threads(settings.intra_op);
  settings.own_loops = parallel_loop_threads();
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  settings.omp_wait_policy = policy ? policy : "";
  return settings;
}

int parallel_loop_threads() {
  const int threads = at::get_num_threads();
  std::vector<char> used(static_cast<size_t>(threads), 0);
  // One item per task (grain 1), so that each thread gets one.
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    const int thread = at::get_thread_num();
    if (begin < end && thread >= 0 && thread < threads) used[static_cast<size_t>(thread)] = 1;
  });
  return static_cast<int>(std::count(used.begin(), used.end(), 1));
}

AllocatorInfo detect_allocator() {
  AllocatorInfo info;
  void* malloc_symbol = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info where{};
  if (malloc_symbol == nullptr || dladdr(malloc_symbol, &where) == 0 ||
      where.dli_fname == nullptr) {
    info.name = "unknown";
    return info;
  }
  char resolved[PATH_MAX];
  info.library = realpath(where.dli_fname, resolved) ? resolved : where.dli_fname;
  const std::string file = std::filesystem::path(info.library).filename().string();
  if (contains(file, "tcmalloc")) {
    info.name = "tcmalloc";
  } else if (contains(file, "jemalloc")) {
    info.name = "jemalloc";
  } else if (file.rfind("libc.so", 0) == 0 || file.rfind("libc-", 0) == 0) {
    info.name = "glibc malloc";
    const char* choice = std::getenv("XLME_ALLOCATOR");
    if (choice != nullptr && std::string(choice) == "system") {
      info.note = "XLME_ALLOCATOR=system";
    } else if (tcmalloc_library().empty()) {
      info.note = "libtcmalloc-minimal4 is not installed; scripts/setup.sh installs it";
    } else {
      info.note = "tcmalloc is installed but was not preloaded";
    }
  } else {
    info.name = file;
  }
  return info;
}

std::string tcmalloc_library() {
  // The C library's folder (/lib/x86_64-linux-gnu on Debian, /lib64 elsewhere) and its /usr twin.
  std::vector<std::filesystem::path> folders;
#if defined(__GLIBC__)
  Dl_info where{};
  if (dladdr(reinterpret_cast<void*>(&gnu_get_libc_version), &where) != 0 &&
      where.dli_fname != nullptr) {
    const auto folder = std::filesystem::path(where.dli_fname).parent_path();
    folders.push_back(folder);
    if (folder.string().rfind("/lib", 0) == 0) folders.push_back("/usr" + folder.string());
  }
#endif
  folders.emplace_back("/usr/lib");
  folders.emplace_back("/usr/local/lib");
  for (const auto& folder : folders) {
    const auto candidate = folder / "libtcmalloc_minimal.so.4";
    std::error_code error;
    if (std::filesystem::exists(candidate, error)) return candidate.string();
  }
  return "";
}

std::string preload_with(const std::string& preload, const std::string& library) {
  if (preload.empty()) return library;
  // LD_PRELOAD separates its entries by colons or spaces.
  size_t start = 0;
  while (start <= preload.size()) {
    const size_t end = std::min(preload.find_first_of(": ", start), preload.size());
    if (preload.compare(start, end - start, library) == 0 && end - start == library.size()) {
      return preload;
    }
    start = end + 1;
  }
  return preload + ":" + library;
}

void ensure_process_defaults(char** argv) {
  const char* choice = std::getenv("XLME_ALLOCATOR");
  XLME_CHECK(
      choice == nullptr || std::string(choice) == "tcmalloc" || std::string(choice) == "system",
      "XLME_ALLOCATOR must be tcmalloc (the default) or system (glibc malloc), not '{}'",
      choice ? choice : "");
  const bool set_wait_policy = std::getenv("OMP_WAIT_POLICY") == nullptr;
  const char* user_preload = std::getenv("LD_PRELOAD");
  const std::string preload = user_preload ? user_preload : "";
  std::string wanted_preload = preload;
  if (choice == nullptr || std::string(choice) == "tcmalloc") {
    const std::string tcmalloc = tcmalloc_library();
    // Never twice: once LD_PRELOAD lists tcmalloc, a re-executed binary does not try again,
    // whether or not the loader could preload it.
    if (!tcmalloc.empty() && detect_allocator().name == "glibc malloc") {
      wanted_preload = preload_with(preload, tcmalloc);
    }
  }
  const bool set_preload = wanted_preload != preload;
  if (!set_wait_policy && !set_preload) return;
  if (set_wait_policy) setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);
  if (set_preload) setenv("LD_PRELOAD", wanted_preload.c_str(), /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // Only reached when the re-execution failed; the caller goes on as the process started.
  if (set_wait_policy) unsetenv("OMP_WAIT_POLICY");
  if (set_preload && user_preload != nullptr) setenv("LD_PRELOAD", preload.c_str(), 1);
  if (set_preload && user_preload == nullptr) unsetenv("LD_PRELOAD");
}

std::string address_space_note(const std::string& message) {
  const bool allocation_failed =
      contains(message, "can't allocate memory") || contains(message, "Cannot allocate memory") ||
      contains(message, "bad_alloc") || contains(message, "out of memory");
  rlimit limit{};
  if (!allocation_failed || getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return "";
  }
  // VmSize: the address space mapped now, libraries included.
  std::ifstream status("/proc/self/status");
  std::string line;
  double mapped_gib = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) mapped_gib = std::atof(line.c_str() + 7) / (1 << 20);
  }
  return fmt::format(
      " (this process runs under an address-space limit, ulimit -v, of {:.2f} GiB and has {:.2f} "
      "GiB mapped, most of it LibTorch's libraries: raise the limit, e.g. `ulimit -v unlimited`, "
      "before lowering the sizes)",
      static_cast<double>(limit.rlim_cur) / (1 << 30), mapped_gib);
}

bool release_free_memory() {
  using ReleaseFn = void (*)();
  if (auto release =
          reinterpret_cast<ReleaseFn>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"))) {
    release();  // tcmalloc: its free page spans go back to the OS
    return true;
  }
#if defined(__GLIBC__)
  malloc_trim(0);
  return true;
#else
  return false;
#endif
}

std::string build_description() {
  return fmt::format("xlme {} (LibTorch {}, {})", XLME_VERSION, TORCH_VERSION,
                     torch::cuda::is_available()
                         ? fmt::format("CUDA with {} GPU(s)", torch::cuda::device_count())
                         : std::string("CPU only"));
}

}  // namespace xlme::runtime
