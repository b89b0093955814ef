// Benchmark: attention's batched products (scores = q k^T, context = probs v) forward and
// backward on the CPU, xlme's batched_matmul against torch::matmul, on the heads' strided views
// of one [B, T, 3 * hidden] projection as the model reads them. Prints ms and GFLOP/s.
//
//   xlme-bench-attn [--batch 32] [--heads 4] [--length 128] [--head-dim 64] [--steps 20]
//       [--threads 0]
#include "timing.h"
#include "xlme/common/runtime.h"
#include "xlme/model/batched_matmul.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <functional>

int main(int argc, char** argv) {
  CLI::App cli{"Attention's batched products on the CPU: batched_matmul against torch::matmul"};
  int64_t batch = 32, heads = 4, length = 128, head_dim = 64;
  int steps = 20, threads = 0;
  cli.add_option("--batch", batch, "sequences");
  cli.add_option("--heads", heads, "attention heads");
  cli.add_option("--length", length, "tokens per sequence");
  cli.add_option("--head-dim", head_dim, "width of one head");
  cli.add_option("--steps", steps, "timed runs");
  cli.add_option("--threads", threads, "LibTorch threads (0: all cores)");
  CLI11_PARSE(cli, argc, argv);

  const auto settings = xlme::runtime::configure_threads(threads);
  fmt::print("threads {} LibTorch ({} in xlme's own loops); [B, H, T, d] = [{}, {}, {}, {}]\n",
             settings.intra_op, settings.own_loops, batch, heads, length, head_dim);
  torch::manual_seed(0);
  const auto qkv = torch::randn({batch, length, 3 * heads * head_dim}).requires_grad_();
  const auto split = [&](const torch::Tensor& t) {  // [B, T, H * d] -> [B, H, T, d]
    return t.view({batch, length, heads, head_dim}).transpose(1, 2);
  };
  // Both products: 2 * (2 B H T^2 d) FLOPs forward, twice that backward.
  const double forward_flops = 4.0 * batch * heads * length * length * head_dim;
  for (const bool ours : {true, false}) {
    const auto product = [&](const torch::Tensor& a, const torch::Tensor& b) {
      return ours ? xlme::model::batched_matmul(a, b) : torch::matmul(a, b);
    };
    const auto run = [&] {
      const auto parts = qkv.chunk(3, -1);
      const auto scores = product(split(parts[0]), split(parts[1]).transpose(-2, -1));
      return product(scores, split(parts[2]));
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
        "{:<16} forward {:7.2f} ms ({:5.1f} GFLOP/s)  forward + backward {:7.2f} ms "
        "({:5.1f} GFLOP/s)\n",
        ours ? "batched_matmul" : "torch::matmul", forward, forward_flops / forward / 1e6, both,
        3 * forward_flops / both / 1e6);
  }
}
