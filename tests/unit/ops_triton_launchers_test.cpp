// The kernels' generated launchers (xlme/ops/triton_launchers.h, written by
// src/ops/triton/launchers.py from the variants' signatures): a struct filled by name gives the
// launch arguments of its kernel, checked here against the embedded images of the variants the
// ops launch (triton::check_args: number, order, types, ":16" promises); a variant of other dtypes
// refuses them, and a member left unset is named. tests/python/test_launchers.py tests the
// generator itself; the launches run on a GPU in tests/integration/cuda_test.cpp.
#include "xlme/ops/triton_launchers.h"

#include "xlme/ops/triton.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

namespace xlme::ops {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

// check_args of `variant`'s sm_90a image: "" where the arguments fit, else the error.
std::string misfit(const std::string& variant, const std::vector<triton::Arg>& args) {
  const auto* image = triton::find_image(variant, 9, 0);
  if (image == nullptr) return "no image " + variant;
  try {
    triton::check_args(*image, args);
  } catch (const xlme::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TritonLaunchers, ResidualLayerNormFillsTheSignaturesOfItsVariants) {
  const int64_t rows = 4, width = 64;
  const auto x = torch::randn({rows, width});
  const auto y = torch::randn({rows, width}).to(torch::kBFloat16);
  const auto w = torch::ones({width}), stats = torch::zeros({rows});
  triton::ResidualLayernormForward forward;
  forward.x = x, forward.y = y, forward.w = w, forward.b = w;
  forward.out = torch::empty_like(x), forward.mean = stats, forward.rstd = stats;
  forward.n_rows = rows, forward.width = width, forward.eps = 1e-5;
  forward.philox = triton::PhiloxArgs(), forward.threshold = triton::dropout_threshold(0.1);
  forward.scale = 1.0 / 0.9;
  const auto args = forward.args();
  ASSERT_EQ(args.size(), 18U);
  EXPECT_EQ(args[8].type(), "i32");   // width
  EXPECT_EQ(args[10].type(), "u64");  // philox's seed
  EXPECT_EQ(args[16].type(), "u32");  // threshold
  const std::string plain = "residual_layernorm_forward_fp32_bf16_1024_dropout";
  EXPECT_EQ(misfit(plain, args), "");
  EXPECT_EQ(misfit(plain + "_aligned", args), "");
  EXPECT_EQ(triton::aligned_variant(plain, 9, 0, args), plain + "_aligned");
  EXPECT_TRUE(contains_all(misfit("residual_layernorm_forward_fp32_fp32_1024_dropout", args),
                           {"argument 1 is *fp32 in its signature", "the launch passes *bf16"}));

  triton::ResidualLayernormBackward backward;
  const auto part = torch::zeros({2, width});
  backward.x = x, backward.y = y, backward.w = w, backward.mean = stats, backward.rstd = stats;
  backward.dout = x, backward.dx = x, backward.dy = y, backward.dw_part = part;
  backward.db_part = part;
  backward.n_rows = rows, backward.width = width, backward.rows_per_program = 2;
  backward.philox = triton::PhiloxArgs(), backward.threshold = 0U, backward.scale = 1.0;
  EXPECT_EQ(misfit("residual_layernorm_backward_fp32_bf16_4096_aligned", backward.args()), "");
  EXPECT_EQ(misfit("residual_layernorm_backward_fp32_bf16_1024", backward.args()), "");
}

TEST(TritonLaunchers, MaskedLmFillsTheSignaturesOfItsVariants) {
  const int64_t rows = 3, vocab = 40;
  const auto logits = torch::zeros({rows, 48}, torch::kBFloat16).narrow(1, 0, vocab);
  const auto f32 = torch::zeros({rows}), i64 = torch::zeros({rows}, torch::kInt64);
  triton::MaskedLmForward forward;
  forward.logits = logits, forward.row_stride = logits.stride(0), forward.targets = i64;
  forward.n_rows = rows, forward.vocab = vocab, forward.inv_temperature = 1.0;
  forward.philox = triton::PhiloxArgs();
  forward.ex = std::array<int64_t, 8>{3, -1, -1, -1, -1, -1, -1, -1};
  forward.loss = f32, forward.lse = f32, forward.argmax = i64, forward.sample = i64;
  const auto args = forward.args();
  ASSERT_EQ(args.size(), 24U);
  EXPECT_EQ(args[12].type(), "i32");  // ex0
  EXPECT_EQ(misfit("masked_lm_forward_bf16_sample_aligned", args), "");
  EXPECT_EQ(misfit("masked_lm_forward_bf16", args), "");
  EXPECT_TRUE(contains_all(misfit("masked_lm_forward_fp32", args),
                           {"argument 0 is *fp32 in its signature", "the launch passes *bf16"}));

  triton::MaskedLmBackward backward;
  backward.logits = logits, backward.row_stride = logits.stride(0), backward.targets = i64;
  backward.lse = f32, backward.grad_loss = f32, backward.grad = logits;
  backward.grad_stride = logits.stride(0), backward.n_rows = rows, backward.vocab = vocab;
  EXPECT_EQ(misfit("masked_lm_backward_bf16_aligned", backward.args()), "");
  // A row stride of 40 elements breaks the aligned form's promise: the plain one is taken.
  backward.grad_stride = 40;
  EXPECT_EQ(triton::aligned_variant("masked_lm_backward_bf16", 9, 0, backward.args()),
            "masked_lm_backward_bf16");
}

// The three attention kernels share their scalars; an absent input is an empty fp32 tensor.
template <class Kernel>
void set_attention_scalars(Kernel& kernel, const torch::Tensor& q) {
  kernel.sqb = q.stride(0), kernel.sqh = q.stride(1), kernel.sqt = q.stride(2);
  kernel.skb = q.stride(0), kernel.skh = q.stride(1), kernel.skt = q.stride(2);
  kernel.svb = q.stride(0), kernel.svh = q.stride(1), kernel.svt = q.stride(2);
  kernel.heads = q.size(1), kernel.tq = q.size(2), kernel.tk = q.size(2), kernel.far = 0;
  kernel.scale = 0.125, kernel.philox = triton::PhiloxArgs(), kernel.threshold = 0U;
  kernel.drop_scale = 1.0;
}

TEST(TritonLaunchers, AttentionFillsTheSignaturesOfItsVariants) {
  const auto q = torch::zeros({2, 4, 16, 64}, torch::kBFloat16);  // [B, H, T, D]
  const auto lse = torch::zeros({2, 4, 16}), none = torch::empty({0});
  const auto lengths = torch::full({2}, 16, torch::kInt32);
  triton::AttentionForward forward;
  forward.q = q, forward.k = q, forward.v = q, forward.o = q, forward.lse = lse;
  forward.f = none, forward.table = none, forward.len = lengths;
  set_attention_scalars(forward, q);
  EXPECT_EQ(misfit("attention_forward_bf16_d64_nobias", forward.args()), "");
  forward.len = torch::full({2}, 16, torch::kInt64);
  EXPECT_TRUE(contains_all(misfit("attention_forward_bf16_d64_nobias", forward.args()),
                           {"argument 7 is *i32 in its signature", "the launch passes *i64"}));

  triton::AttentionBackwardDkdv dkdv;
  dkdv.q = q, dkdv.k = q, dkdv.v = q, dkdv.do_ = q, dkdv.lse = lse, dkdv.delta = lse;
  dkdv.f = lse, dkdv.table = torch::zeros({4, 31}), dkdv.len = lengths, dkdv.dk = q, dkdv.dv = q;
  set_attention_scalars(dkdv, q);
  EXPECT_EQ(misfit("attention_backward_dkdv_bf16_d64_gated_dropout", dkdv.args()), "");

  triton::AttentionBackwardDq dq;
  dq.q = q, dq.k = q, dq.v = q, dq.do_ = q, dq.lse = lse, dq.delta = lse, dq.f = none;
  dq.table = none, dq.len = lengths, dq.dq = q, dq.df = none, dq.dtable = none;
  set_attention_scalars(dq, q);
  EXPECT_EQ(misfit("attention_backward_dq_bf16_d64_bias", dq.args()), "");
  // A query one element in breaks the ":16" promise of the aligned-only kernel.
  dq.q = q.view(-1).narrow(0, 1, q.numel() - 1);
  EXPECT_TRUE(contains_all(misfit("attention_backward_dq_bf16_d64_bias", dq.args()),
                           {"argument 0 (*bf16:16) must be a 16-byte aligned address"}));
}

TEST(TritonLaunchers, FeedForwardFillsTheSignaturesOfItsVariants) {
  const auto x = torch::zeros({5, 32}, torch::kBFloat16), w = torch::zeros({48, 32}, x.options());
  const auto h = torch::zeros({5, 48}, x.options());
  triton::GemmBiasGelu forward;
  forward.a = x, forward.b = w, forward.bias = torch::zeros({48}), forward.h = h, forward.y = h;
  forward.M = 5, forward.N = 48, forward.K = 32;
  EXPECT_EQ(misfit("gemm_bias_gelu_bf16", forward.args()), "");
  triton::GemmDgeluBgrad backward;
  backward.a = h, backward.b = w, backward.h = x, backward.dh = x;
  backward.part = torch::zeros({1, 32}), backward.M = 5, backward.N = 32, backward.K = 48;
  EXPECT_EQ(misfit("gemm_dgelu_bgrad_bf16", backward.args()), "");
  backward.K = 40;
  EXPECT_TRUE(contains_all(misfit("gemm_dgelu_bgrad_bf16", backward.args()),
                           {"argument 7 (i32:16) must be a multiple of 16"}));
}

// A member left unset would pass garbage to the kernel: args() refuses it, naming it.
TEST(TritonLaunchers, AMemberLeftUnsetIsNamed) {
  const auto x = torch::zeros({5, 32}, torch::kBFloat16);
  triton::GemmBiasGelu kernel;
  kernel.a = x, kernel.b = x, kernel.bias = x, kernel.h = x, kernel.y = x;
  kernel.M = 5, kernel.K = 32;
  EXPECT_EQ(error_message([&] { kernel.args(); }),
            "Triton kernel gemm_bias_gelu: the launch leaves its argument N unset (a member of "
            "the kernel's launcher, xlme/ops/triton_launchers.h)");
  kernel.N = 48;
  kernel.bias = torch::Tensor();
  EXPECT_EQ(error_message([&] { kernel.args(); }),
            "Triton kernel gemm_bias_gelu: the launch leaves its argument bias unset (a member of "
            "the kernel's launcher, xlme/ops/triton_launchers.h)");
  triton::MaskedLmBackward backward;
  EXPECT_TRUE(contains_all(error_message([&] { backward.args(); }),
                           {"masked_lm_backward", "argument logits unset"}));
  EXPECT_STREQ(triton::MaskedLmBackward::kKernel, "masked_lm_backward");
}

}  // namespace
}  // namespace xlme::ops
