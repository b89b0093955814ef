// The masked-LM op (ops/masked_lm.h) on the CPU: its reference against float64 values computed
// here, the registry's choice, and the embedded Triton kernels (ops/triton.h): a cubin for sm_90a
// and sm_80 per variant, their ELF headers, which image a GPU gets, and the launch arguments'
// check. The kernels' values are tested by tests/python/test_kernels.py (Triton's interpreter)
// and, on a GPU, by tests/integration/cuda_test.cpp.
#include "xlme/ops/masked_lm.h"

#include "xlme/ops/registry.h"
#include "xlme/ops/triton.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#ifdef XLME_WITH_CUDA
#include <ATen/cuda/PhiloxCudaState.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>

namespace xlme::ops {
namespace {

using xlme::testing::error_message;

TEST(OpsMaskedLm, ReferenceLossAndCorrectCountAgainstFloat64ByHand) {
  torch::manual_seed(4);
  const auto logits = torch::randn({6, 11}, torch::kFloat64) * 3;
  const auto targets = torch::tensor({0, 10, 5, 5, 3, 7}, torch::kInt64);
  logits[2][5] = 50.0;  // row 2's target is its maximum
  double loss = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < 6; ++i) {
    double sum = 0;
    int64_t best = 0;
    for (int64_t j = 0; j < 11; ++j) {
      sum += std::exp(logits[i][j].item<double>());
      if (logits[i][j].item<double>() > logits[i][best].item<double>()) best = j;
    }
    const int64_t t = targets[i].item<int64_t>();
    loss += std::log(sum) - logits[i][t].item<double>();
    correct += best == t;
  }
  const auto lm = masked_lm(logits, targets);
  EXPECT_NEAR(lm.loss_sum.item<double>(), loss, 1e-10);
  EXPECT_EQ(lm.correct.item<int64_t>(), correct);
  EXPECT_GE(correct, 1);
  EXPECT_FALSE(lm.sampled.defined());
}

TEST(OpsMaskedLm, OnTheCpuFusedIsTheReference) {
  torch::manual_seed(6);
  const auto logits = torch::randn({5, 30}, torch::requires_grad());
  const auto targets = torch::randint(0, 30, {5}, torch::kInt64);
  const Sampling sampling{0.8, {0, 1, 2}};
  set_ops("masked_lm=fused");
  torch::manual_seed(9);
  const auto fused = masked_lm(logits, targets, &sampling);
  set_ops("");
  torch::manual_seed(9);
  const auto ref = reference::masked_lm(logits, targets, &sampling);
  EXPECT_TRUE(torch::equal(fused.loss_sum, ref.loss_sum));
  EXPECT_TRUE(torch::equal(fused.sampled, ref.sampled));
  for (const int64_t id : sampling.excluded) EXPECT_FALSE((fused.sampled == id).any().item<bool>());
}

TEST(OpsMaskedLm, ShapesAreChecked) {
  EXPECT_EQ(error_message([] {
              masked_lm(torch::zeros({3, 4}), torch::zeros({2}, torch::kInt64));
            }),
            "masked_lm takes logits [N, V] and targets [N], not [3, 4] and [2]");
  EXPECT_EQ(error_message([] {
              masked_lm(torch::zeros({3, 4}), torch::zeros({3}));
            }),
            "masked_lm's targets are int64, not Float");
}

TEST(TritonImages, EveryVariantHasACubinForSm90aAndSm80) {
  std::set<std::string> variants;
  for (const auto& image : triton::kernel_images()) variants.insert(image.variant);
  for (const char* v :
       {"masked_lm_forward_bf16_sample", "masked_lm_forward_bf16", "masked_lm_backward_bf16",
        "masked_lm_forward_fp32_sample", "masked_lm_forward_fp32", "masked_lm_backward_fp32",
        "gemm_bias_gelu_bf16", "gemm_dgelu_bgrad_bf16"}) {
    EXPECT_TRUE(variants.count(v)) << v;
  }
  for (const auto& variant : variants) {
    const auto* h100 = triton::find_image(variant, 9, 0);
    const auto* a100 = triton::find_image(variant, 8, 0);
    ASSERT_NE(h100, nullptr) << variant;
    ASSERT_NE(a100, nullptr) << variant;
    EXPECT_STREQ(h100->arch, "sm_90a");
    EXPECT_STREQ(a100->arch, "sm_80");
    EXPECT_EQ(triton::find_image(variant, 8, 6), a100) << "sm_80 code runs on an 8.6 GPU";
    EXPECT_EQ(triton::find_image(variant, 10, 0), nullptr) << "no Blackwell cubin";
    EXPECT_EQ(triton::find_image(variant, 7, 5), nullptr);
    for (const auto* image : {h100, a100}) {
      // A 64-bit ELF for the CUDA machine (EM_CUDA = 190) whose flags name the architecture.
      ASSERT_GT(image->cubin_size, 64u);
      EXPECT_EQ(std::memcmp(image->cubin,
                            "\x7f"
                            "ELF\x02",
                            5),
                0)
          << variant;
      EXPECT_EQ(image->cubin[18], 190) << variant;
      EXPECT_EQ(image->cubin[48], image->capability) << variant << " " << image->arch;
      // The embedded size is the ELF's own: its section and program header tables, the last
      // things in a cubin, end exactly there (not a byte more, such as a string literal's NUL).
      const auto field = [&](size_t offset, size_t bytes) {
        uint64_t value = 0;
        std::memcpy(&value, image->cubin + offset, bytes);  // little-endian, as the host
        return value;
      };
      const uint64_t section_headers_end = field(0x28, 8) + field(0x3A, 2) * field(0x3C, 2);
      const uint64_t program_headers_end = field(0x20, 8) + field(0x36, 2) * field(0x38, 2);
      EXPECT_EQ(image->cubin_size, std::max(section_headers_end, program_headers_end)) << variant;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(image->cubin) % 8, 0u) << variant;
      // Above 48 KB the launcher raises the kernel's limit; the architecture's ceiling holds
      // (A100: 163 KB per block, H100/H200: 227 KB).
      EXPECT_LE(image->shared_bytes, image->capability == 90 ? 232448 : 166912) << variant;
    }
  }
  EXPECT_STREQ(triton::triton_version(), "3.6.0");
  // The constants the launches read (grid sizes) come from the table, not from copies in C++.
  const auto* ln = triton::find_image("residual_layernorm_backward_fp32_bf16_1024_dropout", 9, 0);
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(triton::constant(*ln, "ROWS"), 2);
  EXPECT_EQ(triton::constant(*ln, "BLOCK"), 1024);
  EXPECT_EQ(triton::constant(*ln, "DROPOUT"), 1);
  EXPECT_EQ(error_message([&] { triton::constant(*ln, "QUARTER"); }),
            "Triton kernel residual_layernorm_backward_fp32_bf16_1024_dropout has no compile-time "
            "constant QUARTER (it has ROWS=2,BLOCK=1024,DROPOUT=1)");
}

