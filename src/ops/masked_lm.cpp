#include "xlme/ops/masked_lm.h"

#include "xlme/common/error.h"
#include "xlme/ops/registry.h"
#include "xlme/ops/triton.h"
#include "xlme/ops/triton_launchers.h"

#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <tuple>

namespace xlme::ops {

namespace reference {

namespace {

// The CPU draw: inverse CDF. The softmax over the ordinary ids (excluded ids at -inf get
// probability 0 exactly, so an excluded id that dominates a row cannot make the ordinary ids
// underflow), its cumulative sums (the CPU cumsum accumulates float32 in float64), one uniform per
// row scaled by the row's total, and a binary search for the first cumulative sum above it: three
// passes over [N, V] and N uniforms, where Gumbel-max draws N x V uniforms and takes two
// logarithms of each: the faster of the two on the CPU (docs/measurements.md).
torch::Tensor sample_rows_by_cdf(const torch::Tensor& logits, const Sampling& sampling) {
  const auto dtype = logits.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto scores = torch::div(logits.detach().to(dtype), sampling.temperature);  // [N, V]
  for (const int64_t id : sampling.excluded) {
    scores.select(1, id).fill_(-std::numeric_limits<double>::infinity());
  }
  const auto cdf = torch::softmax(scores, 1).cumsum_(1);  // [N, V]
  const auto total = cdf.narrow(1, cdf.size(1) - 1, 1);   // [N, 1]
  // u x total may round up to total itself, which no cumulative sum exceeds; the largest value
  // below it falls in the last id with a nonzero probability.
  const auto target = torch::minimum(torch::rand(total.sizes(), total.options()) * total,
                                     torch::nextafter(total, torch::zeros_like(total)));
  return torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).squeeze(1);
}

// Gumbel-max: argmax(s / temperature + G), G = -log(-log U), is a draw from
// softmax(s / temperature). Built in place in the noise tensor: one [N, V] buffer, in float32
// whatever the logits' dtype: under bf16 autocast the logits are bf16, and bf16 uniforms cap
// the noise near 5.5 (instead of ~16.6) while a bf16 sum rounds neighbouring scores into ties
// that argmax breaks towards the lowest id; the draws would not follow the softmax.
torch::Tensor sample_rows_by_gumbel(const torch::Tensor& logits, const Sampling& sampling) {
  const auto dtype = logits.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto scores = torch::rand(logits.sizes(), logits.options().dtype(dtype))
                    .clamp_(std::numeric_limits<float>::min(), 1.0);
  scores.log_().neg_().log_().neg_().add_(logits.detach().to(dtype), 1.0 / sampling.temperature);
  // One column fill per excluded id: no index tensor to copy to the device (no host sync).
  for (const int64_t id : sampling.excluded) {
    scores.select(1, id).fill_(-std::numeric_limits<double>::infinity());
  }
  return scores.argmax(1);
}

}  // namespace

torch::Tensor sample(const torch::Tensor& logits, const Sampling& sampling) {
  torch::NoGradGuard no_grad;
  return logits.device().is_cpu() ? sample_rows_by_cdf(logits, sampling)
                                  : sample_rows_by_gumbel(logits, sampling);
}

MaskedLm masked_lm(const torch::Tensor& logits, const torch::Tensor& targets,
                   const Sampling* sampling) {
  namespace F = torch::nn::functional;
  MaskedLm out;
  out.loss_sum =
      F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum));
  // max(1)'s indices: the first maximum, as argmax's, and faster than argmax on the CPU
  // (docs/measurements.md).
  out.correct = (std::get<1>(logits.detach().max(1)) == targets).sum();
  if (sampling != nullptr) out.sampled = reference::sample(logits, *sampling);
  return out;
}

}  // namespace reference

namespace {

void check_inputs(const torch::Tensor& logits, const torch::Tensor& targets) {
  XLME_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
             "masked_lm takes logits [N, V] and targets [N], not {} and {}", logits.sizes().vec(),
             targets.sizes().vec());
  XLME_CHECK(targets.scalar_type() == torch::kInt64, "masked_lm's targets are int64, not {}",
             c10::toString(targets.scalar_type()));
}

#ifdef XLME_WITH_CUDA

namespace tk = xlme::ops::triton;

std::string dtype_suffix(const torch::Tensor& logits) {
  return logits.scalar_type() == torch::kBFloat16 ? "bf16" : "fp32";
}

struct Forward {
  torch::Tensor loss, lse, argmax, sampled;
};

