#include "xlme/train/performance.h"

#include "xlme/common/error.h"
#include "xlme/config/objective_set.h"
#include "xlme/model/electra.h"
#include "xlme/model/encoder.h"

#include <sys/resource.h>

#ifdef XLME_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace xlme::train {
namespace {

double layer_flops(const config::ModelArgs& o, int64_t length) {
  const auto h = static_cast<double>(o.hidden_size), f = static_cast<double>(o.ffn_size);
  return 2 * 4 * h * h + 2 * 2 * h * f + 2 * 2 * static_cast<double>(length) * h;
}

double embedding_projection_flops(const config::ModelArgs& o) {
  const auto h = static_cast<double>(o.hidden_size), e = static_cast<double>(o.embedding_size);
  return o.embedding_size != o.hidden_size ? 2 * e * h : 0.0;
}

double encoder_flops(const config::ModelArgs& o, int64_t length) {
  return embedding_projection_flops(o) + static_cast<double>(o.layers) * layer_flops(o, length);
}

// One side of distillation, forward: the layers below the distilled `layer`, then its Q, K, V
// projections (with `hidden`, every layer from it up instead), then the three relations.
double distillation_flops(const config::ModelArgs& o, int64_t layer, bool hidden, int64_t length) {
  const auto h = static_cast<double>(o.hidden_size);
  const double top =
      hidden ? static_cast<double>(o.layers - layer + 1) * layer_flops(o, length) : 2 * 3 * h * h;
  return embedding_projection_flops(o) + static_cast<double>(layer - 1) * layer_flops(o, length) +
         top + 3 * 2 * static_cast<double>(length) * h;
}

double lm_head_flops(const config::ModelArgs& o, double mask_ratio) {
  const auto h = static_cast<double>(o.hidden_size), e = static_cast<double>(o.embedding_size);
  return mask_ratio * 2 * (h * e + e * static_cast<double>(o.vocab_size));
}

}  // namespace

double peak_memory_mib(const torch::Device& device) {
  if (device.is_cuda()) {
#ifdef XLME_WITH_CUDA
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto aggregate = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    return static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1 << 20);
#else
    return -1;
#endif
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: KiB
}

double training_flops_per_token(const config::Config& config, int64_t length,
                                const model::Teacher* teacher) {
  const auto disc = config::discriminator_args(config.model);
  const auto architecture = model::architecture_for(config.objectives.set);
  if (architecture == model::Architecture::kEncoder) {
    XLME_CHECK(teacher != nullptr,
               "the FLOPs of objectives.set=distill need the teacher (distill.teacher)");
    const auto& t = teacher->encoder->args();
    return 3 * distillation_flops(disc, disc.layers, teacher->hidden, length) +
           distillation_flops(t, teacher->layer, teacher->hidden, length);
  }
  const double r = config.objectives.mask_ratio;
  if (disc.cross_attention) {
    // VECO: each side (about half the framed length) runs the encoder twice, self-attention only
    // and with cross-attention to the other side's last hidden states (queries and output over
    // its own tokens, keys and values over the other side's, about as many), and the MLM head
    // at its masked positions after each.
    const auto h = static_cast<double>(disc.hidden_size);
    const int64_t side = std::max<int64_t>(1, length / 2);
    const double cross = 2 * 4 * h * h + 2 * 2 * static_cast<double>(side) * h;
    return 3 * (2 * encoder_flops(disc, side) + static_cast<double>(disc.layers) * cross +
                2 * lm_head_flops(disc, r));
  }
  double forward = encoder_flops(disc, length);
  if (architecture == model::Architecture::kElectra) {
    const auto gen = config::generator_args(config.model);
    const auto h = static_cast<double>(disc.hidden_size);
    forward += encoder_flops(gen, length) + lm_head_flops(gen, r) + 2 * (h * h + h);
  } else {
    forward += lm_head_flops(disc, r);
  }
  return 3 * forward;
}

double step_flops_per_token(const config::Config& config, const model::Teacher* teacher) {
  const auto& set = objectives::objective_set(config.objectives.set);
  double flops = 0;
  int tasks = 0;
  for (const auto& [trained, task] : {std::pair(set.monolingual, &config.data.mono),
                                      std::pair(set.translation_pairs, &config.data.para)}) {
    if (!trained) continue;
    flops += training_flops_per_token(config, task->max_len, teacher);
    ++tasks;
  }
  return flops / tasks;
}

std::optional<double> peak_bf16_flops(const std::string& name) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("H100") && (has("PCIe") || has("PCIE"))) return 756e12;
  if (has("H100") || has("H200") || has("GH200")) return 989e12;
  if (has("A100")) return 312e12;
  return std::nullopt;
}

std::string device_name(const torch::Device& device) {
#ifdef XLME_WITH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return device.str();
}

std::optional<double> model_flops_utilization(double flops_per_second,
                                              const std::string& device_name, int ranks) {
  const auto peak = peak_bf16_flops(device_name);
  if (!peak || ranks < 1) return std::nullopt;
  return flops_per_second / (static_cast<double>(ranks) * *peak);
}

}  // namespace xlme::train
