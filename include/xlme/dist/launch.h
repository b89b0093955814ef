// Where this process sits in a multi-process job, read from the launcher's environment:
// torchrun (`torchrun --no-python`: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, and
// TORCHELASTIC_USE_AGENT_STORE / TORCHELASTIC_RESTART_COUNT when its agent serves the store) or
// SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, first host of SLURM_JOB_NODELIST, and without
// MASTER_PORT the port 15000 + SLURM_JOB_ID % 20000). Without either, a single process.
#pragma once

#include "xlme/common/torch_fwd.h"

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
  // torchrun's agent already serves a TCPStore at master_addr:master_port
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank connects to it as a client, rank 0 included.
  bool agent_store = false;
  // TORCHELASTIC_RESTART_COUNT: the agent's store outlives a restart of the workers, so each
  // attempt keeps its keys apart.
  int restart_count = 0;
};

// Reads the environment; throws xlme::Error naming the variable that is missing or malformed.
LaunchInfo launch_info_from_env();

// The one device this process computes and communicates on, from run.device ("auto", "cpu",
// "cuda") and the launch layout, given the number of GPUs this process sees. One process per GPU
// either way: with every GPU of the node visible (torchrun, `srun --gpus-per-node`) local rank r
// drives cuda:r; with one GPU visible per process (`srun --gpus-per-task=1`, or
// CUDA_VISIBLE_DEVICES set per task) every process drives cuda:0. Several processes sharing one
// visible GPU are allowed only in the second layout (tests: two Gloo ranks on one GPU). Throws
// naming LOCAL_RANK and the visible GPUs when neither layout fits.
c10::Device resolve_device(const std::string& requested, const LaunchInfo& launch,
                           int visible_gpus);

// resolve_device() with this process's visible GPUs, made the current CUDA device (before any
// CUDA allocation and before NCCL starts), so that every CUDA call of this process, the
// synchronizations and NCCL's communicator included, lands on it and no context is opened on
// GPU 0 by every rank. Call once, right after launch_info_from_env().
c10::Device use_device(const std::string& requested, const LaunchInfo& launch);

// A rank of several: asks the kernel to send this process SIGTERM when the process that started
// it ends, so that a launcher killed by a signal it does not handle (SIGUSR1 kills torchrun, whose
// workers run in sessions of their own) leaves no orphaned workers: they stop as on a preemption
// (checkpoint, exit code 75). Called by Communicator::create.
void stop_with_parent(const LaunchInfo& launch);

// The first host of a SLURM node list: "gpu[07-12,20],cpu1" -> "gpu07", "r[1-2]n[3-4]" -> "r1n3".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace xlme::dist
