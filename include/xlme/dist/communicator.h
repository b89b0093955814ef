// Collectives over a c10d process group (NCCL on CUDA, Gloo on CPU), with the rendezvous, the
// start-up check and the gradient all-reduce the trainer needs. With one process there is no
// process group and every collective returns at once, so the trainer has a single code path.
#pragma once

#include "xlme/common/error.h"
#include "xlme/dist/launch.h"

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace xlme::dist {

enum class ScalarOp { kSum, kMin, kMax };

// A sum over ranks started and not yet read (Communicator::start_sum).
class PendingSum {
 public:
  PendingSum() = default;
  explicit PendingSum(std::function<double()> read) : read_(std::move(read)) {}
  bool pending() const { return static_cast<bool>(read_); }
  // Waits for the sum (on a GPU: only for the work queued before the collective, not for what
  // was queued after it) and returns it; afterwards pending() is false.
  double get();

 private:
  std::function<double()> read_;
};

// A collective started and not yet waited for (Communicator::start_all_reduce_sum,
// start_reduce_scatter_sum).
class PendingWork {
 public:
  PendingWork() = default;
  explicit PendingWork(std::function<void()> wait) : wait_(std::move(wait)) {}
  bool pending() const { return static_cast<bool>(wait_); }
  // Waits for the collective (on a GPU: orders the current stream after it); afterwards pending()
  // is false. Throws xlme::Error when the collective failed.
  void wait();

 private:
  std::function<void()> wait_;
};

// How long the rendezvous and the collectives may take, and how a lost rank is noticed.
struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};         // each collective
  std::chrono::milliseconds startup_timeout{std::chrono::minutes(5)};  // joining the rendezvous
  // A rank not heard from for this long (dead, frozen, unreachable) stops every rank, naming it;
  // zero: no heartbeat, a lost rank is noticed by the collectives' timeout alone.
  std::chrono::milliseconds heartbeat{0};
  // Polled while the rendezvous waits: true stops it with RendezvousInterrupted (a stop signal).
  std::function<bool()> stop_requested;
};

// Communicator::create gave up the rendezvous because stop_requested() turned true: no step ran,
// nothing is lost, the same command starts again.
class RendezvousInterrupted : public Error {
 public:
  using Error::Error;
};

// Communicator::create found that another process had already joined the rendezvous with this
// rank: this process stops before it writes anything the job reads (heartbeat, host, verdict).
class DuplicateRank : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  // Connects to the rendezvous (a TCPStore served by rank 0 at master_addr:master_port, or by
  // torchrun's agent), checks that every rank answers within options.startup_timeout (naming the
  // ranks that do not; a stop signal ends the wait at once), starts the heartbeat, creates the
  // process group and runs one all-reduce to prove it. `device`: this process's device
  // (dist::use_device): every tensor a collective takes must live there, with one process too.
  // `backend`: "gloo", "nccl" or "auto" (nccl on a CUDA device, else gloo). Throws xlme::Error
  // with what to check.
  static std::shared_ptr<Communicator> create(const LaunchInfo& launch, const torch::Device& device,
                                              const std::string& backend,
                                              const CommOptions& options);
  // One timeout for the rendezvous and the collectives, no heartbeat (tests, one process).
  static std::shared_ptr<Communicator> create(const LaunchInfo& launch, const torch::Device& device,
                                              const std::string& backend,
                                              std::chrono::milliseconds timeout);
  // A normal end tells the other ranks' heartbeat that this rank left (rank 0, serving the store,
  // waits a moment for them to leave too); an end by an exception tells them it failed, so that
  // they stop at once instead of waiting for a collective's timeout.
  ~Communicator();

  int rank() const { return launch_.rank; }
  int world_size() const { return launch_.world_size; }
  int local_rank() const { return launch_.local_rank; }
  const std::string& backend() const { return backend_; }
  const torch::Device& device() const { return device_; }

  // In place, on every rank. Every tensor must be on device(): one on another device is an error
  // naming both, checked with one process as well, so that a CPU run catches what NCCL would
  // refuse.
  void all_reduce_sum(std::vector<torch::Tensor>& tensors);
  void broadcast(std::vector<torch::Tensor>& tensors, int root);
  void barrier();
  // Starts the sum of one host value over ranks and returns at once: the trainer agrees on stop
  // signals with it without draining the GPU's queue (the result is copied to pinned host memory
  // behind the collective, and get() waits for that copy alone).
  PendingSum start_sum(double value);
  // Host values reduced over ranks, through a float64 tensor the communicator creates on its own
  // device (exact for integers below 2^53). One synchronization.
  std::vector<double> reduce_scalars(const std::vector<double>& values, ScalarOp op);
  // Starts the in-place sum of `tensor` over the ranks and returns at once: the trainer sends each
  // gradient bucket while the backward pass computes the next ones. One process: nothing to wait.
  PendingWork start_all_reduce_sum(torch::Tensor tensor);
  // Starts a reduce-scatter: `input` [world * n] summed over the ranks, rank r's slice
  // [r * n, (r + 1) * n) of the sum written into `output` [n].
  PendingWork start_reduce_scatter_sum(torch::Tensor input, torch::Tensor output);
  // Every rank's `input` [n] into `output` [world * n], rank r's at [r * n, (r + 1) * n).
  void all_gather(torch::Tensor input, torch::Tensor output);
  // Every rank's `value`, in rank order, exchanged through the rendezvous store (start-up checks
  // that must name what differs between ranks; small strings). Every rank calls it in the same
  // order.
  std::vector<std::string> all_gather_strings(const std::string& value);

 private:
  struct Group;  // the store, process group and heartbeat, hidden to keep c10d out of this header
  Communicator(LaunchInfo launch, torch::Device device, std::string backend);
  void check_devices(const std::vector<torch::Tensor>& tensors, const char* collective) const;

  LaunchInfo launch_;
  torch::Device device_;
  std::string backend_;
  std::unique_ptr<Group> group_;  // null with one process
  int64_t string_exchanges_ = 0;  // all_gather_strings calls so far: each has its own keys
};

// Every rank gets rank `root`'s values of `params` (parameters and buffers), in place.
void broadcast_tensors(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root = 0);

// Sums (or averages) the gradients of `params` over ranks in flat buckets of at most
// `bucket_bytes`, one collective per bucket. A parameter without a gradient contributes zeros
// (and gets a zero gradient), so every rank runs the same collectives.
void all_reduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& params,
                          int64_t bucket_bytes, bool average);

}  // namespace xlme::dist