TEST(TritonImages, LaunchArgumentsAreCheckedAgainstTheSignature) {
  const auto* image = triton::find_image("masked_lm_backward_bf16", 9, 0);
  ASSERT_NE(image, nullptr);
  EXPECT_STREQ(image->signature, "*bf16,i64,*i64,*fp32,*fp32,*bf16,i64,i32,i32");
  const auto bf16 = torch::zeros({2, 3}, torch::kBFloat16);
  const auto f32 = torch::zeros({2});
  const auto i64 = torch::zeros({2}, torch::kInt64);
  using triton::Arg;
  std::vector<Arg> args{Arg::pointer(bf16), Arg::i64(3),       Arg::pointer(i64),
                        Arg::pointer(f32),  Arg::pointer(f32), Arg::pointer(bf16),
                        Arg::i64(3),        Arg::i32(2),       Arg::i32(3)};
  EXPECT_NO_THROW(triton::check_args(*image, args));
  args[5] = Arg::pointer(f32);
  EXPECT_EQ(error_message([&] { triton::check_args(*image, args); }),
            "Triton kernel masked_lm_backward_bf16: argument 5 is *bf16 in its signature "
            "(*bf16,i64,*i64,*fp32,*fp32,*bf16,i64,i32,i32), the launch passes *fp32");
  args.pop_back();
  EXPECT_EQ(error_message([&] { triton::check_args(*image, args); }),
            "Triton kernel masked_lm_backward_bf16 takes 9 arguments "
            "(*bf16,i64,*i64,*fp32,*fp32,*bf16,i64,i32,i32), the launch passes 8");
  EXPECT_EQ(error_message([] { Arg::i32(int64_t{1} << 31); }),
            "2147483648 does not fit a Triton kernel's i32 argument");
  // Scalars travel as their bytes.
  auto u = Arg::u64(0x0123456789ABCDEFULL);
  uint64_t back = 0;
  std::memcpy(&back, u.address(), sizeof(back));
  EXPECT_EQ(back, 0x0123456789ABCDEFULL);
  auto f = Arg::f32(0.5);
  float half = 0;
  std::memcpy(&half, f.address(), sizeof(half));
  EXPECT_EQ(half, 0.5f);
  EXPECT_FALSE(triton::available("masked_lm_forward_bf16", torch::Device(torch::kCPU)));
}

