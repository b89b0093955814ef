// The front of each binary (xlme-data, xlme-pretrain, xlme-finetune, xlme-export): it checks the
// process's address-space limit (`ulimit -v`, RLIMIT_AS) against what the program's libraries
// map, then runs the program (libexec/<name> beside it) in its own place, same process and
// arguments. LibTorch with CUDA, cuBLAS, cuDNN and NCCL maps its libraries before main() runs,
// even for a CPU run: under a lower limit the dynamic loader fails with "failed to map segment
// from shared object" and exit code 127, naming neither the limit nor what would do. This front
// links nothing beyond the C and C++ runtimes, so it can say both. The program's need is written
// at build time beside it (src/apps/address_space.py).
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

// Start-up beyond the libraries' mappings: the main stack, the heap of LibTorch's static
// registrations, the loader's own allocations and its alignment reservations.
constexpr uint64_t kStartupBytes = uint64_t{192} << 20;

std::string own_folder() {
  std::vector<char> path(4096);
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return ".";
  const std::string exe(path.data(), static_cast<size_t>(n));
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "." : exe.substr(0, slash);
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

struct Need {
  uint64_t bytes = 0;                // what the loader maps for the program and its libraries
  std::vector<std::string> largest;  // "libcublasLt.so.13 606 MiB", largest first
};

// The file address_space.py writes: "<bytes> total", then "<bytes> <library>" largest first.
bool read_need(const std::string& file, Need& need) {
  std::ifstream in(file);
  std::string name;
  if (!(in >> need.bytes >> name) || name != "total") return false;
  uint64_t bytes = 0;
  while (need.largest.size() < 4 && in >> bytes >> name) {
    need.largest.push_back(name + " " + std::to_string(bytes >> 20) + " MiB");
  }
  return true;
}

// Returns false (after saying why) when the limit leaves too little for the program to start.
bool address_space_suffices(const char* name, const std::string& program) {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return true;
  Need need;
  if (!read_need(program + ".address-space", need)) return true;  // unknown: let the loader try
  const uint64_t wanted = need.bytes + kStartupBytes;
  if (limit.rlim_cur >= wanted) return true;
  std::string libraries;
  for (const auto& library : need.largest) libraries += (libraries.empty() ? "" : ", ") + library;
  // `ulimit -v` counts KiB; suggest whole GiB above what start-up needs.
  const uint64_t suggested_gib = (wanted >> 30) + 2;
  std::fprintf(stderr,
               "%s: the address-space limit (ulimit -v) is %s (%" PRIu64
               " KiB), but this program maps %s of libraries before it starts (LibTorch with "
               "CUDA, cuBLAS, cuDNN and NCCL, loaded even for a CPU run; largest: %s): it needs %s "
               "to start, and more for a run's model and data. Raise the limit, e.g. `ulimit -v "
               "%" PRIu64 "` (%" PRIu64
               " GiB; ulimit counts KiB), or remove it (`ulimit -v "
               "unlimited`)",
               name, gib(limit.rlim_cur).c_str(), static_cast<uint64_t>(limit.rlim_cur) >> 10,
               gib(need.bytes).c_str(), libraries.c_str(), gib(wanted).c_str(), suggested_gib << 20,
               suggested_gib);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < wanted) {
    std::fprintf(stderr,
                 "; the hard limit is %s too: on a cluster, ask for a larger "
                 "virtual-memory limit\n",
                 gib(limit.rlim_max).c_str());
  } else {
    std::fprintf(stderr, "; the hard limit allows it (`ulimit -S -v` raises the soft one)\n");
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  (void)argc;
  const char* name = XLME_PROGRAM;
  const std::string program = own_folder() + "/libexec/" + name;
  if (!address_space_suffices(name, program)) return 1;
  execv(program.c_str(), argv);
  std::fprintf(stderr, "%s: cannot run %s: %s; build it with scripts/setup.sh\n", name,
               program.c_str(), std::strerror(errno));
  return 127;
}
