// Benchmark: one forward + backward pass of a small post-LN Transformer encoder on the CPU, and a
// 1024x1024 matrix product, with the thread settings given. It deliberately does not apply the
// binaries' OMP_WAIT_POLICY default, so that scripts/bench_threads.sh can compare policies.
//
//   xlme-bench-threads [--threads N] [--steps N]
#include "xlme/common/runtime.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"CPU step-time benchmark for thread settings"};
  int threads = 0;
  int steps = 10;
  cli.add_option("--threads", threads, "LibTorch threads (0: all cores)");
  cli.add_option("--steps", steps, "timed steps");
  CLI11_PARSE(cli, argc, argv);

  const auto settings = xlme::runtime::configure_threads(threads);
  torch::manual_seed(0);
  const int64_t batch = 8, length = 128, hidden = 256, heads = 4, layers = 4;
  auto x = torch::randn({batch * length, hidden}, torch::requires_grad());  // [B*T, H]
  auto w_in = torch::randn({hidden, 4 * hidden}, torch::requires_grad()) * 0.02;
  auto w_out = torch::randn({4 * hidden, hidden}, torch::requires_grad()) * 0.02;
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({hidden}));
  auto step = [&] {
    auto h = x;
    for (int l = 0; l < layers; ++l) {
      auto q = h.view({batch, length, heads, hidden / heads}).transpose(1, 2);  // [B, h, T, d]
      auto probs = torch::softmax(torch::matmul(q, q.transpose(-1, -2)) / 8.0, -1);
      auto context = torch::matmul(probs, q).transpose(1, 2).reshape({batch * length, hidden});
      h = norm(h + context);
      h = norm(h + torch::mm(torch::gelu(torch::mm(h, w_in)), w_out));
    }
    h.sum().backward();
  };
  for (int i = 0; i < 2; ++i) step();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double step_ms = 1000.0 * seconds_since(start) / steps;

  auto a = torch::randn({1024, 1024}), b = torch::randn({1024, 1024});
  torch::mm(a, b);
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) torch::mm(a, b);
  const double gflops = 10 * 2.0 * 1024 * 1024 * 1024 / seconds_since(start) / 1e9;

  const char* policy = std::getenv("OMP_WAIT_POLICY");
  fmt::print(
      "threads {:>2} LibTorch (BLAS: {}), OMP_WAIT_POLICY={:<8} step {:7.1f} ms   "
      "matmul {:6.1f} GFLOP/s\n",
      settings.intra_op, xlme::runtime::blas_name(), policy ? policy : "(unset)", step_ms, gflops);
  return 0;
}