// A grid past CUDA's limits is refused before the launch, naming the variant, the grid, the
// dimension and what the grid covers; the limits themselves pass.
TEST(TritonImages, GridsPastCudasLimitsAreRefusedBeforeTheLaunch) {
  EXPECT_NO_THROW(triton::check_grid("k", {2147483647, 65535, 65535}, ""));
  EXPECT_NO_THROW(triton::check_grid("k", {0, 1, 1}, ""));
  EXPECT_EQ(error_message([] {
              triton::check_grid("attention_forward_bf16_d64_gated", {8, 70000, 1},
                                 "512 queries in blocks of 64 x 5834 sequences x 12 heads");
            }),
            "Triton kernel attention_forward_bf16_d64_gated: a grid of (8, 70000, 1) programs "
            "(512 queries in blocks of 64 x 5834 sequences x 12 heads) does not fit CUDA's limit "
            "in y (70000 up to 65535): use smaller micro-batches or sequences, or "
            "XLME_OPS=reference");
  EXPECT_TRUE(testing::contains_all(
      error_message([] {
        triton::check_grid("k", {2147483648LL, 1, 1}, "");
      }),
      {"(2147483648, 1, 1) programs does not fit", "in x (2147483648 up to 2147483647)"}));
  EXPECT_TRUE(testing::contains_all(error_message([] {
                                      triton::check_grid("k", {1, 1, -1}, "");
                                    }),
                                    {"in z (-1 up to 65535)"}));
}

