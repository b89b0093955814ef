// Collectives over a c10d process group (NCCL on CUDA, Gloo on CPU), with the rendezvous, the
// start-up check and the gradient all-reduce the trainer needs. With one process there is no
// process group and every collective returns at once, so the trainer has a single code path.
#pragma once

#include "xlme/dist/launch.h"

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace xlme::dist {

class Communicator {
 public:
  // Connects to the rendezvous (a TCPStore served by rank 0 at master_addr:master_port), checks
  // that every rank answers within `timeout` (naming the ranks that do not), creates the process
  // group and runs one all-reduce to prove it. `backend`: "gloo", "nccl" or "auto" (nccl when
  // CUDA is available). Throws xlme::Error with what to check.
  static std::shared_ptr<Communicator> create(const LaunchInfo& launch, const std::string& backend,
                                              std::chrono::milliseconds timeout);
  ~Communicator();

  int rank() const { return launch_.rank; }
  int world_size() const { return launch_.world_size; }
  int local_rank() const { return launch_.local_rank; }
  const std::string& backend() const { return backend_; }

  // In place, on every rank; all tensors on the backend's device (CUDA for NCCL).
  void all_reduce_sum(std::vector<torch::Tensor>& tensors);
  void broadcast(std::vector<torch::Tensor>& tensors, int root);
  void barrier();

 private:
  struct Group;  // the store and process group, hidden to keep c10d out of this header
  Communicator(LaunchInfo launch, std::string backend);

  LaunchInfo launch_;
  std::string backend_;
  std::unique_ptr<Group> group_;  // null with one process
};

// Every rank gets rank `root`'s values of `params` (parameters and buffers), in place.
void broadcast_tensors(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root = 0);

// Sums (or averages) the gradients of `params` over ranks in flat buckets of at most
// `bucket_bytes`, one collective per bucket. A parameter without a gradient contributes zeros
// (and gets a zero gradient), so every rank runs the same collectives.
void all_reduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& params,
                          int64_t bucket_bytes, bool average);

}  // namespace xlme::dist
