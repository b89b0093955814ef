#include "xlme/dist/launch.h"

#include "xlme/common/error.h"

#include <torch/cuda.h>
#ifdef XLME_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <limits>

namespace xlme::dist {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

int env_int(const char* name, const char* launcher, int min, int max) {
  const char* value = env(name);
  XLME_CHECK(value != nullptr, "{} launch: environment variable {} is not set", launcher, name);
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  XLME_CHECK(*end == '\0' && parsed >= min && parsed <= max,
             "{} launch: environment variable {}='{}' is not an integer in [{}, {}]", launcher,
             name, value, min, max);
  return static_cast<int>(parsed);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  std::size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    // A bracket group "[07-12,20]": the first number of its first range.
    const std::size_t close = nodelist.find(']', i);
    XLME_CHECK(close != std::string::npos, "SLURM_JOB_NODELIST='{}': unbalanced '['", nodelist);
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    const std::size_t stop = group.find_first_of("-,");
    const std::string first = group.substr(0, stop);
    XLME_CHECK(!first.empty(), "SLURM_JOB_NODELIST='{}': empty range in '[{}]'", nodelist, group);
    host += first;
    i = close + 1;
  }
  XLME_CHECK(!host.empty(), "SLURM_JOB_NODELIST='{}' names no host", nodelist);
  return host;
}

LaunchInfo launch_info_from_env() {
  LaunchInfo info;
  constexpr int kMaxRanks = 1 << 20;
  if (env("RANK") != nullptr || env("WORLD_SIZE") != nullptr) {
    info.launcher = "torchrun";
    info.world_size = env_int("WORLD_SIZE", "torchrun", 1, kMaxRanks);
    info.rank = env_int("RANK", "torchrun", 0, info.world_size - 1);
    info.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK", "torchrun", 0, kMaxRanks) : 0;
    if (info.world_size > 1) {
      XLME_CHECK(env("MASTER_ADDR") != nullptr,
                 "torchrun launch: environment variable MASTER_ADDR is not set (WORLD_SIZE={})",
                 info.world_size);
      info.master_addr = env("MASTER_ADDR");
      info.master_port = env_int("MASTER_PORT", "torchrun", 1, 65535);
    }
    // PyTorch's own rendezvous compares with Python's str(True) the same way.
    const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
    info.agent_store = agent_store != nullptr && std::string(agent_store) == "True";
    if (env("TORCHELASTIC_RESTART_COUNT") != nullptr) {
      info.restart_count =
          env_int("TORCHELASTIC_RESTART_COUNT", "torchrun", 0, std::numeric_limits<int>::max());
    }
  } else if (env("SLURM_PROCID") != nullptr) {
    info.launcher = "slurm";
    info.world_size = env_int("SLURM_NTASKS", "SLURM", 1, kMaxRanks);
    info.rank = env_int("SLURM_PROCID", "SLURM", 0, info.world_size - 1);
    info.local_rank = env("SLURM_LOCALID") ? env_int("SLURM_LOCALID", "SLURM", 0, kMaxRanks) : 0;
    if (info.world_size > 1) {
      if (const char* addr = env("MASTER_ADDR")) {
        info.master_addr = addr;
      } else {
        XLME_CHECK(env("SLURM_JOB_NODELIST") != nullptr,
                   "SLURM launch: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set");
        info.master_addr = first_slurm_host(env("SLURM_JOB_NODELIST"));
      }
      if (env("MASTER_PORT") != nullptr) {
        info.master_port = env_int("MASTER_PORT", "SLURM", 1, 65535);
      } else if (env("SLURM_JOB_ID") != nullptr) {
        // A port per job (as several launchers derive it), so that two jobs sharing a node do not
        // meet at a fixed 29500; every rank of the job computes the same one.
        const int job = env_int("SLURM_JOB_ID", "SLURM", 0, std::numeric_limits<int>::max());
        info.master_port = 15000 + job % 20000;
      }
    }
  }
  return info;
}

void stop_with_parent(const LaunchInfo& launch) {
  if (launch.world_size < 2) return;
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have ended before the request: then stop now, as the kernel would have.
  if (::getppid() != parent) ::raise(SIGTERM);
}

torch::Device resolve_device(const std::string& requested, const LaunchInfo& launch,
                             int visible_gpus) {
  XLME_CHECK(requested == "auto" || requested == "cpu" || requested == "cuda",
             "run.device must be auto, cpu or cuda, not '{}'", requested);
  if (requested == "cpu" || (requested == "auto" && visible_gpus == 0)) return torch::kCPU;
  XLME_CHECK(visible_gpus > 0,
             "run.device is cuda but this process sees no CUDA device (this build: {}); use "
             "run.device=cpu or auto, or check CUDA_VISIBLE_DEVICES",
             torch::cuda::is_available() ? "CUDA" : "CPU only");
  if (visible_gpus == 1) return torch::Device(torch::kCUDA, 0);
  XLME_CHECK(launch.local_rank < visible_gpus,
             "local rank {} ({} launch) has no GPU of its own: this process sees {} GPUs, "
             "cuda:0..cuda:{}. Launch at most {} processes per node, or give each process one "
             "GPU (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES per process)",
             launch.local_rank, launch.launcher, visible_gpus, visible_gpus - 1, visible_gpus);
  return torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(launch.local_rank));
}

torch::Device use_device(const std::string& requested, const LaunchInfo& launch) {
  const int visible =
      torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const torch::Device device = resolve_device(requested, launch, visible);
#ifdef XLME_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#endif
  return device;
}

}  // namespace xlme::dist