TEST(TritonImages, TheSixteenHintsAreCheckedAtLaunch) {
  // The feed-forward products were compiled assuming 16-byte aligned pointers and N, K multiples
  // of 16: a launch that breaks it would read wrong addresses, so it is refused, named.
  const auto* image = triton::find_image("gemm_bias_gelu_bf16", 9, 0);
  ASSERT_NE(image, nullptr);
  EXPECT_STREQ(image->signature, "*bf16:16,*bf16:16,*fp32:16,*bf16:16,*bf16:16,i32,i32:16,i32:16");
  const auto x = torch::zeros({5, 32}, torch::kBFloat16);
  const auto w = torch::zeros({48, 32}, torch::kBFloat16);
  const auto b = torch::zeros({48});
  const auto h = torch::zeros({5, 48}, torch::kBFloat16);
  using triton::Arg;
  std::vector<Arg> args{Arg::pointer(x), Arg::pointer(w), Arg::pointer(b), Arg::pointer(h),
                        Arg::pointer(h), Arg::i32(5),     Arg::i32(48),    Arg::i32(32)};
  EXPECT_NO_THROW(triton::check_args(*image, args));    // M = 5 carries no hint
  args[0] = Arg::pointer(x.view(-1).narrow(0, 1, 32));  // 2 bytes past an aligned address
  EXPECT_EQ(error_message([&] { triton::check_args(*image, args); }),
            "Triton kernel gemm_bias_gelu_bf16: argument 0 (*bf16:16) must be a 16-byte aligned "
            "address (the kernel was compiled assuming it), the launch passes one that is not");
  args[0] = Arg::pointer(x);
  args[7] = Arg::i32(24);
  EXPECT_EQ(error_message([&] { triton::check_args(*image, args); }),
            "Triton kernel gemm_bias_gelu_bf16: argument 7 (i32:16) must be a multiple of 16 (the "
            "kernel was compiled assuming it), the launch passes one that is not");
  args[7] = Arg::i64(32);
  EXPECT_EQ(error_message([&] { triton::check_args(*image, args); }),
            "Triton kernel gemm_bias_gelu_bf16: argument 7 is i32 in its signature "
            "(*bf16:16,*bf16:16,*fp32:16,*bf16:16,*bf16:16,i32,i32:16,i32:16), the launch passes "
            "i64");
}

// The masked-LM kernels come in two forms: "_aligned" (16-byte loads; its signature promises
// aligned pointers and row strides) and a plain one. A launch takes the aligned form only where
// every promise holds; a misaligned input (a view one element in) or the generator's unpadded
// 250,002-wide rows take the plain form instead of an error.
TEST(TritonImages, AlignedRowsTakeTheAlignedKernelOthersThePlainOne) {
  const auto* aligned = triton::find_image("masked_lm_backward_bf16_aligned", 9, 0);
  ASSERT_NE(aligned, nullptr);
  EXPECT_STREQ(aligned->signature, "*bf16:16,i64:16,*i64,*fp32,*fp32,*bf16:16,i64:16,i32,i32");
  const auto args = [](const torch::Tensor& logits, const torch::Tensor& grad) {
    const auto f32 = torch::zeros({logits.size(0)});
    const auto i64 = torch::zeros({logits.size(0)}, torch::kInt64);
    using triton::Arg;
    return std::vector<Arg>{
        Arg::pointer(logits),     Arg::i64(logits.stride(0)), Arg::pointer(i64),
        Arg::pointer(f32),        Arg::pointer(f32),          Arg::pointer(grad),
        Arg::i64(grad.stride(0)), Arg::i32(logits.size(0)),   Arg::i32(logits.size(1))};
  };
  const std::string plain = "masked_lm_backward_bf16";
  // Padded rows: 1,000 ids in rows of 1,024.
  const auto padded = torch::zeros({3, 1024}, torch::kBFloat16).narrow(1, 0, 1000);
  EXPECT_EQ(triton::aligned_variant(plain, 9, 0, args(padded, padded)), plain + "_aligned");
  EXPECT_EQ(triton::aligned_variant(plain, 8, 6, args(padded, padded)), plain + "_aligned");
  EXPECT_NO_THROW(triton::check_args(*aligned, args(padded, padded)));
  // One element in: a 2-byte offset.
  const auto shifted = torch::zeros({3, 1025}, torch::kBFloat16).narrow(1, 1, 1000);
  EXPECT_FALSE(triton::keeps_alignment(*aligned, args(shifted, padded)));
  EXPECT_EQ(triton::aligned_variant(plain, 9, 0, args(shifted, padded)), plain);
  // Base's generator rows without padding: 250,002 ids, a stride no multiple of 16.
  const auto base = torch::zeros({2, 250002}, torch::kBFloat16);
  EXPECT_EQ(triton::aligned_variant(plain, 9, 0, args(base, base)), plain);
  // The plain form takes all of them; no capability without an image gets an aligned name.
  EXPECT_NO_THROW(triton::check_args(*triton::find_image(plain, 9, 0), args(shifted, base)));
  EXPECT_EQ(triton::aligned_variant(plain, 7, 5, args(padded, padded)), plain);
  EXPECT_EQ(triton::aligned_variant("gemm_bias_gelu_bf16", 9, 0, {}), "gemm_bias_gelu_bf16");
}

