#include "xlme/ops/attention.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/ops/registry.h"
#include "xlme/ops/triton.h"
#include "xlme/ops/triton_launchers.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace xlme::ops {

torch::Tensor distance_table(const torch::Tensor& table) {
  const auto first_row = table.select(1, 0).flip(-1);  // delta = -(Tk - 1) .. 0
  const auto first_column = table.select(2, 0).narrow(1, 1, table.size(1) - 1);  // 1 .. Tq - 1
  return torch::cat({first_row, first_column}, 1).to(torch::kFloat32).contiguous();
}

torch::Tensor attention_table_gradient(const torch::Tensor& sums, int64_t batch, int64_t heads,
                                       int64_t tq, int64_t tk, int64_t far, int64_t block) {
  const int64_t q_blocks = (tq + block - 1) / block, k_blocks = (tk + block - 1) / block;
  const int64_t width = (q_blocks + k_blocks) * block + 2;
  XLME_CHECK(sums.dim() == 3 && sums.size(0) == batch * heads && sums.size(1) == q_blocks &&
                 sums.size(2) == width,
             "attention_table_gradient: sums are {}, expected [{}, {}, {}]",
             shape_text(sums.sizes()), batch * heads, q_blocks, width);
  const auto total =
      sums.view({batch, heads, q_blocks, width}).sum(std::vector<int64_t>{0, 2});  // [H, width]
  auto dtable = total.narrow(1, k_blocks * block - (tk - 1), tq + tk - 1).clone();
  if (far > 0 && far < tq) dtable.select(1, tk - 1 + far) += total.select(1, width - 2);
  if (far > 0 && far < tk) dtable.select(1, tk - 1 - far) += total.select(1, width - 1);
  return dtable;
}

#ifdef XLME_WITH_CUDA

namespace {

namespace tk = xlme::ops::triton;

std::string variant(const char* kind, int64_t head_dim, bool bias, bool gated, bool dropout) {
  const char* mode = !bias ? "nobias" : gated ? "gated" : "bias";
  return fmt::format("attention_{}_bf16_d{}_{}{}", kind, head_dim, mode, dropout ? "_dropout" : "");
}

struct FusedAttention : torch::autograd::Function<FusedAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& factor, const torch::Tensor& distance,
                               const torch::Tensor& lengths, double p, int64_t far) {
    const bool bias = distance.numel() > 0, gated = factor.numel() > 0, dropout = p > 0;
    tk::PhiloxArgs philox;
    if (dropout) philox = tk::philox_inputs(q.device());
    const int64_t batch = q.size(0), heads = q.size(1), tq = q.size(2), tkeys = k.size(2),
                  d = q.size(3);
    auto out = torch::empty({batch, heads, tq, d}, q.options());
    auto lse = torch::empty({batch, heads, tq}, q.options().dtype(torch::kFloat32));
    const auto name = variant("forward", d, bias, gated, dropout);
    const auto block = constant_of(name, "BM", q.device());
    tk::AttentionForward kernel;
    kernel.q = q, kernel.k = k, kernel.v = v, kernel.o = out, kernel.lse = lse;
    kernel.f = factor, kernel.table = distance, kernel.len = lengths;
    set_scalars(kernel, q, k, v, tkeys, far, p, philox);
    tk::launch(name, q.device(), {(tq + block - 1) / block, batch * heads, 1}, kernel.args(),
               fmt::format("{} queries in blocks of {} x {} sequences x {} heads", tq, block, batch,
                           heads));
    ctx->save_for_backward({q, k, v, out, lse, factor, distance, lengths});
    ctx->saved_data["p"] = p;
    ctx->saved_data["far"] = far;
    ctx->saved_data["philox"] = philox.to_ints();
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4], &factor = s[5],
               &distance = s[6], &lengths = s[7];
    const double p = ctx->saved_data["p"].toDouble();
    const int64_t far = ctx->saved_data["far"].toInt();
    const auto philox = tk::PhiloxArgs::from_ints(ctx->saved_data["philox"].toIntVector());
    const bool bias = distance.numel() > 0, gated = factor.numel() > 0, dropout = p > 0;
    const int64_t batch = q.size(0), heads = q.size(1), tq = q.size(2), tkeys = k.size(2),
                  d = q.size(3);
    const auto dout = tk::aligned_copy(grads[0].to(q.scalar_type()).contiguous());
    const auto delta = (dout.to(torch::kFloat32) * out.to(torch::kFloat32)).sum(-1).contiguous();
    auto dq = torch::empty({batch, heads, tq, d}, q.options());
    auto dk = torch::empty({batch, heads, tkeys, d}, k.options());
    auto dv = torch::empty({batch, heads, tkeys, d}, v.options());
    const auto f32 = q.options().dtype(torch::kFloat32);
    auto df = gated ? torch::zeros({batch, heads, tq}, f32) : torch::empty({0}, f32);
    const auto dkdv_name = variant("backward_dkdv", d, bias, gated, dropout);
    const auto dq_name = variant("backward_dq", d, bias, gated, dropout);
    // dK/dV: a program per BN keys; dQ: a program per `block` queries, its tiles square.
    const int64_t keys_per_program = constant_of(dkdv_name, "BN", q.device());
    const int64_t block = constant_of(dq_name, "BM", q.device());
    const int64_t q_blocks = (tq + block - 1) / block, k_blocks = (tkeys + block - 1) / block;
    auto sums =
        bias ? torch::zeros({batch * heads, q_blocks, (q_blocks + k_blocks) * block + 2}, f32)
             : torch::empty({0}, f32);
    tk::AttentionBackwardDkdv dkdv;
    set_saved(dkdv, q, k, v, dout, lse, delta, factor, distance, lengths);
    dkdv.dk = dk, dkdv.dv = dv;
    set_scalars(dkdv, q, k, v, tkeys, far, p, philox);
    tk::launch(dkdv_name, q.device(),
               {(tkeys + keys_per_program - 1) / keys_per_program, batch * heads, 1}, dkdv.args(),
               fmt::format("{} keys in blocks of {} x {} sequences x {} heads", tkeys,
                           keys_per_program, batch, heads));
    tk::AttentionBackwardDq dq_kernel;
    set_saved(dq_kernel, q, k, v, dout, lse, delta, factor, distance, lengths);
    dq_kernel.dq = dq, dq_kernel.df = df, dq_kernel.dtable = sums;
    set_scalars(dq_kernel, q, k, v, tkeys, far, p, philox);
    tk::launch(dq_name, q.device(), {q_blocks, batch * heads, 1}, dq_kernel.args(),
               fmt::format("{} queries in blocks of {} x {} sequences x {} heads", tq, block, batch,
                           heads));
    return {dq,
            dk,
            dv,
            gated ? df : torch::Tensor(),
            bias ? attention_table_gradient(sums, batch, heads, tq, tkeys, far, block)
                 : torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }

  static int64_t constant_of(const std::string& name, const char* constant,
                             const torch::Device& device) {
    return tk::constant(tk::image_for(name, device), constant);
  }

  // The inputs both backward kernels read (q, k, v, dout: [B, H, T, D]; lse, delta: [B, H, Tq]).
  // An empty tensor stands for an absent input (factor, distance): the kernel never reads it (its
  // constexpr is off), but the launch passes a valid float pointer.
  template <class Kernel>
  static void set_saved(Kernel& kernel, const torch::Tensor& q, const torch::Tensor& k,
                        const torch::Tensor& v, const torch::Tensor& dout, const torch::Tensor& lse,
                        const torch::Tensor& delta, const torch::Tensor& factor,
                        const torch::Tensor& distance, const torch::Tensor& lengths) {
    kernel.q = q, kernel.k = k, kernel.v = v, kernel.do_ = dout, kernel.lse = lse;
    kernel.delta = delta, kernel.f = factor, kernel.table = distance, kernel.len = lengths;
  }

  // The scalars of all three kernels: q's, k's and v's strides over [B, H, T], the shapes, the
  // softmax scale and the dropout's.
  template <class Kernel>
  static void set_scalars(Kernel& kernel, const torch::Tensor& q, const torch::Tensor& k,
                          const torch::Tensor& v, int64_t tkeys, int64_t far, double p,
                          const tk::PhiloxArgs& philox) {
    kernel.sqb = q.stride(0), kernel.sqh = q.stride(1), kernel.sqt = q.stride(2);
    kernel.skb = k.stride(0), kernel.skh = k.stride(1), kernel.skt = k.stride(2);
    kernel.svb = v.stride(0), kernel.svh = v.stride(1), kernel.svt = v.stride(2);
    kernel.heads = q.size(1), kernel.tq = q.size(2), kernel.tk = tkeys, kernel.far = far;
    kernel.scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    kernel.philox = philox, kernel.threshold = tk::dropout_threshold(p);
    kernel.drop_scale = p > 0 ? 1.0 / (1.0 - p) : 1.0;
  }
};

}  // namespace