Forward fused_forward(const torch::Tensor& logits, const torch::Tensor& targets,
                      const Sampling* sampling) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const auto f32 = logits.options().dtype(torch::kFloat32);
  const auto i64 = logits.options().dtype(torch::kInt64);
  Forward out{torch::empty({rows}, f32), torch::empty({rows}, f32), torch::empty({rows}, i64),
              torch::empty({rows}, i64)};
  std::array<int64_t, 8> excluded;
  excluded.fill(-1);
  tk::PhiloxArgs philox;
  double inv_temperature = 1.0;
  if (sampling != nullptr) {
    XLME_CHECK(sampling->excluded.size() <= excluded.size(),
               "masked_lm's fused draw excludes at most 8 ids, not {}", sampling->excluded.size());
    std::copy(sampling->excluded.begin(), sampling->excluded.end(), excluded.begin());
    philox = tk::philox_inputs(logits.device());
    inv_temperature = 1.0 / sampling->temperature;
  }
  tk::MaskedLmForward kernel;
  kernel.logits = logits, kernel.row_stride = logits.stride(0), kernel.targets = targets;
  kernel.n_rows = rows, kernel.vocab = vocab, kernel.inv_temperature = inv_temperature;
  kernel.philox = philox, kernel.ex = excluded;
  kernel.loss = out.loss, kernel.lse = out.lse, kernel.argmax = out.argmax;
  kernel.sample = out.sampled;
  auto args = kernel.args();
  // Aligned rows (a 16-byte aligned start, a row stride of a multiple of 16 elements) take the
  // kernel that loads 16 bytes at a time; any other layout the one that promises nothing.
  const std::string variant = tk::aligned_variant(
      "masked_lm_forward_" + dtype_suffix(logits) + (sampling != nullptr ? "_sample" : ""),
      logits.device(), args);
  const int64_t per_program = tk::constant(tk::image_for(variant, logits.device()), "ROWS");
  tk::launch(variant, logits.device(), {(rows + per_program - 1) / per_program, 1, 1},
             std::move(args), fmt::format("{} masked rows, {} a program", rows, per_program));
  return out;
}

struct FusedMaskedLmLoss : torch::autograd::Function<FusedMaskedLmLoss> {
  // Runs the forward kernel: returns the per-row losses [N] float32, puts the argmax and the
  // draws in `rest`, and saves the logits, targets and log-sum-exp for the backward.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, const Sampling* sampling,
                               Forward* rest) {
    *rest = fused_forward(logits, targets, sampling);
    ctx->save_for_backward({logits, targets, rest->lse});
    return rest->loss;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const auto& targets = saved[1];
    const auto& lse = saved[2];
    const auto grad_rows = grads[0].to(torch::kFloat32).contiguous();
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    // The gradient in the logits' layout: padded rows stay padded (aligned for the kernel and
    // for the products after it).
    auto grad = torch::empty({rows, std::max(logits.stride(0), vocab)}, logits.options())
                    .narrow(1, 0, vocab);
    tk::MaskedLmBackward kernel;
    kernel.logits = logits, kernel.row_stride = logits.stride(0), kernel.targets = targets;
    kernel.lse = lse, kernel.grad_loss = grad_rows, kernel.grad = grad;
    kernel.grad_stride = grad.stride(0), kernel.n_rows = rows, kernel.vocab = vocab;
    auto args = kernel.args();
    const std::string variant =
        tk::aligned_variant("masked_lm_backward_" + dtype_suffix(logits), logits.device(), args);
    const int64_t block = tk::constant(tk::image_for(variant, logits.device()), "BLOCK");
    tk::launch(variant, logits.device(), {rows, (vocab + block - 1) / block, 1}, std::move(args),
               fmt::format("{} masked rows x {} ids in blocks of {}", rows, vocab, block));
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool fused_ready(const torch::Tensor& logits) {
  if (implementation(Op::kMaskedLm, logits.device()) != Impl::kFused) return false;
  const auto dtype = logits.scalar_type();
  return (dtype == torch::kBFloat16 || dtype == torch::kFloat32) && logits.size(0) > 0 &&
         triton::available("masked_lm_forward_" + dtype_suffix(logits), logits.device());
}

#endif

}  // namespace

MaskedLm masked_lm(const torch::Tensor& logits, const torch::Tensor& targets,
                   const Sampling* sampling) {
  check_inputs(logits, targets);
#ifdef XLME_WITH_CUDA
  if (fused_ready(logits)) {
    // Rows of contiguous ids at any row stride (a padded layout) are read in place.
    const auto x = logits.stride(1) == 1 ? logits : logits.contiguous();
    // A negative (ignored) target reads column 0 in the kernel; its row's loss is then weighted
    // out, so that its gradient is zero too.
    const auto t = targets.clamp_min(0).contiguous();
    const auto real = targets.ge(0);
    Forward f;
    MaskedLm out;
    out.loss_sum = torch::where(real, FusedMaskedLmLoss::apply(x, t, sampling, &f), 0.0).sum();
    out.correct = (f.argmax == targets).sum();
    if (sampling != nullptr) out.sampled = f.sampled;
    return out;
  }
#endif
  return reference::masked_lm(logits, targets, sampling);
}

int64_t logits_row_multiple(const torch::Device& device) {
  return device.is_cuda() && implementation(Op::kMaskedLm, device) == Impl::kFused ? 64 : 1;
}

torch::Tensor sample(const torch::Tensor& logits, const Sampling& sampling) {
#ifdef XLME_WITH_CUDA
  if (fused_ready(logits)) {
    const auto x = logits.stride(1) == 1 ? logits.detach() : logits.detach().contiguous();
    const auto targets = torch::zeros({x.size(0)}, x.options().dtype(torch::kInt64));
    return fused_forward(x, targets, &sampling).sampled;
  }
#endif
  return reference::sample(logits, sampling);
}

}  // namespace xlme::ops