// The attention kernels exist in the aligned form only: an input that is not aligned (a view one
// element in, a stride that is no multiple of 16) is copied before the launch, values unchanged;
// an aligned one is passed as it is.
TEST(TritonImages, MisalignedInputsAreCopiedForAlignedOnlyKernels) {
  const auto* image = triton::find_image("attention_forward_bf16_d64_gated_dropout", 9, 0);
  ASSERT_NE(image, nullptr);
  EXPECT_EQ(std::string(image->signature).substr(0, 24), "*bf16:16,*bf16:16,*bf16:");
  const auto qkv = torch::randn({2, 5, 3 * 4 * 64}).to(torch::kBFloat16);  // [B, T, 3 H d]
  // q as the model takes it: [B, H, T, d] views of the stacked projection.
  const auto q = qkv.narrow(2, 0, 4 * 64).view({2, 5, 4, 64}).transpose(1, 2);
  EXPECT_TRUE(triton::aligned_rows(q));
  EXPECT_EQ(triton::aligned_copy(q).data_ptr(), q.data_ptr()) << "no copy";
  const auto shifted = qkv.view(-1).narrow(0, 1, 2 * 4 * 5 * 64).view({2, 4, 5, 64});
  EXPECT_FALSE(triton::aligned_rows(shifted));
  const auto copied = triton::aligned_copy(shifted);
  EXPECT_NE(copied.data_ptr(), shifted.data_ptr());
  EXPECT_TRUE(triton::aligned_rows(copied));
  EXPECT_TRUE(torch::equal(copied, shifted));
  // A row stride of 70 elements: aligned start, strides no multiple of 16.
  const auto odd = torch::zeros({2, 4, 5, 70}, torch::kBFloat16).narrow(3, 0, 64);
  EXPECT_FALSE(triton::aligned_rows(odd));
  EXPECT_TRUE(triton::aligned_rows(triton::aligned_copy(odd)));
  // The copy keeps the gradient's path.
  const auto leaf = torch::randn({4 * 64 + 1}, torch::requires_grad());
  const auto view = leaf.narrow(0, 1, 4 * 64).view({1, 1, 4, 64});
  triton::aligned_copy(view).sum().backward();
  EXPECT_EQ(leaf.grad().sum().item<float>(), 4 * 64);
  std::vector<triton::Arg> args;
  for (const auto& t : {copied, copied, copied, copied}) args.push_back(triton::Arg::pointer(t));
  for (int i = 0; i < 4; ++i) args.push_back(triton::Arg::pointer(torch::zeros({1})));
  for (const auto& t : {copied, copied, copied}) {
    for (int dim = 0; dim < 3; ++dim) args.push_back(triton::Arg::i64(t.stride(dim)));
  }
  EXPECT_TRUE(triton::keeps_alignment(*image, args));
  args[0] = triton::Arg::pointer(shifted);
  EXPECT_FALSE(triton::keeps_alignment(*image, args));
}