bool fused_attention_applies(const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v) {
  if (implementation(Op::kAttention, q.device()) != Impl::kFused) return false;
  const int64_t d = q.size(-1);
  const bool shapes = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && (d == 64 || d == 32) &&
                      q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && q.numel() > 0;
  const bool dtypes = q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
                      v.scalar_type() == torch::kBFloat16;
  return shapes && dtypes && tk::available(variant("forward", d, true, true, false), q.device());
}

torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& padding,
                              const torch::Tensor& table, const torch::Tensor& factor,
                              double dropout, bool training, int64_t far) {
  XLME_CHECK(far >= 0, "fused_attention: far ({}) must be 0 (none) or a distance", far);
  const auto f32 = q.options().dtype(torch::kFloat32);
  const int64_t batch = q.size(0), tkeys = k.size(2);
  const auto lengths = padding.defined()
                           ? padding.logical_not().sum(1).to(torch::kInt32)
                           : torch::full({batch}, tkeys, q.options().dtype(torch::kInt32));
  const auto distance = table.defined() ? distance_table(table) : torch::empty({0}, f32);
  const auto f = table.defined() && factor.defined()
                     ? factor.squeeze(-1).to(torch::kFloat32).contiguous()
                     : torch::empty({0}, f32);
  // The kernels load 16 bytes at a time, assuming aligned rows (a signature of ":16" hints):
  // the model's q, k and v are views of the projection that keep them; anything else is copied.
  return FusedAttention::apply(tk::aligned_copy(q), tk::aligned_copy(k), tk::aligned_copy(v), f,
                               distance, lengths, training ? dropout : 0.0,
                               table.defined() ? far : 0);
}

#else  // a LibTorch without CUDA: the reference always

bool fused_attention_applies(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  return false;
}

torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor&, const torch::Tensor&,
                              const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                              double, bool, int64_t) {
  XLME_FAIL("the fused attention cannot run on {}: this xlme was built without CUDA",
            q.device().str());
}

#endif

}  // namespace xlme::ops
