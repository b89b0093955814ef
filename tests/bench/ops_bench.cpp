// Benchmark: every fused op (ops/registry.h) against its reference on the current device, at
// Base's shapes by default, forward + backward, with the bytes an ideal one-pass implementation
// moves (or the FLOPs) against two ceilings measured in the same run: a device memory copy and a
// bf16 matrix product. On a CUDA device the times are CUDA-event times of the whole op (after
// warm-up; medians); on the CPU wall times. An op without a fused form on this device prints its
// reference alone. Each fused row also prints its largest difference from the reference (the op
// without its random draws, output and every gradient, relative to each tensor's largest value);
// the command exits 1 when one exceeds --tolerance.
//
//   xlme-bench-ops [--device auto|cpu|cuda] [--shape base|small] [--steps 10] [--ops a,b]
//                  [--tolerance 3e-2]
//   (--ops takes the registry's names: masked_lm, ..., weight_grad)
//
// Shapes: base = XLM-E Base on a 32 x 512 micro-batch (masked_lm: 2,458 masked rows x 250,002 ids;
// residual_layernorm: 16,384 rows x 768; feed_forward: 16,384 x 768 -> 3,072 -> 768; attention:
// 32 x 12 heads x 512 x 64; weight_grad: 2,458 x 768 -> 250,002 and 16,384 x 768 -> 768); small =
// cpu_small's (614 x 16,000; 4,096 x 256; 4,096 x 256 -> 1,024 -> 256; 16 x 4 x 128 x 64;
// 614 x 256 -> 16,000 and 4,096 x 256 -> 256).
#include "timing.h"
#include "xlme/common/precision.h"
#include "xlme/common/runtime.h"
#include "xlme/model/attention.h"
#include "xlme/model/encoder.h"
#include "xlme/model/relative_position.h"
#include "xlme/ops/dropout.h"
#include "xlme/ops/linear.h"
#include "xlme/ops/masked_lm.h"
#include "xlme/ops/registry.h"
#include "xlme/ops/residual_layernorm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#ifdef XLME_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Median milliseconds of `fn` over `steps` runs after two warm-up runs.
double median_ms(const torch::Device& device, int steps, const std::function<void()>& fn) {
  fn();
  fn();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
#ifdef XLME_WITH_CUDA
    if (device.is_cuda()) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      start.record();
      fn();
      stop.record();
      stop.synchronize();
      times.push_back(start.elapsed_time(stop));
      continue;
    }
#endif
    (void)device;
    times.push_back(xlme::bench::time_ms(1, fn));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Ceilings {
  double copy_gbs = 0;    // device memory copy: bytes read + written per second / 1e9
  double matmul_tfs = 0;  // bf16 matrix product, TFLOP/s
};

Ceilings measure_ceilings(const torch::Device& device, int steps) {
  Ceilings c;
  const int64_t bytes = device.is_cuda() ? (int64_t{1} << 30) : (int64_t{256} << 20);
  const auto src =
      torch::empty({bytes}, torch::TensorOptions(device).dtype(torch::kUInt8)).fill_(1);
  auto dst = torch::empty_like(src);
  c.copy_gbs = 2.0 * bytes / (median_ms(device, steps, [&] { dst.copy_(src); }) * 1e6);
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto a = torch::randn({n, n}, torch::TensorOptions(device).dtype(torch::kBFloat16));
  const auto b = torch::randn({n, n}, a.options());
  auto out = torch::empty({n, n}, a.options());
  c.matmul_tfs =
      2.0 * n * n * n / (median_ms(device, steps, [&] { torch::mm_out(out, a, b); }) * 1e9);
  return c;
}

struct Case {
  std::string op;  // the row's label
  xlme::ops::Op id;
  double bytes;  // an ideal one-pass forward + backward: what it must read and write
  std::function<void()> run;
  double flops = 0;  // when set: printed as TFLOP/s against the matmul ceiling instead
  // The same op without its random draws (dropout 0, no sampling) on fresh leaves: the output and
  // every gradient, compared between the fused form and the reference. Empty: not compared.
  std::function<std::vector<torch::Tensor>()> check = nullptr;
};

