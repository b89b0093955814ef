// Benchmark: attention with the gated relative position bias, forward and forward + backward, on
// the CPU or a GPU, on the heads' strided views of one [B, T, 3 * hidden] projection as the model
// reads them, with dropout and padded sequences as in training. Rows:
//   math, sdpa   model.attention's two paths (XLME_OPS attention=reference); on CUDA, sdpa is
//                today's training path (the memory-efficient kernel with the [B, H, T, T] mask)
//   fused        the Triton kernel with the bias built inside (ops/attention.h; bf16, CUDA only)
//   cudnn        the sdpa path with only cuDNN's SDPA allowed: cuDNN's kernel with the same mask
//   flash        SDPA's flash kernel without bias or padding: the ceiling a bias-free attention
//                reaches (CUDA, bf16)
// float32 and bf16 (autocast; q, k, v in bf16 as autocast's projection gives them) on the CPU,
// bf16 on CUDA. Prints median ms and TFLOP/s (4 B H T^2 d forward, 2.5x that backward; the
// backward's time is that of forward + backward less the forward's) and the forward + backward of
// --layers layers: the attention's share of one micro-batch. A row that cannot run here prints
// n/a and why.
//
//   xlme-bench-attn [--device auto|cpu|cuda] [--batch B] [--heads H] [--length T]
//       [--head-dim 64] [--steps 20] [--threads 0] [--dropout 0.1] [--layers 12]
// Defaults: 32 x 4 heads x 128 on the CPU, XLM-E Base's 32 x 12 x 512 on CUDA.
#include "xlme/common/precision.h"
#include "xlme/common/runtime.h"
#include "xlme/model/attention.h"
#include "xlme/model/relative_position.h"
#include "xlme/ops/attention.h"
#include "xlme/ops/registry.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace {

// Median milliseconds of `fn` over `steps` runs after two warm-up runs, the device synchronized
// around each run.
double time_ms(const torch::Device& device, int steps, const std::function<void()>& fn) {
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  fn();
  fn();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    sync();
    const auto start = std::chrono::steady_clock::now();
    fn();
    sync();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Allows only the SDPA backends named (flash, cudnn) while alive, then restores LibTorch's.
class SdpaBackends {
 public:
  SdpaBackends(bool flash, bool cudnn) {
    auto& c = at::globalContext();
    saved_ = {c.userEnabledFlashSDP(), c.userEnabledMemEfficientSDP(), c.userEnabledMathSDP(),
              c.userEnabledCuDNNSDP()};
    c.setSDPUseFlash(flash);
    c.setSDPUseMemEfficient(false);
    c.setSDPUseMath(false);
    c.setSDPUseCuDNN(cudnn);
  }
  ~SdpaBackends() {
    auto& c = at::globalContext();
    c.setSDPUseFlash(saved_[0]);
    c.setSDPUseMemEfficient(saved_[1]);
    c.setSDPUseMath(saved_[2]);
    c.setSDPUseCuDNN(saved_[3]);
  }
  SdpaBackends(const SdpaBackends&) = delete;
  SdpaBackends& operator=(const SdpaBackends&) = delete;

 private:
  std::vector<bool> saved_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"Gated-bias attention: model.attention's paths, the fused kernel and the ceilings"};
  std::string device_name = "auto";
  int64_t batch = 0, heads = 0, length = 0, head_dim = 64, layers = 12;
  int steps = 20, threads = 0;
  double dropout = 0.1;
  cli.add_option("--device", device_name, "auto (CUDA when present), cpu or cuda");
  cli.add_option("--batch", batch, "sequences (default 32)");
  cli.add_option("--heads", heads, "attention heads (default 4 on the CPU, 12 on CUDA)");
  cli.add_option("--length", length, "tokens per sequence (default 128 on the CPU, 512 on CUDA)");
  cli.add_option("--head-dim", head_dim, "width of one head");
  cli.add_option("--steps", steps, "timed runs");
  cli.add_option("--threads", threads, "LibTorch threads (0: all cores)");
  cli.add_option("--dropout", dropout, "attention dropout");
  cli.add_option("--layers", layers, "layers per micro-batch, for the per-micro-batch total");
  CLI11_PARSE(cli, argc, argv);

  namespace m = xlme::model;
  namespace ops = xlme::ops;
  const bool cuda = device_name == "cuda" || (device_name == "auto" && torch::cuda::is_available());
  const torch::Device device(cuda ? torch::kCUDA : torch::kCPU, cuda ? 0 : -1);
  if (batch == 0) batch = 32;
  if (heads == 0) heads = cuda ? 12 : 4;
  if (length == 0) length = cuda ? 512 : 128;
  const auto settings = xlme::runtime::configure_threads(threads);
  fmt::print(
      "device {}; threads {} LibTorch ({} in xlme's own loops); [B, H, T, d] = [{}, {}, {}, "
      "{}], dropout {}, half of the sequences padded by T / 8\n",
      device.str(), settings.intra_op, settings.own_loops, batch, heads, length, head_dim, dropout);
  torch::manual_seed(0);
  const auto opts = torch::TensorOptions(device);
  const auto qkv32 = torch::randn({batch, length, 3 * heads * head_dim}, opts);
  const auto split = [&](const torch::Tensor& t) {  // [B, T, H * d] -> [B, H, T, d]
    return t.view({batch, length, heads, head_dim}).transpose(1, 2);
  };
  const auto leaf = [](torch::Tensor t) { return t.requires_grad_(true); };
  const auto table = leaf(0.02 * torch::randn({heads, 32}, opts));  // d_{h, b}
  const auto buckets = m::relative_position_buckets(length, 32, 128, device);
  auto padding = torch::zeros({batch, length}, opts.dtype(torch::kBool));
  padding.narrow(1, length - length / 8, length / 8).narrow(0, 0, batch / 2).fill_(true);
  m::PositionBias bias;
  bias.gate_u = leaf(0.02 * torch::randn({heads, head_dim}, opts));
  bias.gate_v = leaf(0.02 * torch::randn({heads, head_dim}, opts));
  bias.gate_w = leaf(torch::ones({heads}, opts));
  bias.far = m::relative_position_far_distance(32, 128);
  const double forward_flops = 4.0 * batch * heads * length * length * head_dim;
  fmt::print("{:<5} {:<7} {:>10} {:>8} {:>10} {:>8} {:>12}\n", "dtype", "kernel", "fwd ms",
             "TFLOP/s", "bwd ms", "TFLOP/s", "x layers ms");

  for (const bool bf16 : cuda ? std::vector<bool>{true} : std::vector<bool>{false, true}) {
    // q, k, v as the model's projection leaves them: bf16 under autocast.
    const auto qkv = leaf(qkv32.to(bf16 ? torch::kBFloat16 : torch::kFloat32).detach().clone());
    const std::vector<std::string> kernels{"math", "sdpa", "fused", "cudnn", "flash"};
    for (const auto& kernel : kernels) {
      const auto row = [&](const std::string& text) {
        fmt::print("{:<5} {:<7} {}\n", bf16 ? "bf16" : "fp32", kernel, text);
      };
      if (!cuda && (kernel == "cudnn" || kernel == "flash")) {
        row("n/a (CUDA only)");
        continue;
      }
      ops::set_ops(kernel == "fused" ? "attention=fused" : "attention=reference");
      const auto parts = qkv.chunk(3, -1);
      if (kernel == "fused" &&
          !ops::fused_attention_applies(split(parts[0]), split(parts[1]), split(parts[2]))) {
        row(cuda ? "n/a (no compiled kernel for these inputs)"
                 : "n/a (a Triton kernel for CUDA; the interpreter tests check it on the CPU)");
        continue;
      }
      if (kernel == "flash" && !bf16) {
        row("n/a (bf16 only)");
        continue;
      }
      const auto attention_kernel =
          kernel == "math" ? m::AttentionKernel::kMath : m::AttentionKernel::kSdpa;
      const auto run = [&] {
        const xlme::AutocastScope autocast(device, bf16);
        const auto p = qkv.chunk(3, -1);
        const auto q = split(p[0]), k = split(p[1]), v = split(p[2]);
        if (kernel == "flash") {
          const SdpaBackends only_flash(true, false);
          return at::scaled_dot_product_attention(q, k, v, std::nullopt, dropout, false);
        }
        bias.table = m::toeplitz_bias(table, buckets);
        if (kernel == "cudnn") {
          const SdpaBackends only_cudnn(false, true);
          return m::attention(q, k, v, padding, bias, dropout, /*training=*/true, attention_kernel);
        }
        return m::attention(q, k, v, padding, bias, dropout, /*training=*/true, attention_kernel);
      };
      try {
        const double forward = time_ms(device, steps, [&] {
          torch::NoGradGuard no_grad;
          run();
        });
        const double both = time_ms(device, steps, [&] {
          const auto out = run();
          out.backward(torch::ones_like(out));
        });
        const double backward = both - forward;
        fmt::print("{:<5} {:<7} {:>10.3f} {:>8.2f} {:>10.3f} {:>8.2f} {:>12.2f}\n",
                   bf16 ? "bf16" : "fp32", kernel, forward, forward_flops / forward / 1e9, backward,
                   2.5 * forward_flops / backward / 1e9, both * layers);
      } catch (const std::exception& e) {
        std::string what = e.what();
        row("n/a (" + what.substr(0, what.find('\n')) + ")");
      }
    }
  }
  ops::set_ops("");
}
