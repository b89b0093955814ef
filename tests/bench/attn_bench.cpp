// Benchmark: attention with the gated relative position bias, forward and forward + backward on
// the CPU, the math kernel against SDPA (model.attention), in float32 and under bf16 autocast, on
// the heads' strided views of one [B, T, 3 * hidden] projection as the model reads them, with
// dropout as in training. Prints ms and the GFLOP/s of the two batched products.
//
//   xlme-bench-attn [--batch 32] [--heads 4] [--length 128] [--head-dim 64] [--steps 20]
//       [--threads 0] [--dropout 0.1]
#include "timing.h"
#include "xlme/common/precision.h"
#include "xlme/common/runtime.h"
#include "xlme/model/attention.h"
#include "xlme/model/relative_position.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App cli{"Gated-bias attention on the CPU: the math kernel against SDPA"};
  int64_t batch = 32, heads = 4, length = 128, head_dim = 64;
  int steps = 20, threads = 0;
  double dropout = 0.1;
  cli.add_option("--batch", batch, "sequences");
  cli.add_option("--heads", heads, "attention heads");
  cli.add_option("--length", length, "tokens per sequence");
  cli.add_option("--head-dim", head_dim, "width of one head");
  cli.add_option("--steps", steps, "timed runs");
  cli.add_option("--threads", threads, "LibTorch threads (0: all cores)");
  cli.add_option("--dropout", dropout, "attention dropout");
  CLI11_PARSE(cli, argc, argv);

  namespace m = xlme::model;
  const auto settings = xlme::runtime::configure_threads(threads);
  fmt::print("threads {} LibTorch ({} in xlme's own loops); [B, H, T, d] = [{}, {}, {}, {}]\n",
             settings.intra_op, settings.own_loops, batch, heads, length, head_dim);
  torch::manual_seed(0);
  const auto qkv = torch::randn({batch, length, 3 * heads * head_dim}).requires_grad_();
  const auto split = [&](const torch::Tensor& t) {  // [B, T, H * d] -> [B, H, T, d]
    return t.view({batch, length, heads, head_dim}).transpose(1, 2);
  };
  const auto leaf = [](torch::Tensor t) { return t.requires_grad_(true); };
  const auto table = leaf(0.02 * torch::randn({heads, 32}));  // d_{h, b}
  const auto buckets = m::relative_position_buckets(length, 32, 128, torch::kCPU);
  m::PositionBias bias;
  bias.gate_u = leaf(0.02 * torch::randn({heads, head_dim}));
  bias.gate_v = leaf(0.02 * torch::randn({heads, head_dim}));
  bias.gate_w = leaf(torch::ones({heads}));
  // The two batched products: 2 * (2 B H T^2 d) FLOPs forward, twice that backward.
  const double forward_flops = 4.0 * batch * heads * length * length * head_dim;
  for (const bool bf16 : {false, true}) {
    for (const auto kernel : {m::AttentionKernel::kMath, m::AttentionKernel::kSdpa}) {
      const auto run = [&] {
        const xlme::AutocastScope autocast(torch::kCPU, bf16);
        bias.table = m::toeplitz_bias(table, buckets);
        const auto parts = qkv.chunk(3, -1);
        return m::attention(split(parts[0]), split(parts[1]), split(parts[2]), {}, bias, dropout,
                            /*training=*/true, kernel);
      };
      const double forward = xlme::bench::time_ms(steps, [&] {
        torch::NoGradGuard no_grad;
        run();
      });
      const double both = xlme::bench::time_ms(steps, [&] {
        const auto out = run();
        out.backward(torch::ones_like(out));
      });
      fmt::print(
          "{:<4} {:<4} forward {:7.2f} ms ({:5.1f} GFLOP/s)  forward + backward {:7.2f} ms "
          "({:5.1f} GFLOP/s)\n",
          bf16 ? "bf16" : "fp32", kernel == m::AttentionKernel::kMath ? "math" : "sdpa", forward,
          forward_flops / forward / 1e6, both, 3 * forward_flops / both / 1e6);
    }
  }
}