#ifdef XLME_WITH_CUDA
// The host side of the random kernels' generator state (the device side, the kernels' loads, is
// tests/python's GraphCapturedPhilox): from LibTorch's PhiloxCudaState, outside a capture the seed
// and offset travel as values; inside one, the addresses of the device's seed and base offset and
// the offset within the graph. Either way six arguments in the kernels' order, which the compiled
// signatures accept, and which an autograd context carries to the backward unchanged.
TEST(TritonImages, PhiloxArgumentsFromTheGeneratorStateInAndOutOfACapture) {
  const auto from = [](const at::PhiloxCudaState& s) {
    return triton::philox_args(s.captured_, s.seed_.val, s.offset_.val, s.seed_.ptr, s.offset_.ptr,
                               s.offset_intragraph_);
  };
  const auto words = [](std::vector<triton::Arg> args) {
    std::vector<uint64_t> out;
    for (auto& a : args) {
      uint64_t v = 0;
      std::memcpy(&v, a.address(), a.type() == "u32" || a.type() == "i32" ? 4 : 8);
      out.push_back(v);
    }
    return out;
  };
  const uint64_t seed = 0x0123456789ABCDEFULL, offset = (uint64_t{3} << 32) | 40;
  const auto eager = from(at::PhiloxCudaState(seed, offset));
  EXPECT_FALSE(eager.captured);
  std::vector<triton::Arg> args;
  eager.append_to(args);
  ASSERT_EQ(args.size(), 6u);
  std::vector<std::string> types;
  for (const auto& a : args) types.push_back(a.type());
  EXPECT_EQ(types, (std::vector<std::string>{"u64", "u32", "u32", "*i64", "*i64", "i32"}));
  EXPECT_EQ(words(args), (std::vector<uint64_t>{seed, 40, 3, 0, 0, 0}));

  int64_t device_seed = 0, device_offset = 0;  // stand-ins for the generator's device values
  const auto captured = from(at::PhiloxCudaState(&device_seed, &device_offset, 12));
  EXPECT_TRUE(captured.captured);
  args.clear();
  captured.append_to(args);
  EXPECT_EQ(words(args), (std::vector<uint64_t>{0, 12, 0, reinterpret_cast<uintptr_t>(&device_seed),
                                                reinterpret_cast<uintptr_t>(&device_offset), 1}));
  // The backward's copy (an autograd context holds integers).
  const auto back = triton::PhiloxArgs::from_ints(captured.to_ints());
  EXPECT_EQ(back.seed_ptr, &device_seed);
  EXPECT_EQ(back.offset_ptr, &device_offset);
  EXPECT_EQ(back.offset, 12u);
  EXPECT_TRUE(back.captured);
  EXPECT_EQ(triton::PhiloxArgs::from_ints(eager.to_ints()).seed, seed);
  EXPECT_EQ(triton::PhiloxArgs::from_ints(eager.to_ints()).offset, offset);

  // Every random kernel takes them after its own leading arguments.
  const auto* image = triton::find_image("masked_lm_forward_bf16_sample", 9, 0);
  ASSERT_NE(image, nullptr);
  const auto logits = torch::zeros({2, 3}, torch::kBFloat16);
  const auto f32 = torch::zeros({2});
  const auto i64 = torch::zeros({2}, torch::kInt64);
  using triton::Arg;
  for (const auto* philox : {&eager, &captured}) {
    std::vector<Arg> launch{Arg::pointer(logits), Arg::i64(3), Arg::pointer(i64),
                            Arg::i32(2),          Arg::i32(3), Arg::f32(1.0)};
    philox->append_to(launch);
    for (int i = 0; i < 8; ++i) launch.push_back(Arg::i32(-1));
    for (const auto* t : {&f32, &f32, &i64, &i64}) launch.push_back(Arg::pointer(*t));
    EXPECT_NO_THROW(triton::check_args(*image, launch));
  }
  EXPECT_EQ(error_message([] { triton::philox_args(true, 0, 0, nullptr, nullptr, 4); }),
            "a captured Philox state without the device addresses of its seed and offset");
}
#endif

}  // namespace
}  // namespace xlme::ops