// The largest |fused - reference| over all of a check's tensors, each relative to the largest
// |reference| of that tensor.
double largest_difference(const std::vector<torch::Tensor>& fused,
                          const std::vector<torch::Tensor>& reference) {
  double worst = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const auto want = reference[i].detach().to(torch::kCPU, torch::kDouble);
    const auto got = fused[i].detach().to(torch::kCPU, torch::kDouble);
    const double scale = std::max(want.abs().max().item<double>(), 1e-12);
    const double difference = (got - want).abs().max().item<double>() / scale;
    worst = std::isfinite(difference) ? std::max(worst, difference) : INFINITY;
  }
  return worst;
}

// Times the reference and the fused form; compares them where the case has a check. Returns
// false when the fused form differs from the reference by more than `tolerance`.
bool report(const torch::Device& device, const Ceilings& ceilings, const Case& c, int steps,
            double tolerance) {
  namespace ops = xlme::ops;
  const auto& names = ops::op_names();
  const std::string name = names[static_cast<size_t>(c.id)];
  std::vector<std::pair<std::string, double>> rows;
  std::vector<torch::Tensor> reference_values;
  ops::set_ops(name + "=reference");
  rows.emplace_back("reference", median_ms(device, steps, c.run));
  if (c.check) reference_values = c.check();
  ops::set_ops(name + "=fused");
  double difference = -1;
  if (ops::implementation(c.id, device) == ops::Impl::kFused) {
    rows.emplace_back("fused", median_ms(device, steps, c.run));
    if (c.check) difference = largest_difference(c.check(), reference_values);
  }
  ops::set_ops("");
  for (const auto& [impl, ms] : rows) {
    const bool fused = impl == "fused";
    const std::string speedup = fused ? fmt::format("{:.2f}x", rows.front().second / ms) : "";
    const std::string error =
        fused && difference >= 0 ? fmt::format("{:.2e}", difference) : (fused ? "n/a" : "");
    if (c.flops > 0) {
      const double tfs = c.flops / (ms * 1e9);
      fmt::print("{:<20} {:<10} {:>10.3f} {:>7.1f} TF {:>7.1f}%m {:>9} {:>10}\n", c.op, impl, ms,
                 tfs, 100.0 * tfs / ceilings.matmul_tfs, speedup, error);
      continue;
    }
    const double gbs = c.bytes / (ms * 1e6);
    fmt::print("{:<20} {:<10} {:>10.3f} {:>10.1f} {:>8.1f}% {:>9} {:>10}\n", c.op, impl, ms, gbs,
               100.0 * gbs / ceilings.copy_gbs, speedup, error);
  }
  if (difference > tolerance) {
    fmt::print(
        "{}: the fused form differs from the reference by {:.3e} (relative to the largest "
        "value) > {:.1e}\n",
        c.op, difference, tolerance);
    return false;
  }
  return true;
}

// Fresh leaves: detached copies of `tensors` that require gradients.
std::vector<torch::Tensor> fresh_leaves(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : tensors) leaves.push_back(t.detach().clone().requires_grad_());
  return leaves;
}

