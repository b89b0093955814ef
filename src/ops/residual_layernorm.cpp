#include "xlme/ops/residual_layernorm.h"

#include "xlme/common/error.h"
#include "xlme/ops/dropout.h"
#include "xlme/ops/registry.h"
#include "xlme/ops/triton.h"
#include "xlme/ops/triton_launchers.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace xlme::ops {

namespace reference {

torch::Tensor residual_dropout_layernorm(const torch::Tensor& x, const torch::Tensor& y, double p,
                                         bool training, torch::nn::LayerNorm& norm) {
  return norm(x + ops::dropout(y, p, training));
}

}  // namespace reference

namespace {

#ifdef XLME_WITH_CUDA

namespace tk = xlme::ops::triton;

std::string dtype_name(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? "bf16" : "fp32";
}

// The variant for x's and y's dtypes, the width and dropout; "" when none is compiled.
std::string variant_for(const char* pass, const torch::Tensor& x, const torch::Tensor& y,
                        bool dropout) {
  const int64_t width = x.size(-1);
  const int64_t block = width <= 1024 ? 1024 : width <= 4096 ? 4096 : 0;
  if (block == 0) return "";
  return fmt::format("residual_layernorm_{}_{}_{}_{}{}", pass, dtype_name(x), dtype_name(y), block,
                     dropout ? "_dropout" : "");
}

struct FusedResidualLayerNorm : torch::autograd::Function<FusedResidualLayerNorm> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& y, const torch::Tensor& weight,
                               const torch::Tensor& bias, double p, double eps) {
    const int64_t width = x.size(-1), rows = x.numel() / width;
    const bool dropout = p > 0.0;
    tk::PhiloxArgs philox;
    if (dropout) philox = tk::philox_inputs(x.device());
    auto out = torch::empty_like(x);
    const auto f32 = x.options().dtype(torch::kFloat32);
    auto mean = torch::empty({rows}, f32), rstd = torch::empty({rows}, f32);
    tk::ResidualLayernormForward kernel;
    kernel.x = x, kernel.y = y, kernel.w = weight, kernel.b = bias;
    kernel.out = out, kernel.mean = mean, kernel.rstd = rstd;
    kernel.n_rows = rows, kernel.width = width, kernel.eps = eps;
    kernel.philox = philox, kernel.threshold = tk::dropout_threshold(p);
    kernel.scale = dropout ? 1.0 / (1.0 - p) : 1.0;
    auto args = kernel.args();
    // Aligned rows (16-byte aligned tensors, a width that is a multiple of 16) take the kernel
    // with 16-byte loads and stores; any other layout the one that promises nothing.
    const auto variant =
        tk::aligned_variant(variant_for("forward", x, y, dropout), x.device(), args);
    const int64_t per_program = tk::constant(tk::image_for(variant, x.device()), "ROWS");
    tk::launch(variant, x.device(), {(rows + per_program - 1) / per_program, 1, 1},
               std::move(args));
    ctx->save_for_backward({x, y, weight, mean, rstd});
    ctx->saved_data["p"] = p;
    ctx->saved_data["philox"] = philox.to_ints();
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1], &weight = saved[2], &mean = saved[3], &rstd = saved[4];
    const double p = ctx->saved_data["p"].toDouble();
    const auto philox = tk::PhiloxArgs::from_ints(ctx->saved_data["philox"].toIntVector());
    const bool dropout = p > 0.0;
    const auto dout = grads[0].to(x.scalar_type()).contiguous();
    const int64_t width = x.size(-1), rows = x.numel() / width;
    // At most 256 programs, each over a run of rows: as many [H] partial sums of dw and db. The
    // aligned and the plain variants take the same number of rows a step.
    const int64_t step =
        tk::constant(tk::image_for(variant_for("backward", x, y, dropout), x.device()), "ROWS");
    const int64_t per_program = ((rows + 255) / 256 + step - 1) / step * step;
    const int64_t programs = (rows + per_program - 1) / per_program;
    auto dx = torch::empty_like(x), dy = torch::empty_like(y);
    const auto f32 = x.options().dtype(torch::kFloat32);
    auto dw = torch::empty({programs, width}, f32), db = torch::empty({programs, width}, f32);
    tk::ResidualLayernormBackward kernel;
    kernel.x = x, kernel.y = y, kernel.w = weight, kernel.mean = mean, kernel.rstd = rstd;
    kernel.dout = dout, kernel.dx = dx, kernel.dy = dy, kernel.dw_part = dw, kernel.db_part = db;
    kernel.n_rows = rows, kernel.width = width, kernel.rows_per_program = per_program;
    kernel.philox = philox, kernel.threshold = tk::dropout_threshold(p);
    kernel.scale = dropout ? 1.0 / (1.0 - p) : 1.0;
    auto args = kernel.args();
    const auto variant =
        tk::aligned_variant(variant_for("backward", x, y, dropout), x.device(), args);
    tk::launch(variant, x.device(), {programs, 1, 1}, std::move(args));
    return {dx, dy, dw.sum(0), db.sum(0), torch::Tensor(), torch::Tensor()};
  }
};

bool fused_ready(const torch::Tensor& x, const torch::Tensor& y, torch::nn::LayerNorm& norm) {
  if (implementation(Op::kResidualLayerNorm, x.device()) != Impl::kFused) return false;
  const auto& o = norm->options;
  const bool shapes = x.sizes() == y.sizes() && x.dim() >= 1 && x.numel() > 0 &&
                      o.normalized_shape().size() == 1 && o.normalized_shape()[0] == x.size(-1) &&
                      o.elementwise_affine();
  const bool dtypes = x.scalar_type() == torch::kFloat32 &&
                      (y.scalar_type() == torch::kBFloat16 || y.scalar_type() == torch::kFloat32) &&
                      norm->weight.scalar_type() == torch::kFloat32 &&
                      norm->bias.scalar_type() == torch::kFloat32;
  if (!shapes || !dtypes) return false;
  const auto variant = variant_for("forward", x, y, false);
  return !variant.empty() && tk::available(variant, x.device());
}

#endif

}  // namespace

torch::Tensor residual_dropout_layernorm(const torch::Tensor& x, const torch::Tensor& y, double p,
                                         bool training, torch::nn::LayerNorm& norm) {
#ifdef XLME_WITH_CUDA
  if (fused_ready(x, y, norm)) {
    return FusedResidualLayerNorm::apply(x.contiguous(), y.contiguous(), norm->weight, norm->bias,
                                         training ? p : 0.0, norm->options.eps());
  }
#endif
  return reference::residual_dropout_layernorm(x, y, p, training, norm);
}

}  // namespace xlme::ops
