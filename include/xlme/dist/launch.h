// Where this process sits in a multi-process job, read from the launcher's environment:
// torchrun (`torchrun --no-python`: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or
// SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, first host of SLURM_JOB_NODELIST). Without
// either, a single process.
#pragma once

#include <cstdint>
#include <string>

namespace xlme::dist {

struct LaunchInfo {
  std::string launcher = "none";  // "none", "torchrun" or "slurm"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Reads the environment; throws xlme::Error naming the variable that is missing or malformed.
LaunchInfo launch_info_from_env();

// The first host of a SLURM node list: "gpu[07-12,20],cpu1" -> "gpu07", "r[1-2]n[3-4]" -> "r1n3".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace xlme::dist