// `values`, then each leaf's gradient.
std::vector<torch::Tensor> with_gradients(std::vector<torch::Tensor> values,
                                          const std::vector<torch::Tensor>& leaves) {
  for (const auto& leaf : leaves) values.push_back(leaf.grad().defined() ? leaf.grad() : leaf * 0);
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"xlme's fused ops against their references on the current device"};
  std::string device_name = "auto", shape = "", only;
  int steps = 10;
  cli.add_option("--device", device_name, "auto (CUDA when present), cpu or cuda");
  cli.add_option("--shape", shape, "base or small (default: base on CUDA, small on the CPU)");
  cli.add_option("--steps", steps, "timed runs per case (the median is printed)");
  cli.add_option("--ops", only, "a comma-separated subset of the ops");
  double tolerance = -1;
  cli.add_option("--tolerance", tolerance,
                 "largest relative difference between a fused form and its reference before the "
                 "command fails (default 3e-2 under bf16 on CUDA, 1e-4 on the CPU)");
  CLI11_PARSE(cli, argc, argv);
  xlme::runtime::configure_threads(0);
  const bool cuda = device_name == "cuda" || (device_name == "auto" && torch::cuda::is_available());
  const torch::Device device(cuda ? torch::kCUDA : torch::kCPU, cuda ? 0 : -1);
  if (shape.empty()) shape = cuda ? "base" : "small";
  const bool base = shape == "base";
  const int64_t rows = base ? 2458 : 614, vocab = base ? 250002 : 16000;
  const int64_t tokens = base ? 32 * 512 : 16 * 256, width = base ? 768 : 256;
  const auto half = cuda ? torch::kBFloat16 : torch::kFloat32;  // what autocast gives there
  if (tolerance < 0) tolerance = cuda ? 3e-2 : 1e-4;
  const auto opts = torch::TensorOptions(device);

  const auto ceilings = measure_ceilings(device, steps);
  fmt::print(
      "device {}, shapes {}; ceilings: memory copy {:.0f} GB/s, bf16 matmul {:.1f} TFLOP/s\n",
      device.str(), shape, ceilings.copy_gbs, ceilings.matmul_tfs);
  fmt::print("{:<20} {:<10} {:>10} {:>10} {:>9} {:>9} {:>10}\n", "op (fwd+bwd)", "impl", "ms",
             "GB/s", "of copy", "speed-up", "max diff");

  const int64_t elem = torch::elementSize(half);
  // masked_lm: logits read by the forward and the backward, their gradient written.
  const auto logits = (torch::randn({rows, vocab}, opts) * 3).to(half).requires_grad_();
  const auto targets = torch::randint(5, vocab, {rows}, opts.dtype(torch::kInt64));
  const xlme::ops::Sampling sampling{1.0, {0, 1, 2, 3, 4}};
  // residual_layernorm: x fp32 and y in autocast's dtype, read twice; out, dx, dy written.
  const auto x = torch::randn({tokens, width}, opts).requires_grad_();
  const auto y = torch::randn({tokens, width}, opts).to(half).requires_grad_();
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({width}).eps(1e-12));
  norm->to(device);
  const auto dout = torch::randn({tokens, width}, opts);
  const double xb = 4, yb = static_cast<double>(elem);
  std::vector<Case> cases{
      {"masked_lm", xlme::ops::Op::kMaskedLm, 3.0 * rows * vocab * elem,
       [&] {
         auto lm = xlme::ops::masked_lm(logits, targets, &sampling);
         lm.loss_sum.backward();
       },
       0.0,
       [&] {
         const auto leaves = fresh_leaves({logits});
         auto lm = xlme::ops::masked_lm(leaves[0], targets);
         lm.loss_sum.backward();
         return with_gradients({lm.loss_sum, lm.correct.to(torch::kDouble)}, leaves);
       }},
      {"residual_layernorm", xlme::ops::Op::kResidualLayerNorm,
       tokens * width * (2 * (xb + yb) + 4 + 4 + 4 + yb),
       [&] { xlme::ops::residual_dropout_layernorm(x, y, 0.1, true, norm).backward(dout); }, 0.0,
       [&] {
         const auto leaves = fresh_leaves({x, y});
         norm->zero_grad();
         const auto out =
             xlme::ops::residual_dropout_layernorm(leaves[0], leaves[1], 0.0, true, norm);
         out.backward(dout);
         return with_gradients({out, norm->weight.grad().clone(), norm->bias.grad().clone()},
                               leaves);
       }},
      {"dropout", xlme::ops::Op::kDropout, tokens * width * 4.0 * elem,
       [&] { xlme::ops::dropout(y, 0.1, true).backward(dout.to(half)); }},
  };
  // feed_forward: Base's (or cpu_small's) block, hidden -> 4 x hidden -> hidden, as a training step
  // runs it (bf16 autocast on CUDA): 4 M K F FLOPs forward, twice that backward, against the
  // matmul ceiling.
  xlme::model::FeedForward block(width, 4 * width, 0.02);
  block->to(device);
  const auto fx = torch::randn({tokens, width}, opts).requires_grad_();
  cases.push_back({"feed_forward", xlme::ops::Op::kFeedForward, 0.0,
                   [&] {
                     torch::Tensor out;
                     {
                       xlme::AutocastScope scope(device, cuda);
                       out = block->forward(fx);
                     }
                     out.backward(dout.to(out.scalar_type()));
                   },
                   12.0 * tokens * width * 4 * width,
                   [&] {
                     const auto leaves = fresh_leaves({fx});
                     block->zero_grad();
                     torch::Tensor out;
                     {
                       xlme::AutocastScope scope(device, cuda);
                       out = block->forward(leaves[0]);
                     }
                     out.backward(dout.to(out.scalar_type()));
                     std::vector<torch::Tensor> values{out};
                     for (const auto& p : block->parameters()) values.push_back(p.grad().clone());
                     return with_gradients(values, leaves);
                   }});
  // attention with the gated bias and dropout, as a training step runs it (bf16 autocast on CUDA),
  // against model.attention's path there (SDPA on CUDA, math on the CPU): 4 B H T^2 d FLOPs
  // forward, 2.5x that backward; printed against the bf16 matmul ceiling ("%m").
  const int64_t ab = base ? 32 : 16, ah = base ? 12 : 4, at = base ? 512 : 128, ad = 64;
  const auto attn_opts = opts.dtype(half);
  const auto aq = torch::randn({ab, ah, at, ad}, attn_opts).requires_grad_();
  const auto ak = torch::randn({ab, ah, at, ad}, attn_opts).requires_grad_();
  const auto av = torch::randn({ab, ah, at, ad}, attn_opts).requires_grad_();
  auto apad = torch::zeros({ab, at}, opts.dtype(torch::kBool));
  apad.narrow(1, at - at / 8, at / 8).narrow(0, 0, ab / 2).fill_(true);
  xlme::model::PositionBias abias;
  // The model's Toeplitz table (32 buckets up to 128): the fused kernel's far tiles apply.
  abias.table =
      xlme::model::toeplitz_bias(torch::randn({ah, 32}, opts).mul_(0.1),
                                 xlme::model::relative_position_buckets(at, 32, 128, device))
          .requires_grad_();
  abias.far = xlme::model::relative_position_far_distance(32, 128);
  abias.gate_u = torch::randn({ah, ad}, opts).mul_(0.02).requires_grad_();
  abias.gate_v = torch::randn({ah, ad}, opts).mul_(0.02).requires_grad_();
  abias.gate_w = torch::ones({ah}, opts).requires_grad_();
  const auto adout = torch::randn({ab, ah, at, ad}, attn_opts);
  const auto akernel =
      xlme::model::resolve_attention_kernel(xlme::config::AttentionChoice::kAuto, device);
  Case attention_case{"attention",
                      xlme::ops::Op::kAttention,
                      0.0,
                      [&] {
                        torch::Tensor out;
                        {
                          xlme::AutocastScope scope(device, cuda);
                          out = xlme::model::attention(aq, ak, av, apad, abias, 0.1, true, akernel);
                        }
                        out.backward(adout);
                      },
                      3.5 * 4.0 * ab * ah * at * at * ad,
                      [&] {
                        const auto leaves = fresh_leaves(
                            {aq, ak, av, abias.table, abias.gate_u, abias.gate_v, abias.gate_w});
                        auto bias = abias;
                        bias.table = leaves[3];
                        bias.gate_u = leaves[4];
                        bias.gate_v = leaves[5];
                        bias.gate_w = leaves[6];
                        torch::Tensor out;
                        {
                          xlme::AutocastScope scope(device, cuda);
                          out = xlme::model::attention(leaves[0], leaves[1], leaves[2], apad, bias,
                                                       0.0, true, akernel);
                        }
                        // Padded queries' rows are not compared (the paths may differ there).
                        const auto real = (~apad).view({ab, 1, at, 1});
                        (out * real).backward(adout);
                        return with_gradients({out * real}, leaves);
                      }};
  cases.push_back(attention_case);
  // weight_grad: the generator's tied output projection ([vocab, E] from the masked rows) and one
  // encoder product (tokens x width -> width), forward + backward as a training step runs them
  // (bf16 autocast on CUDA), into .grad buffers that stay (as the trainer's gradient buckets):
  // 6 M K N FLOPs against the matmul ceiling; what the fused form saves is the passes after dW.
  auto tied = torch::randn({vocab, width}, opts).mul_(0.02).requires_grad_();
  auto layer = torch::randn({width, width}, opts).mul_(0.02).requires_grad_();
  for (auto* w : {&tied, &layer}) w->mutable_grad() = torch::zeros_like(*w);
  const auto tied_in = torch::randn({rows, width}, opts).requires_grad_();
  const auto layer_in = torch::randn({tokens, width}, opts).requires_grad_();
  const auto tied_dout = torch::randn({rows, vocab}, opts).to(half);
  const auto layer_dout = torch::randn({tokens, width}, opts).to(half);
  const auto product_case = [&](const char* label, const torch::Tensor& w, const torch::Tensor& in,
                                const torch::Tensor& grad) {
    return Case{label,
                xlme::ops::Op::kWeightGradient,
                0.0,
                [&device, cuda, w, in, grad] {
                  torch::Tensor out;
                  {
                    xlme::AutocastScope scope(device, cuda);
                    out = xlme::ops::linear(in, w, torch::Tensor());
                  }
                  out.backward(grad);
                },
                6.0 * in.size(0) * w.size(0) * w.size(1),
                [&device, cuda, w, in, grad] {
                  const auto leaves = fresh_leaves({w, in});
                  leaves[0].mutable_grad() = torch::zeros_like(leaves[0]);
                  torch::Tensor out;
                  {
                    xlme::AutocastScope scope(device, cuda);
                    out = xlme::ops::linear(leaves[1], leaves[0], torch::Tensor());
                  }
                  out.backward(grad);
                  return with_gradients({out}, leaves);
                }};
  };
  cases.push_back(product_case("weight_grad tied", tied, tied_in, tied_dout));
  cases.push_back(product_case("weight_grad layer", layer, layer_in, layer_dout));
  const auto& names = xlme::ops::op_names();
  std::vector<std::string> failures;
  for (const auto& c : cases) {
    const std::string name = names[static_cast<size_t>(c.id)];
    if (!only.empty() && ("," + only + ",").find("," + name + ",") == std::string::npos) continue;
    if (!report(device, ceilings, c, steps, tolerance)) failures.push_back(c.op);
    for (const auto* t : {&aq, &ak, &av}) t->mutable_grad() = torch::Tensor();
    logits.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    y.mutable_grad() = torch::Tensor();
    fx.mutable_grad() = torch::Tensor();
    tied_in.mutable_grad() = torch::Tensor();
    layer_in.mutable_grad() = torch::Tensor();
    block->zero_grad();
  }
  if (!failures.empty()) {
    fmt::print("xlme-bench-ops: {} differ from their references beyond {:.1e}\n",
               fmt::join(failures, ", "), tolerance);
    return 1;
  }
  return 0;
}
