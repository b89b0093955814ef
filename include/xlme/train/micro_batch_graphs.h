// CUDA graphs of the micro-batch forward and backward (train.cuda_graphs; docs/gpu.md#cuda-graphs).
//
// A Base micro-batch launches a few thousand kernels, and on a GPU the host's launch overhead is a
// fixed cost per micro-batch that does not shrink with its size. A CUDA graph records those
// launches once and replays them with one call. A graph replays fixed addresses and shapes, so:
// - each micro-batch shape [task, rows x length, generator rows] has its own graph, and the
//   generator's rows are padded to one count per shape (model::ModelInputs::padded_masked,
//   model::masked_capacity), so that MRTD's fixed 512-token rows repeat one shape;
// - the inputs and the step's loss normalizers are copied into tensors the graph reads;
// - the gradients are the gradient buckets' memory, kept allocated between steps;
// - a shape's first kWarmup micro-batches run eagerly on the graphs' stream (lazy initialization,
//   cuBLAS workspaces), the next is captured and replayed, later ones are replayed;
// - the step's last micro-batch always runs eagerly: its backward sends the gradient buckets from
//   hooks (dist.overlap), which a replay does not run;
// - autocast's weight cache is off while capturing: the graph casts the weights it reads in every
//   replay (a cached copy would be freed when the step's autocast scope ends);
// - the random draws (dropout, the generator's samples) use LibTorch's graph-safe Philox state:
//   a replay draws what the eager micro-batch would. The fused Triton kernels that draw read the
//   generator's seed and offset on the device under a capture, as LibTorch's kernels do
//   (ops::triton::PhiloxArgs); `auto` keeps their references here until a GPU run checks them.
// A failed capture stops the run with an error (the last checkpoint is intact): a half-captured
// graph would leave LibTorch's generator in its capture state.
#pragma once

#include "xlme/config/config.h"
#include "xlme/model/electra.h"
#include "xlme/objectives/objectives.h"
#include "xlme/ops/registry.h"
#include "xlme/train/gradient_buckets.h"

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace xlme::train {

class MicroBatchGraphs {
 public:
  // Eager micro-batches of a shape before its capture.
  static constexpr int64_t kWarmup = 2;
  // Shapes with a graph at most (each holds a micro-batch's activations in its own memory pool);
  // micro-batches of further shapes run eagerly.
  static constexpr std::size_t kMaxGraphs = 4;

  // Whether a run of `config` on `device` uses graphs, and the sentence said at start.
  struct Choice {
    bool on = false;
    std::string reason;
  };
  static Choice choose(const config::Config& config, const torch::Device& device);

  // The forward and backward of one micro-batch on `inputs`: adds its gradients to the
  // parameters' and returns its terms.
  using Pass = std::function<std::vector<objectives::Term>(const model::ModelInputs& inputs)>;

  explicit MicroBatchGraphs(GradientBuckets& buckets);
  ~MicroBatchGraphs();
  MicroBatchGraphs(const MicroBatchGraphs&) = delete;
  MicroBatchGraphs& operator=(const MicroBatchGraphs&) = delete;

  // The step's normalizers copied into the tensors every graph reads (the same names each step).
  const std::map<std::string, torch::Tensor>& normalizers(
      const std::map<std::string, torch::Tensor>& step);

  // Runs `pass` on `inputs` (on the device): eagerly on the graphs' stream for a shape's first
  // kWarmup micro-batches, captured and replayed for the next, replayed for the later ones.
  // `shape` names the micro-batch's shape (task, rows, length, generator rows).
  std::vector<objectives::Term> run(const std::string& shape, const model::ModelInputs& inputs,
                                    const Pass& pass);

  int64_t captured() const { return captured_; }
  int64_t replays() const { return replays_; }

 private:
  struct Graph;
  // Every micro-batch, eager or captured, runs the ops `auto` picks under graphs
  // (ops/registry.h), so that eager and replayed micro-batches compute and draw alike.
  ops::GraphSafeOps graph_safe_;
  GradientBuckets& buckets_;
  std::map<std::string, std::unique_ptr<Graph>> graphs_;
  std::map<std::string, torch::Tensor> normalizers_;
  int64_t captured_ = 0;
  int64_t replays_ = 0;
  bool said_full_ = false;
};

// The name of a micro-batch's shape for MicroBatchGraphs::run: "mono 32x512, 2464 generator rows".
std::string micro_batch_shape(const std::string& task, const model::ModelInputs& inputs);

}  // namespace xlme::train
