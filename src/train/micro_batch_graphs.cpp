#include "xlme/train/micro_batch_graphs.h"

#include "xlme/common/error.h"
#include "xlme/config/objective_set.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#ifdef XLME_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <array>
#include <optional>

namespace xlme::train {

namespace {

// The tensors of a micro-batch's inputs that a graph reads (VECO's sides never reach a graph).
std::array<torch::Tensor*, 6> input_tensors(model::ModelInputs& in) {
  return {&in.input_ids, &in.labels, &in.padding, &in.positions, &in.masked_index, &in.masked_real};
}

// Each defined tensor of `from` copied into `to`'s (the graph's inputs), queued on the current
// stream.
void copy_inputs(model::ModelInputs& to, model::ModelInputs from) {
  const auto dst = input_tensors(to);
  const auto src = input_tensors(from);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    XLME_CHECK(dst[i]->defined() == src[i]->defined() &&
                   (!dst[i]->defined() || dst[i]->sizes() == src[i]->sizes()),
               "a CUDA graph's inputs changed shape (an internal error: please report it)");
    if (dst[i]->defined()) dst[i]->copy_(*src[i], /*non_blocking=*/true);
  }
}

model::ModelInputs clone_inputs(model::ModelInputs from) {
  for (torch::Tensor* t : input_tensors(from)) {
    if (t->defined()) *t = t->clone();
  }
  return from;
}

// The first line of an error message.
std::string first_line(const std::string& what) {
  return what.substr(0, what.find('\n'));
}

}  // namespace

struct MicroBatchGraphs::Graph {
  int64_t seen = 0;                     // micro-batches of this shape so far
  model::ModelInputs inputs;            // what the graph reads
  std::vector<objectives::Term> terms;  // what it writes
  std::vector<std::size_t> present;     // the parameters whose gradients it adds to
#ifdef XLME_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::optional<c10::cuda::CUDAStream> stream;  // the stream it was warmed up and captured on
#endif
};

MicroBatchGraphs::Choice MicroBatchGraphs::choose(const config::Config& config,
                                                  const torch::Device& device) {
  const std::string& setting = config.train.cuda_graphs;
  if (setting == "off") return {false, "off (train.cuda_graphs=off)"};
  if (!device.is_cuda()) {
    return {false, fmt::format("off: the device is {} (CUDA graphs are CUDA's)", device.str())};
  }
  const auto& set = objectives::objective_set(config.objectives.set);
  if (set.distillation || set.cross_attention) {
    return {false, fmt::format("off: objectives.set={} (graphs cover the ELECTRA and masked-LM "
                               "models, whose micro-batches repeat one shape)",
                               set.name)};
  }
  if (setting == "auto") {
    return {false,
            "off: train.cuda_graphs=auto keeps them off, as a capture cannot hold the fused "
            "random ops that auto runs and is slower without them (docs/gpu.md#cuda-graphs); "
            "train.cuda_graphs=on uses them"};
  }
  return {true, fmt::format("on: every micro-batch of a step but the last is captured per shape "
                            "after {} eager ones and replayed; the generator's rows are padded to "
                            "one count per shape",
                            kWarmup)};
}

MicroBatchGraphs::MicroBatchGraphs(GradientBuckets& buckets) : buckets_(buckets) {
  buckets_.keep_allocated(true);
}

MicroBatchGraphs::~MicroBatchGraphs() = default;

const std::map<std::string, torch::Tensor>& MicroBatchGraphs::normalizers(
    const std::map<std::string, torch::Tensor>& step) {
  for (const auto& [name, value] : step) {
    auto it = normalizers_.find(name);
    if (it == normalizers_.end()) {
      normalizers_.emplace(name, value.clone());
    } else {
      it->second.copy_(value, /*non_blocking=*/true);
    }
  }
  return normalizers_;
}

std::vector<objectives::Term> MicroBatchGraphs::run(const std::string& shape,
                                                    const model::ModelInputs& inputs,
                                                    const Pass& pass) {
#ifdef XLME_WITH_CUDA
  const torch::Device device = inputs.labels.device();
  if (!device.is_cuda()) return pass(inputs);
  auto it = graphs_.find(shape);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      if (!said_full_) {
        spdlog::warn(
            "cuda graphs: {} shapes have a graph already (the most kept); micro-batches "
            "of other shapes, such as {}, run eagerly",
            kMaxGraphs, shape);
        said_full_ = true;
      }
      return pass(inputs);
    }
    it = graphs_.emplace(shape, std::make_unique<Graph>()).first;
  }
  Graph& g = *it->second;
  ++g.seen;
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
  if (!g.stream) g.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  const c10::cuda::CUDAStream side = *g.stream;
  // Work on the graph's stream, after everything queued on the main stream so far (the zeroed
  // gradient buckets, the inputs, the normalizers), and the main stream after it.
  const auto on_side = [&](const std::function<void()>& work) {
    at::cuda::CUDAEvent ready;
    ready.record(main);
    ready.block(side);
    {
      const c10::cuda::CUDAStreamGuard guard(side);
      work();
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(main);
  };

  if (g.seen <= kWarmup) {
    std::vector<objectives::Term> terms;
    on_side([&] { terms = pass(inputs); });
    return terms;
  }
  if (!g.graph) {
    g.inputs = clone_inputs(inputs);
    g.graph = std::make_unique<at::cuda::CUDAGraph>();
    buckets_.start_recording();
    on_side([&] {
      // Casts inside the graph: autocast's cached copies die with the step's autocast scope.
      const bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      try {
        g.graph->capture_begin();
        g.terms = pass(g.inputs);
        g.graph->capture_end();
      } catch (const std::exception& e) {
        at::autocast::set_autocast_cache_enabled(cache);
        buckets_.stop_recording();
        XLME_FAIL(
            "train.cuda_graphs=on: capturing the micro-batch ({}) in a CUDA graph failed: {}. Set "
            "train.cuda_graphs=off and resume (--resume auto): the last checkpoint is intact",
            shape, first_line(e.what()));
      }
      at::autocast::set_autocast_cache_enabled(cache);
    });
    g.present = buckets_.stop_recording();
    ++captured_;
    spdlog::info("cuda graphs: captured the micro-batch {} ({} parameters get gradients)", shape,
                 g.present.size());
  } else {
    copy_inputs(g.inputs, inputs);
  }
  g.graph->replay();
  buckets_.mark_present(g.present);
  ++replays_;
  // Copies: the graph's own tensors change with its next replay.
  std::vector<objectives::Term> terms = g.terms;
  for (auto& term : terms) {
    term.loss_sum = term.loss_sum.detach().clone();
    term.count = term.count.clone();
    for (auto& [name, value] : term.statistics) value = value.clone();
  }
  return terms;
#else
  (void)shape;
  return pass(inputs);
#endif
}

std::string micro_batch_shape(const std::string& task, const model::ModelInputs& inputs) {
  return fmt::format("{} {}x{}, {} generator rows{}", task, inputs.labels.size(0),
                     inputs.labels.size(1), inputs.masked_index.size(0),
                     inputs.masked_real.defined() ? "" : " unpadded");
}

}  // namespace xlme::train
