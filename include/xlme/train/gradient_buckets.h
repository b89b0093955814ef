// The trained parameters' gradients as views of flat buffers ("buckets" of at most dist.bucket_mb,
// in the reverse of the parameters' order: roughly the order in which the backward pass finishes
// them), so that a bucket is summed over the ranks with one collective and no copy, and, with
// dist.overlap, sent during the step's last backward pass as soon as its last gradient is final
// (each parameter's post-accumulate-grad hook counts it), while the backward computes the others.
// Buckets are always sent in their order, on every rank, whatever order they complete in: the
// ranks' collectives match. With ZeRO-1 a bucket is reduce-scattered instead, each rank keeping the
// summed gradients of its own slice of every bucket (docs/pretraining.md#scaling-to-64-gpus).
#pragma once

#include "xlme/dist/communicator.h"
#include "xlme/optim/zero.h"

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace xlme::train {

class GradientBuckets {
 public:
  enum class Reduction {
    kAllReduce,      // every rank gets every summed gradient
    kReduceScatter,  // ZeRO-1: each rank gets its shard of them (shard())
  };

  // `parameters`: the trainer's (those without requires_grad get no bucket); `bucket_bytes`: the
  // most bytes of gradients in one bucket (one parameter larger than that has its own).
  GradientBuckets(const std::vector<torch::Tensor>& parameters, int64_t bucket_bytes,
                  dist::Communicator& comm, Reduction reduction);
  ~GradientBuckets();  // the hooks go with it
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Before a step's (or the dry run's) first backward: allocates (or zeroes) the buckets, makes
  // every trained parameter's .grad its view into them (a backward adds to it in place) and
  // forgets which parameters got a gradient.
  void attach();
  // After the optimizer step (the parameters' .grad dropped): frees the buckets, so that the
  // forward passes of the next step have that memory, as when the gradients were separate
  // tensors set to none after each step; kept (only detached) after keep_allocated(true).
  void release();
  // CUDA graphs (micro_batch_graphs.h) add into the buckets' memory at the addresses it had when
  // they were captured: with `keep`, release() keeps the buffers and attach() zeroes them.
  void keep_allocated(bool keep) { keep_allocated_ = keep; }
  // Between these two calls, which parameters' hooks ran (a backward that a CUDA graph captures:
  // its replays run no hook), in parameter order.
  void start_recording();
  std::vector<std::size_t> stop_recording();
  // Marks parameters as having got a gradient since attach() (after a graph's replay).
  void mark_present(const std::vector<std::size_t>& indices);
  // Before the step's last backward: with `overlap`, each bucket is sent from the hook that
  // completes it (once those before it are sent).
  void arm(bool overlap);
  // After the last backward: sends every bucket not sent yet, in order. The step's other
  // collectives come after it, so that every rank issues the same sequence.
  void flush();
  // Waits for every bucket sent.
  void wait();

  // Whether parameter `i` (an index into `parameters`) got a gradient since attach().
  bool present(std::size_t i) const { return present_[i] != 0; }
  // Buckets sent from a hook during the last backward pass (the others by flush()).
  int64_t sent_during_backward() const { return sent_during_backward_; }
  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }

  // ZeRO-1. [shard_size()] this rank's slice of every bucket's summed gradients, after wait().
  const torch::Tensor& shard() const { return shard_; }
  int64_t shard_size() const { return shard_.numel(); }
  // The parameters' elements that lie in this rank's slices.
  const std::vector<optim::ShardSegment>& segments() const { return segments_; }
  // After each rank stepped its slices: every rank's updated elements into every rank's
  // parameters (one all-gather per bucket).
  void all_gather_parameters();
  // Every rank's `values` [shard_size()] (e.g. an AdamW moment) gathered, one bucket at a time
  // (the device holds one bucket's worth more), into one host tensor per parameter, shaped like
  // it (undefined for the untrained ones), on the rank that asks to `keep` them; empty elsewhere.
  // Every rank calls it.
  std::vector<torch::Tensor> gather_whole(const torch::Tensor& values, bool keep);

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into parameters_
    int64_t elements = 0;             // padded to a multiple of the ranks (ZeRO-1)
    torch::TensorOptions options;     // the parameters' dtype and device
    torch::Tensor flat;               // [elements]; undefined between steps (release())
    int64_t shard_offset = 0;         // where this rank's slice of it lies in shard_
  };
  struct Slot {
    std::size_t bucket = 0;
    int64_t offset = 0;  // of the parameter's elements in the bucket's flat buffer
  };
  void install_hooks();
  // Called by parameter `index`'s hook after a backward added to its gradient.
  void on_gradient(std::size_t index);
  void send(std::size_t bucket);
  int64_t slice_size(const Bucket& bucket) const;

  std::vector<torch::Tensor> parameters_;
  dist::Communicator& comm_;
  Reduction reduction_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;     // per parameter (untrained ones: unused)
  std::vector<char> present_;   // per parameter, since attach()
  std::vector<char> counted_;   // per parameter, in the armed backward
  std::vector<char> recorded_;  // per parameter, since start_recording()
  bool recording_ = false;
  bool keep_allocated_ = false;
  std::vector<std::size_t> complete_;  // per bucket: parameters counted in the armed backward
  std::vector<dist::PendingWork> pending_;
  std::size_t next_ = 0;  // the first bucket not sent yet
  bool armed_ = false;
  bool overlap_ = false;
  int64_t sent_during_backward_ = 0;
  torch::Tensor shard_;  // ZeRO-1: [sum of the slices]
  std::vector<optim::ShardSegment> segments_;
  std::mutex mutex_;  // the hooks run on the autograd engine's thread
};

}  // namespace xlme::train
