#include "xlme/ops/feed_forward.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/ops/registry.h"
#include "xlme/ops/triton.h"
#include "xlme/ops/triton_launchers.h"
#include "xlme/ops/weight_gradient.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace xlme::ops {

namespace {

// The products' dtype for x on its device: bf16 under bf16 autocast, else x's own.
bool products_in_bf16(const torch::Tensor& x, const torch::nn::Linear& intermediate,
                      const torch::nn::Linear& output) {
  const auto type = x.device().type();
  if (at::autocast::is_autocast_enabled(type)) {
    return at::autocast::get_autocast_dtype(type) == at::kBFloat16;
  }
  return x.scalar_type() == torch::kBFloat16 &&
         intermediate->weight.scalar_type() == torch::kBFloat16 &&
         output->weight.scalar_type() == torch::kBFloat16;
}

#ifdef XLME_WITH_CUDA

namespace tk = xlme::ops::triton;

constexpr const char* kForward = "gemm_bias_gelu_bf16";
constexpr const char* kBackward = "gemm_dgelu_bgrad_bf16";

// The grid of a gemm_gelu variant over an [m, n] output: one program per BM x BN tile.
tk::Grid tiles(const tk::KernelImage& image, int64_t m, int64_t n) {
  const int64_t bm = tk::constant(image, "BM"), bn = tk::constant(image, "BN");
  return {((m + bm - 1) / bm) * ((n + bn - 1) / bn), 1, 1};
}

struct FusedFeedForward : torch::autograd::Function<FusedFeedForward> {
  // x [M, K], w1 [F, K], b1 [F] fp32, w2 [H, F], b2 [H]: bf16 but b1; contiguous. `leaves`: the
  // two weights that w1 and w2 are autocast's copies of; where adds_into_buffer() holds
  // for one, the backward adds its gradient into its .grad (and w1's or w2's gradient is none).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w1, const torch::Tensor& b1,
                               const torch::Tensor& w2, const torch::Tensor& b2,
                               torch::TensorList leaves) {
    ctx->saved_data["leaves"] = leaves.vec();
    const int64_t m = x.size(0), k = x.size(1), f = w1.size(0);
    auto h = torch::empty({m, f}, x.options()), a = torch::empty({m, f}, x.options());
    const auto& image = tk::image_for(kForward, x.device());
    tk::GemmBiasGelu kernel;  // h = x w1^T + b1, y = gelu(h): [M, N] from [M, K] and [N, K]
    kernel.a = x, kernel.b = w1, kernel.bias = b1, kernel.h = h, kernel.y = a;
    kernel.M = m, kernel.N = f, kernel.K = k;
    tk::launch(kForward, x.device(), tiles(image, m, f), kernel.args());
    ctx->save_for_backward({x, w1, w2, h, a});
    return torch::addmm(b2, a, w2.t());
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w1 = saved[1], &w2 = saved[2], &h = saved[3], &a = saved[4];
    const auto dout = grads[0].to(torch::kBFloat16).contiguous();
    const int64_t m = x.size(0), f = w1.size(0), hidden = w2.size(0);
    const auto& image = tk::image_for(kBackward, x.device());
    const int64_t bm = tk::constant(image, "BM");
    auto dh = torch::empty_like(h);
    auto part = torch::empty({(m + bm - 1) / bm, f}, h.options().dtype(torch::kFloat32));
    tk::GemmDgeluBgrad kernel;  // dh = (dout w2) * gelu'(h): [M, N] from [M, K] and [K, N]
    kernel.a = dout, kernel.b = w2, kernel.h = h, kernel.dh = dh, kernel.part = part;
    kernel.M = m, kernel.N = f, kernel.K = hidden;
    tk::launch(kBackward, x.device(), tiles(image, m, f), kernel.args());
    const auto leaves = ctx->saved_data["leaves"].toTensorVector();
    // A weight's gradient: into its .grad by the product (weight_gradient), or to its bf16 copy
    // for autograd.
    const auto weight = [](const torch::Tensor& leaf, const torch::Tensor& dy,
                           const torch::Tensor& in) -> std::pair<torch::Tensor, torch::Tensor> {
      if (!adds_into_buffer(leaf)) return {dy.t().mm(in), torch::Tensor()};
      return {torch::Tensor(), weight_gradient(leaf, dy, in)};
    };
    const auto [dw1, leaf1] = weight(leaves[0], dh, x);
    const auto [dw2, leaf2] = weight(leaves[1], dout, a);
    return {dh.mm(w1), dw1, part.sum(0), dw2, dout.sum(0), leaf1, leaf2};
  }
};

#endif

}  // namespace

bool fused_feed_forward_applies(const torch::Tensor& x, const torch::nn::Linear& intermediate,
                                const torch::nn::Linear& output) {
#ifdef XLME_WITH_CUDA
  if (implementation(Op::kFeedForward, x.device()) != Impl::kFused) return false;
  const auto& w1 = intermediate->weight;
  const auto& w2 = output->weight;
  const bool shapes = x.dim() >= 1 && x.numel() > 0 && intermediate->bias.defined() &&
                      output->bias.defined() && w1.size(1) == x.size(-1) &&
                      w2.size(1) == w1.size(0) && x.size(-1) % 16 == 0 && w1.size(0) % 16 == 0;
  return shapes && products_in_bf16(x, intermediate, output) &&
         tk::available(kForward, x.device()) && tk::available(kBackward, x.device());
#else
  (void)x, (void)intermediate, (void)output, (void)products_in_bf16;
  return false;
#endif
}

torch::Tensor fused_feed_forward(const torch::Tensor& x, const torch::nn::Linear& intermediate,
                                 const torch::nn::Linear& output) {
#ifdef XLME_WITH_CUDA
  XLME_CHECK(fused_feed_forward_applies(x, intermediate, output),
             "the fused feed-forward block does not apply to input {} on {} (see "
             "ops::fused_feed_forward_applies)",
             shape_text(x.sizes()), x.device().str());
  const auto type = x.device().type();
  // autocast's cast, cached per step for the weights (AutocastScope), as linear layers get them.
  const auto bf16 = [&](const torch::Tensor& t) {
    return at::autocast::is_autocast_enabled(type)
               ? at::autocast::cached_cast(at::kBFloat16, t, type)
               : t;
  };
  const int64_t k = x.size(-1);
  // The first bias as autocast rounds it, held in fp32 for the kernel's epilogue.
  const auto out = FusedFeedForward::apply(
      bf16(x).reshape({-1, k}).contiguous(), bf16(intermediate->weight).contiguous(),
      bf16(intermediate->bias).to(torch::kFloat32).contiguous(), bf16(output->weight).contiguous(),
      bf16(output->bias), torch::TensorList{intermediate->weight, output->weight});
  auto sizes = x.sizes().vec();
  sizes.back() = output->weight.size(0);
  return out.view(sizes);
#else
  (void)intermediate, (void)output;
  XLME_FAIL("the fused feed-forward block needs CUDA: this xlme was built without it ({})",
            x.device().str());
#endif
}

}  // namespace xlme::ops
