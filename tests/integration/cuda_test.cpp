// The CUDA paths on a real GPU: SDPA against the math kernel (fp32 and bf16 autocast, outputs and
// every gradient, both against a float64 reference), the SDPA backend LibTorch picks for training
// and for evaluation, the replacement sampler's distribution under bf16 autocast, exact resume of
// a CUDA run, two Gloo ranks with CUDA tensors on one GPU (NCCL refuses two ranks on one GPU),
// and export parity from a CUDA-trained checkpoint. Without a CUDA device (CPU LibTorch, or no
// visible GPU) every test skips and says why. scripts/gpu_check.sh runs them on a lent GPU.
#include "xlme/checkpoint/manager.h"
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/common/precision.h"
#include "xlme/data/synthetic.h"
#include "xlme/dist/communicator.h"
#include "xlme/model/attention.h"
#include "xlme/model/electra.h"
#include "xlme/model/encoder.h"
#include "xlme/model/relative_position.h"
#include "xlme/objectives/objectives.h"
#include "xlme/ops/attention.h"
#include "xlme/ops/feed_forward.h"
#include "xlme/ops/masked_lm.h"
#include "xlme/ops/registry.h"
#include "xlme/ops/residual_layernorm.h"
#include "xlme/ops/triton.h"
#include "xlme/ops/weight_gradient.h"
#include "xlme/train/gradient_buckets.h"
#include "xlme/train/micro_batch_graphs.h"
#include "xlme/train/trainer.h"

#include "export_fixtures.h"
#include "test_util.h"
#include "train_fixtures.h"

#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <map>
#include <regex>

namespace xlme {
namespace {

using xlme::testing::quote;
using xlme::testing::read_file;
using xlme::testing::TempDir;

// Empty when CUDA tests can run here, else why not.
std::string cuda_unavailable_reason() {
#ifndef XLME_WITH_CUDA
  return "this build has no CUDA (LibTorch " TORCH_VERSION
         " without CUDA libraries: XLME_WITH_CUDA is off)";
#else
  if (!torch::cuda::is_available()) {
    return "LibTorch " TORCH_VERSION
           " has CUDA, but torch::cuda::is_available() is false (no visible GPU or driver)";
  }
  return "";
#endif
}

#define XLME_REQUIRE_CUDA()                                         \
  do {                                                              \
    if (const auto why = cuda_unavailable_reason(); !why.empty()) { \
      std::cout << "[ no CUDA  ] " << why << std::endl;             \
      GTEST_SKIP() << "no CUDA device: " << why;                    \
    }                                                               \
  } while (0)

const torch::Device kCuda(torch::kCUDA, 0);

// The one place that says how a test config runs on the GPU (device selection may change).
config::Config on_cuda(config::Config c) {
  c.run.device = "cuda";
  return c;
}

// ‖a − b‖ / ‖b‖ in float64 on the CPU.
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.detach().to(torch::kCPU, torch::kDouble);
  const auto y = b.detach().to(torch::kCPU, torch::kDouble);
  return (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-300);
}

// --- (a) SDPA against math -------------------------------------------------------------------

// Inputs of one gated-bias attention: q, k, v [B, H, T, d_k], padding [B, T], the table d
// [H, buckets] and the gate u, v [H, d_k], w [H]; float64 on the CPU.
struct CudaAttentionCase {
  torch::Tensor q, k, v, padding, d, u, gv, w;
  int64_t length = 0, buckets = 32, max_distance = 128;
};

CudaAttentionCase make_cuda_attention_case(int64_t length) {
  torch::manual_seed(17);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const int64_t batch = 3, heads = 4, head_dim = 64;
  CudaAttentionCase c;
  c.length = length;
  c.q = torch::randn({batch, heads, length, head_dim}, opts);
  c.k = torch::randn({batch, heads, length, head_dim}, opts);
  c.v = torch::randn({batch, heads, length, head_dim}, opts);
  c.padding = torch::zeros({batch, length}, torch::kBool);
  c.padding[1].narrow(0, length - 5, 5).fill_(true);
  c.padding[2].narrow(0, length - 17, 17).fill_(true);
  c.d = torch::randn({heads, c.buckets}, opts);
  c.u = torch::randn({heads, head_dim}, opts) * 0.2;
  c.gv = torch::randn({heads, head_dim}, opts) * 0.2;
  c.w = torch::randn({heads}, opts);
  return c;
}

// The output and the gradients w.r.t. q, k, v, d, u, v_gate, w of sum(out * weights), every
// input moved to `device`. q, k, v get `activation` dtype (what autocast's projections give);
// the bias parameters stay in `parameter` dtype, as the model's fp32 parameters do. With
// `autocast`, the call runs under bf16 autocast on `device`, as the trainer runs it.
std::vector<torch::Tensor> cuda_attention_forward_backward(
    const CudaAttentionCase& c, const torch::Tensor& weights, model::AttentionKernel kernel,
    const torch::Device& device, torch::ScalarType activation, torch::ScalarType parameter,
    bool autocast) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : {c.q, c.k, c.v}) {
    leaves.push_back(t.to(device, activation).detach().requires_grad_(true));
  }
  for (const auto& t : {c.d, c.u, c.gv, c.w}) {
    leaves.push_back(t.to(device, parameter).detach().requires_grad_(true));
  }
  torch::Tensor out;
  {
    AutocastScope scope(device, autocast);
    const auto buckets =
        model::relative_position_buckets(c.length, c.buckets, c.max_distance, device);  // [T, T]
    model::PositionBias bias;
    bias.table = model::toeplitz_bias(leaves[3], buckets);
    bias.gate_u = leaves[4];
    bias.gate_v = leaves[5];
    bias.gate_w = leaves[6];
    out = model::attention(leaves[0], leaves[1], leaves[2], c.padding.to(device), bias, 0.0, false,
                           kernel);
  }
  // Padded queries still produce rows; only the real ones are compared (and weighed).
  const auto real = (~c.padding).to(device).view({c.q.size(0), 1, c.q.size(2), 1});
  (out.to(torch::kDouble) * weights.to(device) * real).sum().backward();
  std::vector<torch::Tensor> results{(out.to(torch::kDouble) * real).detach()};
  for (const auto& leaf : leaves) results.push_back(leaf.grad().to(torch::kDouble));
  return results;
}

// Both kernels on the GPU against the math kernel in float64 on the CPU, from the same (rounded)
// inputs: relative error of the output and of each gradient at most `tolerance`. Lengths with
// T % 128 == 64 are where cuDNN's masked attention backward is reported to give NaN.
void expect_kernels_match_float64_at(int64_t length, torch::ScalarType activation, bool autocast,
                                     double tolerance) {
  auto c = make_cuda_attention_case(length);
  // The reference sees exactly the inputs the GPU sees: q, k, v rounded to `activation`.
  for (auto* t : {&c.q, &c.k, &c.v}) *t = t->to(activation).to(torch::kDouble);
  const auto weights = torch::randn_like(c.q);
  const auto reference =
      cuda_attention_forward_backward(c, weights, model::AttentionKernel::kMath, torch::kCPU,
                                      torch::kDouble, torch::kDouble, false);
  const char* names[] = {"output", "dq", "dk", "dv", "dd", "du", "dv_gate", "dw"};
  for (const auto kernel : {model::AttentionKernel::kMath, model::AttentionKernel::kSdpa}) {
    const auto got = cuda_attention_forward_backward(c, weights, kernel, kCuda, activation,
                                                     torch::kFloat, autocast);
    const char* kernel_name = kernel == model::AttentionKernel::kMath ? "math" : "sdpa";
    for (size_t i = 0; i < got.size(); ++i) {
      const double error = relative_error(got[i], reference[i]);
      std::cout << "[ rel.err. ] T=" << length << " " << kernel_name << " "
                << c10::toString(activation) << " " << names[i] << ": " << error << std::endl;
      EXPECT_TRUE(std::isfinite(error) && error <= tolerance)
          << kernel_name << " " << names[i] << ": relative error " << error << " > " << tolerance;
    }
  }
}

void expect_kernels_match_float64(torch::ScalarType activation, bool autocast, double tolerance) {
  for (const int64_t length : {40, 192}) {
    SCOPED_TRACE("T=" + std::to_string(length));
    expect_kernels_match_float64_at(length, activation, autocast, tolerance);
  }
}

TEST(CudaAttention, SdpaAndMathMatchFloat64InFp32) {
  XLME_REQUIRE_CUDA();
  // Exact fp32 matrix products: the trainer turns TF32 on, a test process does not.
  at::globalContext().setAllowTF32CuBLAS(false);
  expect_kernels_match_float64(torch::kFloat, /*autocast=*/false, 1e-4);
}

TEST(CudaAttention, SdpaAndMathMatchFloat64UnderBf16Autocast) {
  XLME_REQUIRE_CUDA();
  // bf16 operands: relative errors of 1e-3 to 1e-2 are bf16's rounding.
  expect_kernels_match_float64(torch::kBFloat16, /*autocast=*/true, 3e-2);
}

// --- (b) the SDPA backend LibTorch picks ---------------------------------------------------------

// at::_fused_sdp_choice's answer as a name (sdp::SDPBackend's order).
std::string sdp_backend_name(int64_t choice) {
  switch (choice) {
    case 0:
      return "math";
    case 1:
      return "flash_attention";
    case 2:
      return "efficient_attention";
    case 3:
      return "cudnn_attention";
    case 4:
      return "overrideable";
    default:
      return "error (" + std::to_string(choice) + ")";
  }
}

TEST(CudaAttention, ReportsTheFusedBackendForTrainingAndEvaluation) {
  XLME_REQUIRE_CUDA();
  // The base model's attention: 12 heads of 64, sequences of 512 and of 128, bf16 (autocast) with
  // the bias + padding mask that model::attention passes (a float mask in q's dtype, [B, H, T, T]).
  for (const int64_t length : {512, 128, 192}) {
    for (const bool training : {true, false}) {
      const auto opts = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
      auto q = torch::randn({2, 12, length, 64}, opts).requires_grad_(training);
      auto k = torch::randn({2, 12, length, 64}, opts).requires_grad_(training);
      auto v = torch::randn({2, 12, length, 64}, opts).requires_grad_(training);
      auto mask = torch::randn({2, 12, length, length}, opts).requires_grad_(training);
      const int64_t choice = at::_fused_sdp_choice(q, k, v, mask, training ? 0.1 : 0.0, false);
      const std::string name = sdp_backend_name(choice);
      std::cout << "[ sdpa     ] T=" << length << (training ? " training" : " evaluation") << ": "
                << name << std::endl;
      ::testing::Test::RecordProperty(
          "sdpa_backend_T" + std::to_string(length) + (training ? "_training" : "_evaluation"),
          name);
      EXPECT_GE(choice, 0) << "no SDPA backend accepts these inputs";
      // What was chosen runs, forward and backward, and gives finite values.
      auto out = at::scaled_dot_product_attention(q, k, v, mask, 0.0, false);
      EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
      if (training) {
        out.to(torch::kFloat).square().sum().backward();
        for (const auto& t : {q, k, v, mask}) {
          ASSERT_TRUE(t.grad().defined());
          EXPECT_TRUE(torch::isfinite(t.grad()).all().item<bool>());
        }
      }
    }
  }
}

// --- (c) the replacement sampler under bf16 autocast -------------------------------------------

TEST(CudaSampler, FollowsTheSoftmaxUnderBf16Autocast) {
  XLME_REQUIRE_CUDA();
  const int64_t vocab = 64, draws = 200000;
  const auto special = data::SpecialIds::for_vocab(vocab);
  // Logits as the generator head gives them under autocast: a product in bf16. Spread over
  // [-4, 4] with neighbours 0.13 apart: bf16 keeps ~3 digits, so rounded Gumbel scores tie often.
  torch::manual_seed(5);
  const auto hidden = torch::randn({1, 16}, kCuda);
  const auto table = torch::randn({16, vocab}, kCuda);
  torch::Tensor row;
  {
    AutocastScope scope(kCuda, true);
    row = torch::matmul(hidden, table);
  }
  ASSERT_EQ(row.scalar_type(), torch::kBFloat16) << "autocast did not give bf16 logits";
  // Replace the values by a known spread, keeping the dtype autocast gave.
  row = (torch::linspace(-4, 4, vocab, kCuda).view({1, vocab}) +
         0.05 * torch::randn({1, vocab}, kCuda))
            .to(row.scalar_type());
  const auto logits = row.expand({draws, vocab}).contiguous();
  torch::Tensor sampled;
  {
    AutocastScope scope(kCuda, true);
    sampled = model::sample_replacements(logits, 1.0, special);
  }
  const auto counts = torch::bincount(sampled.to(torch::kCPU), {}, vocab).to(torch::kDouble);
  // The expected distribution: softmax of the bf16 logits over the ordinary ids, in float64.
  auto expected_logits = row.to(torch::kCPU, torch::kDouble).view(-1).clone();
  for (const int64_t id : {special.bos, special.pad, special.eos, special.unk, special.mask}) {
    EXPECT_EQ(counts[id].item<double>(), 0) << "special id " << id << " was sampled";
    expected_logits[id] = -std::numeric_limits<double>::infinity();
  }
  const auto expected = torch::softmax(expected_logits, 0);
  const double tv = 0.5 * (counts / draws - expected).abs().sum().item<double>();
  // Sampling noise alone: E[TV] <= 0.5 * sum_i sqrt(2 p_i / (pi N)) <= 0.5 * sqrt(64) *
  // sqrt(2 / (pi * 200000)) = 0.0071 for any p. The same draws emulated on the CPU (LibTorch
  // 1.13): 0.005 from fp32 logits, 0.034 from these bf16 logits with the noise drawn in bf16.
  std::cout << "[ sampler  ] total variation " << tv << " over " << draws << " draws" << std::endl;
  EXPECT_LE(tv, 0.015) << "the draws are not from the softmax of the logits";
}

// --- (d) exact resume of a CUDA run --------------------------------------------------------------

// Deterministic CUDA kernels for the scope (index_add_ and friends use atomics otherwise, and
// two uninterrupted runs would differ already). cuBLAS needs its workspace config for that, set
// before its first handle; scripts/gpu_check.sh exports it as well.
class DeterministicCuda {
 public:
  DeterministicCuda() : was_(at::globalContext().deterministicAlgorithms()) {
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicCuda() { at::globalContext().setDeterministicAlgorithms(was_, false); }
  DeterministicCuda(const DeterministicCuda&) = delete;
  DeterministicCuda& operator=(const DeterministicCuda&) = delete;

 private:
  bool was_;
};

data::SyntheticBatches cuda_test_batches(const config::Config& c) {
  return data::SyntheticBatches(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15,
                                /*seed=*/11);
}

TEST(CudaTrainer, ResumedRunEqualsTheUninterruptedRun) {
  XLME_REQUIRE_CUDA();
  const DeterministicCuda deterministic;
  // Dropout and replacement sampling draw from the CUDA generator: its state must be in the
  // checkpoint. bf16 autocast (precision auto on CUDA).
  const auto c = on_cuda(xlme::testing::tiny_train_config(4, 2, /*dropout=*/0.1));
  TempDir dir;
  auto straight_source = cuda_test_batches(c);
  train::Trainer straight(c, xlme::testing::make_tiny_model(c, 5), straight_source,
                          xlme::testing::single_process(kCuda));
  ASSERT_TRUE(straight.device().is_cuda());
  EXPECT_TRUE(straight.bf16());
  for (int i = 0; i < 4; ++i) straight.train_step();

  std::string checkpoint;
  {
    auto source = cuda_test_batches(c);
    train::Trainer first(c, xlme::testing::make_tiny_model(c, 5), source,
                         xlme::testing::single_process(kCuda));
    first.train_step();
    first.train_step();
    checkpoint = first.save_checkpoint(checkpoint::CheckpointManager(dir / "ckpt", 2, 0));
    first.train_step();  // work after the checkpoint, lost by the "crash"
  }
  torch::manual_seed(999);  // the resumed process starts from other random state (CUDA too)
  auto source = cuda_test_batches(c);
  train::Trainer resumed(c, xlme::testing::make_tiny_model(c, 6), source,
                         xlme::testing::single_process(kCuda));
  resumed.load_checkpoint(checkpoint::CheckpointManager::verify(checkpoint));
  EXPECT_EQ(resumed.step(), 2);
  resumed.train_step();
  resumed.train_step();
  EXPECT_EQ(resumed.step(), straight.step());
  EXPECT_EQ(resumed.tokens_seen(), straight.tokens_seen());
  xlme::testing::expect_same_parameters(resumed.model(), straight.model(), /*atol=*/0);
}

// --- (e) two Gloo ranks with CUDA tensors on one GPU ---------------------------------------------

constexpr int kCudaDistSteps = 3;

config::Config cuda_two_rank_config(int64_t batch_per_rank) {
  // As TrainDist's: two micro-batches per step over all ranks, argmax sampling, no dropout; fp32
  // so that the 2 x 2 and the 4-sequence products agree to rounding.
  auto c = on_cuda(xlme::testing::tiny_train_config(batch_per_rank, 1, 0.0));
  c.train.tokens_per_task = 2 * 2 * 2 * 16;
  c.model.generator.sampling_temperature = 1e-6;
  c.train.precision = "fp32";
  c.dist.backend = "gloo";
  return c;
}

// Runs inside the spawned ranks only. Both ranks use GPU 0 (LOCAL_RANK unset).
TEST(CudaDist, DISABLED_Worker) {
  const auto launch = dist::launch_info_from_env();
  const auto comm = dist::Communicator::create(launch, dist::use_device("cuda", launch), "gloo",
                                               std::chrono::seconds(60));
  const auto c = cuda_two_rank_config(2);
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 2, 16, 0.15, 21,
                                comm->rank(), comm->world_size());
  train::Trainer trainer(c, xlme::testing::make_tiny_model(c, 100 + comm->rank()), source, comm);
  ASSERT_TRUE(trainer.device().is_cuda());
  at::globalContext().setAllowTF32CuBLAS(false);  // exact fp32 (the trainer turned TF32 on)
  for (int i = 0; i < kCudaDistSteps; ++i) trainer.train_step();
  if (comm->rank() == 0) {
    trainer.model()->to(torch::kCPU);
    torch::save(trainer.model(), std::getenv("XLME_TRAIN_RESULT"));
  }
}

TEST(CudaDist, TwoGlooRanksOnOneGpuEqualOneProcess) {
  XLME_REQUIRE_CUDA();
  TempDir dir;
  const std::string port = std::to_string(xlme::testing::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    pids.push_back(xlme::testing::spawn_self("CudaDist.DISABLED_Worker",
                                             {{"RANK", std::to_string(rank)},
                                              {"WORLD_SIZE", "2"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", port},
                                              {"XLME_TRAIN_RESULT", dir / "two_ranks.pt"}}));
  }
  for (const pid_t pid : pids) ASSERT_EQ(xlme::testing::wait_exit_code(pid), 0);

  const auto c = cuda_two_rank_config(4);  // one process, both ranks' 2 + 2 sequences
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 21);
  train::Trainer single(c, xlme::testing::make_tiny_model(c, 100), source,
                        xlme::testing::single_process(kCuda));
  at::globalContext().setAllowTF32CuBLAS(false);
  ASSERT_EQ(single.micro_batches_per_task(), 2);
  for (int i = 0; i < kCudaDistSteps; ++i) single.train_step();
  single.model()->to(torch::kCPU);

  auto two_ranks = xlme::testing::make_tiny_model(c, 0);
  torch::load(two_ranks, dir / "two_ranks.pt");
  xlme::testing::expect_same_parameters(single.model(), two_ranks, 1e-5);
}

// --- (f) export parity from a CUDA-trained checkpoint -------------------------------------------

// The Python that runs scripts/xlme_reference.py: $XLME_REFERENCE_PYTHON (gpu_check.sh sets the
// one that imports torch), else python3 on the PATH.
std::string reference_python() {
  const char* set = std::getenv("XLME_REFERENCE_PYTHON");
  return set != nullptr && *set != '\0' ? set : "python3";
}

std::pair<int, std::string> cuda_test_shell(const std::string& command) {
  const TempDir scratch;
  const int status = std::system((command + " >" + quote(scratch / "out") + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(scratch / "out")};
}

TEST(CudaExport, ParityFromACudaTrainedCheckpoint) {
  XLME_REQUIRE_CUDA();
  const std::string python = reference_python();
  const auto [import_code, import_out] = cuda_test_shell(python + " -c 'import torch, numpy'");
  ASSERT_EQ(import_code, 0) << python << " cannot import torch and numpy (set "
                            << "XLME_REFERENCE_PYTHON to one that can):\n"
                            << import_out;
  TempDir dir;
  const auto tokenizer = xlme::testing::train_tiny_tokenizer(dir / "tok");
  // Trained on the GPU in bf16 autocast, saved from CUDA tensors.
  const auto config = on_cuda(xlme::testing::tiny_export_config(tokenizer, {}));
  auto checkpoint = xlme::testing::make_tiny_checkpoint(config, dir / "run");
  ASSERT_TRUE(checkpoint.model->parameters().front().is_cuda());
  const auto run = xlme::testing::run_tool(
      "xlme-export", {"--checkpoint", checkpoint.path, "--out", dir / "export"});
  ASSERT_EQ(run.code, 0) << run.err;

  auto p = checkpoint::load_pretrained(dir / "export");
  torch::manual_seed(11);
  const int64_t length = 24;
  auto ids = torch::randint(4, p.special_ids.vocab_size - 1, {3, length}, torch::kLong);
  auto padding = torch::zeros({3, length}, torch::kBool);
  const int64_t lengths[] = {length, 15, 7};
  for (int64_t row = 0; row < 3; ++row) {
    ids[row][0] = p.special_ids.bos;
    ids[row][lengths[row] - 1] = p.special_ids.eos;
    ids[row].narrow(0, lengths[row], length - lengths[row]).fill_(p.special_ids.pad);
    padding[row].narrow(0, lengths[row], length - lengths[row]).fill_(true);
  }
  const auto positions = torch::arange(length).unsqueeze(0).expand({3, length}).contiguous();
  std::vector<torch::Tensor> states, on_gpu;
  {
    torch::NoGradGuard no_grad;
    states = p.discriminator->discriminator->hidden_states(ids, positions, padding);
    // The trained model itself, still on the GPU, in fp32: the same function up to rounding. The
    // trainer turned TF32 on for its products (10-bit mantissas): off for this comparison.
    at::globalContext().setAllowTF32CuBLAS(false);
    on_gpu = checkpoint.model->discriminator->hidden_states(ids.to(kCuda), positions.to(kCuda),
                                                            padding.to(kCuda));
  }
  const auto real = (~padding).unsqueeze(-1);
  for (size_t i = 0; i < states.size(); ++i) {
    const double diff = ((states[i] - on_gpu[i].to(torch::kCPU)) * real).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4) << "CPU export vs the CUDA model, hidden state " << i;
  }
  checkpoint::SafetensorsContent inputs, expected;
  inputs.tensors = {{"input_ids", ids}, {"positions", positions}, {"padding", padding}};
  for (size_t i = 0; i < states.size(); ++i) {
    expected.tensors["hidden." + std::to_string(i)] = states[i];
  }
  checkpoint::write_safetensors(dir / "inputs.safetensors", inputs);
  checkpoint::write_safetensors(dir / "expected.safetensors", expected);
  const auto [code, out] =
      cuda_test_shell("cd " + quote(XLME_SOURCE_DIR) + " && " + python +
                      " scripts/xlme_reference.py --model " + quote(dir / "export") +
                      " --encoder discriminator --inputs " + quote(dir / "inputs.safetensors") +
                      " --compare " + quote(dir / "expected.safetensors") + " --tolerance 1e-4");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(out, match, std::regex(R"(\{"max_abs_diff": .*\})"))) << out;
  const auto diffs =
      nlohmann::json::parse(match[0].str())["max_abs_diff"].get<std::vector<double>>();
  std::cout << "[ parity   ] CUDA-trained: max |diff| per hidden state " << nlohmann::json(diffs)
            << std::endl;
  EXPECT_EQ(code, 0) << out;
  ASSERT_EQ(diffs.size(), states.size());
  for (size_t i = 0; i < diffs.size(); ++i) EXPECT_LE(diffs[i], 1e-4) << "hidden state " << i;
}

// --- (g) the fused ops' Triton kernels against their references ---------------------------------

namespace fused {

struct OpsRestored {
  ~OpsRestored() { ops::set_ops(""); }
};

// Expects, at the end of its scope, that kernels whose names start with `prefix` launched since
// it was made: a fused test that fell back to its reference would otherwise compare the
// reference with itself.
class ExpectLaunches {
 public:
  explicit ExpectLaunches(std::string prefix)
      : prefix_(std::move(prefix)), before_(ops::triton::launch_count(prefix_)) {}
  ~ExpectLaunches() {
    EXPECT_GT(ops::triton::launch_count(prefix_), before_)
        << prefix_ << "*: no launch; the fused path fell back to its reference";
  }
  ExpectLaunches(const ExpectLaunches&) = delete;
  ExpectLaunches& operator=(const ExpectLaunches&) = delete;

 private:
  std::string prefix_;
  int64_t before_;
};

struct LmRun {
  ops::MaskedLm out;
  torch::Tensor grad;
};

LmRun run_masked_lm(const std::string& spec, const torch::Tensor& logits,
                    const torch::Tensor& targets) {
  ops::set_ops(spec);
  auto x = logits.detach().clone().requires_grad_();
  LmRun run{ops::masked_lm(x, targets), {}};
  run.out.loss_sum.backward();
  run.grad = x.grad();
  return run;
}

}  // namespace fused

TEST(CudaOps, FusedMaskedLmEqualsTheReference) {
  XLME_REQUIRE_CUDA();
  const fused::ExpectLaunches launched_0("masked_lm_forward");
  const fused::ExpectLaunches launched_1("masked_lm_backward");
  const fused::OpsRestored restore;
  const torch::Device cuda(torch::kCUDA, 0);
  ASSERT_TRUE(ops::triton::available("masked_lm_forward_bf16", cuda))
      << "no Triton image for this GPU";
  torch::manual_seed(21);
  // Awkward sizes: a vocabulary that is no multiple of the blocks, a single row, many rows.
  for (const auto& [rows, vocab] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 17}, {37, 5003}, {2458, 32003}}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const auto logits = (torch::randn({rows, vocab}, cuda) * 4).to(dtype);
      const auto targets =
          torch::randint(0, vocab, {rows}, torch::TensorOptions(cuda).dtype(torch::kInt64));
      // The reference in float64 from the same (rounded) logits: the kernel accumulates in fp32,
      // while LibTorch's cross-entropy of bf16 logits outside autocast rounds the loss to bf16.
      const auto ref =
          fused::run_masked_lm("masked_lm=reference", logits.to(torch::kFloat64), targets);
      const auto got = fused::run_masked_lm("masked_lm=fused", logits, targets);
      const auto where = fmt::format("{}x{} {}", rows, vocab, c10::toString(dtype));
      EXPECT_NEAR(got.out.loss_sum.item<double>(), ref.out.loss_sum.item<double>(),
                  1e-5 * std::abs(ref.out.loss_sum.item<double>()) + 1e-4)
          << where;
      EXPECT_EQ(got.out.correct.item<int64_t>(), ref.out.correct.item<int64_t>()) << where;
      // Softmax gradients lie in [-1, 1]: fp32's sums differ from float64's by a few ulps of 1,
      // and bf16's rounding of the gradient is 2^-9 of 1.
      const double tol = dtype == torch::kBFloat16 ? 8e-3 : 4e-6;
      EXPECT_LE(
          (got.grad.to(torch::kFloat64) - ref.grad.to(torch::kFloat64)).abs().max().item<double>(),
          tol)
          << where;
      EXPECT_EQ(got.grad.scalar_type(), dtype) << where;
    }
  }
}

// Base's vocabulary, with the generator's padded rows (a [N, 250,002] view of [N, 250,048], what
// ops::linear(.., 64) writes) and draws: the aligned kernels run, and loss, argmax count, draws
// and gradient are the bits of the same logits in contiguous rows (the plain kernels). A view
// one element in takes the plain kernels too, with the same bits, and no error.
TEST(CudaOps, PaddedLogitsTakeTheAlignedKernelsWithTheSameBits) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  ops::set_ops("masked_lm=fused");
  torch::manual_seed(29);
  const int64_t rows = 37, vocab = 250002;
  const auto dense = (torch::randn({rows, vocab}, kCuda) * 4).to(torch::kBFloat16);
  auto padded_buffer = torch::full({rows, 250048}, std::nan(""), dense.options());
  auto padded = padded_buffer.narrow(1, 0, vocab);
  padded.copy_(dense);
  auto shifted_buffer = torch::empty({rows * vocab + 1}, dense.options());
  auto shifted = shifted_buffer.narrow(0, 1, rows * vocab).view({rows, vocab});
  shifted.copy_(dense);
  const auto targets =
      torch::randint(0, vocab, {rows}, torch::TensorOptions(kCuda).dtype(torch::kInt64));
  const ops::Sampling sampling{1.0, {0, 1, 2, 3}};
  struct Got {
    torch::Tensor loss, correct, sampled, grad;
  };
  const auto run = [&](const torch::Tensor& logits) {
    auto x = logits.detach().requires_grad_();
    torch::manual_seed(31);
    const auto lm = ops::masked_lm(x, targets, &sampling);
    lm.loss_sum.backward();
    return Got{lm.loss_sum, lm.correct, lm.sampled, x.grad()};
  };
  const int64_t aligned_before = ops::triton::launch_count("masked_lm_forward_bf16_sample_aligned");
  const int64_t plain_before = ops::triton::launch_count("masked_lm_backward_bf16") -
                               ops::triton::launch_count("masked_lm_backward_bf16_aligned");
  const Got want = run(dense);
  const Got got = run(padded);
  EXPECT_EQ(ops::triton::launch_count("masked_lm_forward_bf16_sample_aligned"), aligned_before + 1);
  EXPECT_EQ(got.grad.stride(0), 250048) << "the gradient keeps the padded layout";
  const Got off = run(shifted);
  EXPECT_EQ(ops::triton::launch_count("masked_lm_backward_bf16") -
                ops::triton::launch_count("masked_lm_backward_bf16_aligned"),
            plain_before + 2)
      << "the contiguous and the shifted rows take the plain backward";
  for (const auto* g : {&got, &off}) {
    EXPECT_TRUE(torch::equal(g->loss, want.loss));
    EXPECT_TRUE(torch::equal(g->correct, want.correct));
    EXPECT_TRUE(torch::equal(g->sampled, want.sampled));
    EXPECT_TRUE(torch::equal(g->grad, want.grad));
  }
}

// Rows padded by ModelInputs::padded_masked (target -100) add nothing, in both paths, and their
// gradient rows are zero.
TEST(CudaOps, FusedMaskedLmIgnoresPaddingRows) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  torch::manual_seed(23);
  const auto logits = (torch::randn({37, 5003}, kCuda) * 4).to(torch::kBFloat16);
  auto targets = torch::randint(0, 5003, {37}, torch::TensorOptions(kCuda).dtype(torch::kInt64));
  targets.narrow(0, 30, 7).fill_(model::kIgnoredTarget);
  const auto real = targets.narrow(0, 0, 30);
  // Float64 over the real rows alone; the reference path of bf16 logits rounds its loss to bf16
  // (2^-8 relative), the kernel accumulates in fp32.
  const auto ref = fused::run_masked_lm("masked_lm=reference",
                                        logits.narrow(0, 0, 30).to(torch::kFloat64), real);
  for (const std::string spec : {"masked_lm=reference", "masked_lm=fused"}) {
    const auto got = fused::run_masked_lm(spec, logits, targets);
    const double relative = spec == "masked_lm=fused" ? 1e-5 : 4e-3;
    EXPECT_NEAR(got.out.loss_sum.item<double>(), ref.out.loss_sum.item<double>(),
                relative * std::abs(ref.out.loss_sum.item<double>()) + 1e-4)
        << spec;
    EXPECT_EQ(got.out.correct.item<int64_t>(), ref.out.correct.item<int64_t>()) << spec;
    EXPECT_EQ(got.grad.narrow(0, 30, 7).abs().max().item<double>(), 0.0) << spec;
    EXPECT_LE(relative_error(got.grad.narrow(0, 0, 30), ref.grad), 1e-2) << spec;
  }
}

TEST(CudaOps, FusedDrawsFollowTheSoftmaxAndRepeatWithTheGenerator) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  ops::set_ops("masked_lm=fused");
  const torch::Device cuda(torch::kCUDA, 0);
  const int64_t vocab = 64, draws = 200000;
  const auto row = (torch::linspace(-4, 4, vocab, cuda) + 0.05 * torch::randn({vocab}, cuda))
                       .to(torch::kBFloat16);
  const auto logits = row.view({1, vocab}).expand({draws, vocab}).contiguous();
  const ops::Sampling sampling{0.9, {0, 1, 2, 3, 63}};
  torch::manual_seed(17);
  const auto sampled = ops::sample(logits, sampling);
  const auto counts = torch::bincount(sampled.to(torch::kCPU), {}, vocab).to(torch::kDouble);
  auto expected_logits = row.to(torch::kCPU, torch::kDouble) / 0.9;
  for (const int64_t id : sampling.excluded) {
    EXPECT_EQ(counts[id].item<double>(), 0) << "excluded id " << id << " was drawn";
    expected_logits[id] = -std::numeric_limits<double>::infinity();
  }
  const double tv =
      0.5 * (counts / draws - torch::softmax(expected_logits, 0)).abs().sum().item<double>();
  std::cout << "[ fused    ] total variation " << tv << " over " << draws << " draws" << std::endl;
  EXPECT_LE(tv, 0.015);
  torch::manual_seed(17);
  EXPECT_TRUE(torch::equal(ops::sample(logits, sampling), sampled)) << "same seed, other draws";
  EXPECT_FALSE(torch::equal(ops::sample(logits, sampling), sampled)) << "the offset did not move";
}

TEST(CudaOps, FusedResidualLayerNormEqualsTheReference) {
  XLME_REQUIRE_CUDA();
  const fused::ExpectLaunches launched_0("residual_layernorm_forward");
  const fused::ExpectLaunches launched_1("residual_layernorm_backward");
  const fused::OpsRestored restore;
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(23);
  for (const int64_t width : {1, 65, 768, 2560}) {
    for (const auto y_dtype : {torch::kFloat32, torch::kBFloat16}) {
      for (const double p : {0.0, 0.1}) {
        torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({width}).eps(1e-5));
        norm->to(cuda);
        torch::NoGradGuard no_grad;
        norm->weight.normal_();
        norm->bias.normal_();
        const auto x0 = torch::randn({4, 129, width}, cuda);
        const auto y0 = torch::randn({4, 129, width}, cuda).to(y_dtype);
        const auto dout = torch::randn({4, 129, width}, cuda);
        const auto run = [&](const std::string& spec, const torch::Tensor& keep) {
          ops::set_ops(spec);
          torch::AutoGradMode grad(true);
          auto x = x0.clone().requires_grad_();
          auto y =
              (keep.defined() ? y0 * keep.to(y_dtype) / (1 - p) : y0).detach().requires_grad_();
          for (auto& param : norm->parameters()) param.mutable_grad() = torch::Tensor();
          const auto out =
              ops::residual_dropout_layernorm(x, y, keep.defined() ? 0.0 : p, true, norm);
          out.backward(dout);
          return std::vector<torch::Tensor>{out, x.grad(), y.grad(), norm->weight.grad(),
                                            norm->bias.grad()};
        };
        const auto got = run("residual_layernorm=fused", {});
        // The fused dropout's mask shows in dy: zero where an element was dropped.
        const auto keep = p > 0 ? got[2].ne(0) : torch::Tensor();
        // (A LayerNorm over one element is constant: its dy is zero whatever the mask.)
        if (p > 0 && width > 1) {
          const double kept = keep.to(torch::kDouble).mean().item<double>();
          EXPECT_NEAR(kept, 0.9, 0.01) << width;
        }
        const auto want = run("residual_layernorm=reference", keep);
        const char* names[] = {"out", "dx", "dy", "dweight", "dbias"};
        for (size_t i = 0; i < got.size(); ++i) {
          auto expected = want[i];
          // The reference's leaf was y * keep / (1 - p): d/dy is its gradient times that factor.
          if (i == 2 && p > 0) expected = expected * keep.to(expected.scalar_type()) / (1 - p);
          const double scale = std::max(1.0, expected.abs().max().item<double>());
          // bf16: the reference rounds y * keep / (1 - p) and dy to bf16 (2^-9 relative).
          const double tol = (y_dtype == torch::kBFloat16 ? 2e-2 : 1e-4) * scale;
          EXPECT_LE(
              (got[i].to(torch::kDouble) - expected.to(torch::kDouble)).abs().max().item<double>(),
              tol)
              << names[i] << " width " << width << " p " << p << " " << c10::toString(y_dtype);
        }
      }
    }
  }
}

TEST(CudaOps, AStepWithEveryFusedOpMatchesTheReferenceStep) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  const torch::Device cuda(torch::kCUDA, 0);
  // The tiny model with the MLM head (no draws, whose random streams differ between the paths),
  // no dropout: both paths compute the same function.
  const auto c = on_cuda(xlme::testing::tiny_train_config(4, 1, /*dropout=*/0.0));
  const auto special = data::SpecialIds::for_vocab(c.model.vocab_size);
  auto batches = cuda_test_batches(c);
  const auto batch = batches.next(data::Task::kMono);
  std::vector<double> losses;
  for (const std::string spec : {"reference", "fused"}) {
    ops::set_ops(spec);
    torch::manual_seed(1);
    model::ElectraModel model(c.model, model::Architecture::kMaskedLm, special);
    model->to(cuda);
    const auto out = model->forward(model->inputs(batch).to(cuda));
    const auto lm = ops::masked_lm(out.generator_logits, out.generator_targets);
    lm.loss_sum.backward();
    losses.push_back(lm.loss_sum.item<double>());
  }
  EXPECT_NEAR(losses[1], losses[0], 1e-4 * std::abs(losses[0]));
}

// Base's widths (768 wide, 12 heads of 64, FFN 3,072) with XLM-R's 250,002-id vocabulary (a row
// stride no 16-byte alignment divides), 130 tokens (no multiple of the 64-wide tiles), a padded
// sequence, bf16 autocast as the trainer runs it: the loss and every parameter's gradient of the
// fused step against the fp32 reference step, beside the bf16 reference step's own distance from
// it. The fused path may lose no more than bf16's rounding already does.
TEST(CudaOps, ABaseWidthBf16StepWithEveryFusedOpIsAsCloseToFp32AsTheReference) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  at::globalContext().setAllowTF32CuBLAS(false);
  auto c = on_cuda(xlme::testing::tiny_train_config(2, 1, /*dropout=*/0.0));
  c.model.vocab_size = 250002;
  c.model.hidden_size = 768;
  c.model.heads = 12;
  c.model.ffn_size = 3072;
  c.model.layers = 2;
  c.model.max_positions = 512;
  const auto special = data::SpecialIds::for_vocab(c.model.vocab_size);
  data::SyntheticBatches batches(special, 2, 130, 0.15, /*seed=*/11);
  auto batch = batches.next(data::Task::kMono);
  struct Run {
    double loss = 0;
    std::vector<std::pair<std::string, torch::Tensor>> grads;
    std::string ops;
  };
  const auto run = [&](const std::string& spec, bool autocast) {
    ops::set_ops(spec);
    torch::manual_seed(1);
    model::ElectraModel model(c.model, model::Architecture::kMaskedLm, special);
    model->to(kCuda);
    Run r;
    {
      AutocastScope scope(kCuda, autocast);
      const auto out = model->forward(model->inputs(batch).to(kCuda));
      const auto lm = ops::masked_lm(out.generator_logits, out.generator_targets);
      lm.loss_sum.backward();
      r.loss = lm.loss_sum.item<double>();
    }
    for (const auto& p : model->named_parameters()) {
      if (p.value().grad().defined()) r.grads.emplace_back(p.key(), p.value().grad().clone());
    }
    r.ops = ops::describe(kCuda);
    return r;
  };
  const Run fp32 = run("reference", false);
  const Run bf16 = run("reference", true);
  const char* kernels[] = {"attention_forward", "attention_backward", "residual_layernorm",
                           "masked_lm_forward", "masked_lm_backward", "gemm_"};
  std::vector<int64_t> before;
  for (const char* kernel : kernels) before.push_back(ops::triton::launch_count(kernel));
  const Run fused = run("fused", true);
  std::cout << "[ parity   ] fused ops: " << fused.ops << std::endl;
  for (size_t i = 0; i < std::size(kernels); ++i) {
    const int64_t launched = ops::triton::launch_count(kernels[i]) - before[i];
    std::cout << "[ parity   ] " << kernels[i] << "* launches: " << launched << std::endl;
    EXPECT_GT(launched, 0) << kernels[i] << ": the fused step fell back to the reference";
  }
  ASSERT_EQ(fused.grads.size(), fp32.grads.size());
  ASSERT_EQ(bf16.grads.size(), fp32.grads.size());
  const auto loss_error = [&](const Run& r) { return std::abs(r.loss - fp32.loss) / fp32.loss; };
  std::cout << "[ rel.err. ] loss: reference bf16 " << loss_error(bf16) << ", fused bf16 "
            << loss_error(fused) << std::endl;
  EXPECT_LE(loss_error(fused), 2 * loss_error(bf16) + 1e-3);
  // The key projection's bias has an exact gradient of zero (softmax ignores a constant per
  // query): its errors are measured against the query bias's gradient of the same layer.
  std::map<std::string, torch::Tensor> by_name(fp32.grads.begin(), fp32.grads.end());
  for (size_t i = 0; i < fp32.grads.size(); ++i) {
    const auto& [name, expected] = fp32.grads[i];
    ASSERT_EQ(fused.grads[i].first, name);
    const auto key = name.find("attention.key.bias");
    const auto scale_of = [&](const torch::Tensor& got) {
      if (key == std::string::npos) return relative_error(got, expected);
      auto query = name;
      query.replace(key, 18, "attention.query.bias");
      const auto diff = (got.to(torch::kDouble) - expected.to(torch::kDouble)).norm();
      return diff.item<double>() / by_name.at(query).to(torch::kDouble).norm().item<double>();
    };
    const double reference_error = scale_of(bf16.grads[i].second);
    const double fused_error = scale_of(fused.grads[i].second);
    std::cout << "[ rel.err. ] d" << name << ": reference bf16 " << reference_error
              << ", fused bf16 " << fused_error << std::endl;
    EXPECT_TRUE(std::isfinite(fused_error) && fused_error <= 2 * reference_error + 2e-3)
        << name << ": the fused step's gradient is " << fused_error
        << " from the fp32 step's, the bf16 reference step's " << reference_error;
  }
}

// The error of one train_step() with XLME_CUDA_SYNC_DEBUG=error (every host wait inside the
// micro-batch loop an error), or "".
std::string step_error_with_sync_debug(train::Trainer& trainer) {
  ::setenv("XLME_CUDA_SYNC_DEBUG", "error", 1);
  std::string error;
  try {
    trainer.train_step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  ::unsetenv("XLME_CUDA_SYNC_DEBUG");
  return error;
}

// The same for the tiny model's third step (3 micro-batches, dropout 0.1), after two warm-up steps
// (caches filled), under the current XLME_OPS.
std::string third_step_error_with_sync_debug() {
  const auto c = on_cuda(xlme::testing::tiny_train_config(4, 3, /*dropout=*/0.1));
  auto source = cuda_test_batches(c);
  train::Trainer trainer(c, xlme::testing::make_tiny_model(c, 5), source,
                         xlme::testing::single_process(kCuda));
  trainer.train_step();
  trainer.train_step();
  return step_error_with_sync_debug(trainer);
}

TEST(CudaTrainer, TheMicroBatchLoopNeverWaitsForTheDevice) {
  XLME_REQUIRE_CUDA();
  // XLME_CUDA_SYNC_DEBUG=error makes every host wait inside the micro-batch loop an error (the
  // step's one read of its totals comes after the loop).
  EXPECT_EQ(third_step_error_with_sync_debug(), "") << "a host wait inside the micro-batch loop";
}

TEST(CudaOps, FusedAttentionEqualsTheFloat64MathPath) {
  XLME_REQUIRE_CUDA();
  const fused::ExpectLaunches launched_0("attention_forward");
  const fused::ExpectLaunches launched_1("attention_backward");
  const fused::OpsRestored restore;
  ops::set_ops("attention=fused");
  const torch::Device cuda(torch::kCUDA, 0);
  // Self-attention with the gated bias and the plain bias from the model's bucket table (32 up to
  // 128: constant beyond 91, so that tiles wholly beyond it take the far shortcut from T = 220 on),
  // and cross-attention (Tq != Tk, no bias); lengths that are not multiples of the 64-wide tiles,
  // 512 and 1,024; the second sequence padded.
  const int64_t far = model::relative_position_far_distance(32, 128);
  for (const auto& [tq, tk, bias, gated] :
       std::vector<std::tuple<int64_t, int64_t, bool, bool>>{{130, 130, true, true},
                                                             {192, 192, true, true},
                                                             {65, 65, true, false},
                                                             {17, 90, false, false},
                                                             {300, 300, true, false},
                                                             {512, 512, true, true},
                                                             {1024, 1024, true, true}}) {
    torch::manual_seed(31);
    const int64_t batch = 2, heads = 4, d = 64;
    const auto make = [&](int64_t t) { return torch::randn({batch, heads, t, d}); };
    const auto q0 = make(tq), k0 = make(tk), v0 = make(tk);
    auto padding = torch::zeros({batch, tk}, torch::kBool);
    padding[1].narrow(0, tk - 7, 7).fill_(true);
    model::PositionBias bias0;
    torch::Tensor d0;  // [H, 32]: the bucket table
    if (bias) d0 = torch::randn({heads, 32}) * 0.5;
    if (gated) {
      bias0.gate_u = torch::randn({heads, d}) * 0.1;
      bias0.gate_v = torch::randn({heads, d}) * 0.1;
      bias0.gate_w = torch::rand({heads}) + 0.5;
    }
    const auto dout = torch::randn({batch, heads, tq, d});
    // The same leaves on `device` in `dtype`; output and every leaf's gradient, in float64.
    const auto run = [&](const torch::Device& device, torch::ScalarType dtype) {
      std::vector<torch::Tensor> leaves;
      const auto leaf = [&](const torch::Tensor& t, torch::ScalarType type) {
        if (!t.defined()) return t;
        leaves.push_back(t.to(device, type).requires_grad_());
        return leaves.back();
      };
      const auto q = leaf(q0, dtype), k = leaf(k0, dtype), v = leaf(v0, dtype);
      model::PositionBias b;
      const auto wide = dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
      const auto table = leaf(d0, wide);
      b.gate_u = leaf(bias0.gate_u, wide);
      b.gate_v = leaf(bias0.gate_v, wide);
      b.gate_w = leaf(bias0.gate_w, wide);
      torch::Tensor out;
      {
        AutocastScope scope(device, device.is_cuda());  // the gate's product in bf16, as training
        if (table.defined()) {
          b.table = model::toeplitz_bias(
              table, model::relative_position_buckets(tq, 32, 128, device));  // [H, T, T]
          b.far = far;
        }
        out = model::attention(q, k, v, padding.to(device), b, 0.0, true,
                               model::AttentionKernel::kMath);
      }
      out.backward(dout.to(device, out.scalar_type()));
      std::vector<torch::Tensor> result{out.detach().to(torch::kCPU, torch::kDouble)};
      for (const auto& l : leaves) result.push_back(l.grad().to(torch::kCPU, torch::kDouble));
      return result;
    };
    const auto want = run(torch::kCPU, torch::kDouble);  // the math path in float64
    const auto got = run(cuda, torch::kBFloat16);        // bf16 inputs: the fused kernel
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const double scale = std::max(1.0, want[i].abs().max().item<double>());
      const double error = (got[i] - want[i]).abs().max().item<double>() / scale;
      std::cout << "[ rel.err. ] fused attention Tq " << tq << " Tk " << tk << " output/gradient "
                << i << ": " << error << std::endl;
      EXPECT_LE(error, 3e-2) << "output/gradient " << i << " Tq " << tq << " Tk " << tk << " bias "
                             << bias << " gated " << gated;
    }
  }
}

// The fused kernel in an ALBERT encoder (every layer one module, the bias table shared across
// layers) at a length with far tiles, under bf16 autocast, against the reference path on the
// same GPU: outputs and every parameter's gradient, summed by autograd over the three depths.
TEST(CudaOps, FusedAttentionInAnAlbertSharedEncoder) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  const torch::Device cuda(torch::kCUDA, 0);
  config::ModelArgs o;
  o.vocab_size = 300;
  o.max_positions = 320;
  o.embedding_size = 64;
  o.hidden_size = 256;
  o.layers = 3;
  o.heads = 4;
  o.ffn_size = 512;
  o.dropout = 0.0;
  o.attention_dropout = 0.0;
  o.relative_position.shared_across_layers = true;
  o.share_layers = model::LayerSharing::kAll;
  o.attention = config::AttentionChoice::kMath;
  torch::manual_seed(8);
  auto buckets = std::make_shared<model::BucketCache>(o.relative_position.num_buckets,
                                                      o.relative_position.max_distance);
  // The shared embeddings belong to the model that holds the encoder: moved here by hand.
  model::SharedEmbeddings embeddings(o);
  embeddings->to(cuda);
  model::Encoder encoder(o, embeddings, buckets);
  encoder->to(cuda);
  const int64_t batch = 2, length = 300;
  const auto ids = torch::randint(5, o.vocab_size, {batch, length}, torch::kInt64).to(cuda);
  const auto positions = torch::arange(length, torch::kInt64).expand({batch, length}).to(cuda);
  auto padding = torch::zeros({batch, length}, torch::kBool);
  padding[1].narrow(0, length - 40, 40).fill_(true);
  padding = padding.to(cuda);
  const auto weights = torch::randn({batch, length, o.hidden_size}).to(cuda);
  const auto run = [&](const std::string& spec) {
    ops::set_ops(spec);
    encoder->zero_grad();
    torch::Tensor out;
    {
      AutocastScope scope(cuda, true);
      out = encoder->forward(ids, positions, padding);
    }
    (out.to(torch::kFloat) * weights).sum().backward();
    std::vector<std::pair<std::string, torch::Tensor>> result{
        {"output", out.detach().to(torch::kFloat)}};
    for (const auto& p : encoder->named_parameters()) {
      if (p.value().grad().defined()) result.emplace_back(p.key(), p.value().grad().clone());
    }
    return result;
  };
  const auto want = run("attention=reference");
  const auto got = run("attention=fused");
  ASSERT_EQ(got.size(), want.size());
  // The key projection's bias adds q_i . b to every score of query i: softmax ignores it, so its
  // exact gradient is zero and both paths give rounding noise. Its error is measured against the
  // query bias's gradient instead.
  double query_bias_scale = 0;
  for (const auto& [name, grad] : want) {
    if (name.find("attention.query.bias") != std::string::npos) {
      query_bias_scale = grad.abs().max().item<double>();
    }
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const bool key_bias = got[i].first.find("attention.key.bias") != std::string::npos;
    const double scale =
        std::max(1e-3, key_bias ? query_bias_scale : want[i].second.abs().max().item<double>());
    const double error = (got[i].second - want[i].second).abs().max().item<double>() / scale;
    std::cout << "[ rel.err. ] ALBERT fused attention " << got[i].first << ": " << error
              << std::endl;
    EXPECT_LE(error, 5e-2) << got[i].first;
  }
}

// The variant Base trains with (gated bias, dropout) against the math path in float64 with the
// very mask the kernel drew. The mask is read back through the kernel: with q = k = 0 and no bias
// every real key has probability 1 / L (L real keys in the sequence), so with v the one-hot
// columns of one 64-key block, out[i, a] = keep[i, c0 + a] / (L (1 - p)). The mask is a function
// of the generator's state and (sequence-head, i, j) alone, and the generator is reseeded before
// each call, so the gated call draws the same one.
TEST(CudaOps, FusedGatedAttentionWithDropoutEqualsTheMathPathWithItsMask) {
  XLME_REQUIRE_CUDA();
  const fused::ExpectLaunches launched_0("attention_forward");
  const fused::ExpectLaunches launched_1("attention_backward");
  const fused::OpsRestored restore;
  ops::set_ops("attention=fused");
  const int64_t batch = 2, heads = 4, t = 128, d = 64;
  const double p = 0.1;
  const uint64_t seed = 41;
  auto padding = torch::zeros({batch, t}, torch::kBool);
  padding[1].narrow(0, t - 7, 7).fill_(true);
  const auto cuda_padding = padding.to(kCuda);
  const auto bf16 = torch::TensorOptions(kCuda).dtype(torch::kBFloat16);
  auto keep = torch::zeros({batch, heads, t, t}, torch::kDouble);
  const auto zeros = torch::zeros({batch, heads, t, d}, bf16);
  const auto lengths = (~padding).sum(1).to(torch::kDouble).view({batch, 1, 1, 1});
  for (int64_t c0 = 0; c0 < t; c0 += d) {
    auto v = torch::zeros({batch, heads, t, d}, bf16);
    v.narrow(2, c0, d).copy_(torch::eye(d, bf16).expand({batch, heads, d, d}));
    torch::cuda::manual_seed_all(seed);
    torch::NoGradGuard no_grad;
    const auto out =
        model::attention(zeros, zeros, v, cuda_padding, {}, p, true, model::AttentionKernel::kMath);
    keep.narrow(3, c0, d).copy_((out.to(torch::kCPU, torch::kDouble) * lengths * (1 - p)).round());
  }
  keep.masked_fill_(padding.view({batch, 1, 1, t}), 0.0);
  ASSERT_TRUE(torch::equal(keep, keep.clamp(0, 1))) << "every element is kept or dropped";
  const double kept = keep.sum().item<double>() / ((~padding).sum().item<double>() * heads * t);
  std::cout << "[ rel.err. ] gated + dropout: kept fraction " << kept << std::endl;
  EXPECT_NEAR(kept, 1 - p, 0.01);  // 126,976 draws: sd 0.0008

  torch::manual_seed(43);
  const auto q0 = torch::randn({batch, heads, t, d}), k0 = torch::randn({batch, heads, t, d}),
             v0 = torch::randn({batch, heads, t, d});
  const auto table0 = torch::randn({heads, 32}) * 0.5;
  const auto u0 = torch::randn({heads, d}) * 0.1, gv0 = torch::randn({heads, d}) * 0.1,
             w0 = torch::rand({heads}) + 0.5;
  const auto dout = torch::randn({batch, heads, t, d});
  // Output and the gradients of q, k, v, the table and the gate, in float64 on the CPU.
  const auto run = [&](bool fused_path) {
    const auto device = fused_path ? kCuda : torch::Device(torch::kCPU);
    const auto activation = fused_path ? torch::kBFloat16 : torch::kDouble;
    const auto parameter = fused_path ? torch::kFloat : torch::kDouble;
    std::vector<torch::Tensor> leaves;
    for (const auto& x : {q0, k0, v0}) leaves.push_back(x.to(device, activation).requires_grad_());
    for (const auto& x : {table0, u0, gv0, w0}) {
      leaves.push_back(x.to(device, parameter).requires_grad_());
    }
    model::PositionBias bias;
    bias.gate_u = leaves[4];
    bias.gate_v = leaves[5];
    bias.gate_w = leaves[6];
    torch::Tensor out;
    if (fused_path) {
      AutocastScope scope(kCuda, true);
      bias.table =
          model::toeplitz_bias(leaves[3], model::relative_position_buckets(t, 32, 128, kCuda));
      bias.far = model::relative_position_far_distance(32, 128);
      torch::cuda::manual_seed_all(seed);
      out = model::attention(leaves[0], leaves[1], leaves[2], cuda_padding, bias, p, true,
                             model::AttentionKernel::kMath);
    } else {
      bias.table = model::toeplitz_bias(leaves[3],
                                        model::relative_position_buckets(t, 32, 128, torch::kCPU));
      auto scores = torch::matmul(leaves[0], leaves[1].transpose(-2, -1)) / std::sqrt(double(d));
      scores = model::add_position_bias(scores, model::gate_factor(leaves[0], bias), bias.table,
                                        padding);
      out = torch::matmul(torch::softmax(scores, -1) * keep / (1 - p), leaves[2]);
    }
    out.backward(dout.to(device, out.scalar_type()));
    std::vector<torch::Tensor> result{out.detach().to(torch::kCPU, torch::kDouble)};
    for (const auto& l : leaves) result.push_back(l.grad().to(torch::kCPU, torch::kDouble));
    return result;
  };
  const auto want = run(false);
  const auto got = run(true);
  const char* names[] = {"output", "dq", "dk", "dv", "dtable", "du", "dv_gate", "dw"};
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max(1.0, want[i].abs().max().item<double>());
    const double error = (got[i] - want[i]).abs().max().item<double>() / scale;
    std::cout << "[ rel.err. ] gated + dropout " << names[i] << ": " << error << std::endl;
    EXPECT_LE(error, 3e-2) << names[i];
  }
}

// The fused kernel's dropout read back through the output: with q = k = 0 every probability is
// 1 / T and v = I, so out[i, j] = keep_ij / (T (1 - p)). The kept fraction, the same mask for the
// same generator state, another for the next call, and dV = P_kept^T dO with that mask.
TEST(CudaOps, FusedAttentionDropoutKeepsItsFractionAndFollowsTheGenerator) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  ops::set_ops("attention=fused");
  const torch::Device cuda(torch::kCUDA, 0);
  const int64_t batch = 4, heads = 8, t = 64;
  const double p = 0.1;
  const auto bf16 = torch::TensorOptions(cuda).dtype(torch::kBFloat16);
  const auto q = torch::zeros({batch, heads, t, t}, bf16);
  const auto v = torch::eye(t, bf16).expand({batch, heads, t, t}).contiguous().requires_grad_();
  const auto mask_of = [&](const torch::Tensor& out) {
    return (out.to(torch::kDouble) * (t * (1 - p))).round();
  };
  torch::cuda::manual_seed_all(12);
  const auto out = model::attention(q, q, v, {}, {}, p, true, model::AttentionKernel::kMath);
  const auto keep = mask_of(out.detach());
  EXPECT_TRUE(torch::equal(keep, keep.clamp(0, 1))) << "every element is kept or dropped";
  const double kept = keep.mean().item<double>();
  std::cout << "[ rel.err. ] fused attention dropout kept fraction " << kept << std::endl;
  EXPECT_NEAR(kept, 1 - p, 0.006);  // 131,072 draws: sd 0.0008
  const auto dout = torch::randn({batch, heads, t, t}, bf16);
  out.backward(dout);
  const auto dv_want = keep.transpose(-1, -2).matmul(dout.to(torch::kDouble)) / (t * (1 - p));
  EXPECT_LE((v.grad().to(torch::kDouble) - dv_want).abs().max().item<double>(), 2e-2);
  torch::cuda::manual_seed_all(12);
  const auto again =
      model::attention(q, q, v.detach(), {}, {}, p, true, model::AttentionKernel::kMath);
  EXPECT_TRUE(torch::equal(mask_of(again), keep));
  const auto next =
      model::attention(q, q, v.detach(), {}, {}, p, true, model::AttentionKernel::kMath);
  EXPECT_FALSE(torch::equal(mask_of(next), keep));
}

TEST(CudaOps, FusedFeedForwardEqualsTheFloat64Block) {
  XLME_REQUIRE_CUDA();
  const fused::ExpectLaunches launched_0("gemm_bias_gelu");
  const fused::ExpectLaunches launched_1("gemm_dgelu_bgrad");
  const fused::OpsRestored restore;
  const torch::Device cuda(torch::kCUDA, 0);
  // Token counts that are not multiples of the 128-row tiles; the demo's and Base's widths.
  for (const auto& [tokens, hidden, ffn] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2 * 129, 64, 256}, {1000, 768, 3072}}) {
    torch::manual_seed(37);
    model::FeedForward block(hidden, ffn, 0.02);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : block->parameters()) p.normal_(0.0, 0.05);
    }
    const auto x0 = torch::randn({tokens / 2, 2, hidden});
    const auto dout = torch::randn({tokens / 2, 2, hidden});
    // Output and the gradients of x and of every parameter, in float64 on the CPU.
    const auto run = [&](const torch::Device& device, torch::ScalarType dtype,
                         const std::string& spec) {
      ops::set_ops(spec);
      model::FeedForward copy(hidden, ffn, 0.02);
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < copy->parameters().size(); ++i) {
          copy->parameters()[i].copy_(block->parameters()[i]);
        }
      }
      copy->to(device, dtype);
      auto x = x0.to(device, dtype).requires_grad_();
      torch::Tensor out;
      {
        AutocastScope scope(device, device.is_cuda());
        EXPECT_EQ(ops::fused_feed_forward_applies(x, copy->intermediate, copy->output),
                  spec == "feed_forward=fused");
        out = copy->forward(x);
      }
      out.backward(dout.to(device, out.scalar_type()));
      std::vector<torch::Tensor> result{out.detach().to(torch::kCPU, torch::kDouble),
                                        x.grad().to(torch::kCPU, torch::kDouble)};
      for (const auto& p : copy->parameters()) {
        result.push_back(p.grad().to(torch::kCPU, torch::kDouble));
      }
      return result;
    };
    const auto want = run(torch::kCPU, torch::kDouble, "reference");
    const auto fused_bf16 = run(cuda, torch::kFloat32, "feed_forward=fused");
    const auto unfused_bf16 = run(cuda, torch::kFloat32, "feed_forward=reference");
    const char* names[] = {"out", "dx", "dW1", "db1", "dW2", "db2"};
    for (size_t i = 0; i < want.size(); ++i) {
      const double scale = std::max(1e-3, want[i].abs().max().item<double>());
      const double fused_error = (fused_bf16[i] - want[i]).abs().max().item<double>() / scale;
      const double unfused_error = (unfused_bf16[i] - want[i]).abs().max().item<double>() / scale;
      std::cout << "[ fused    ] " << names[i] << " " << tokens << "x" << hidden << "x" << ffn
                << ": max error / max |value| fused " << fused_error << ", unfused bf16 "
                << unfused_error << std::endl;
      // bf16 products and activations: within what the unfused bf16 path itself errs, doubled.
      EXPECT_LE(fused_error, std::max(2.0 * unfused_error, 1e-2)) << names[i];
    }
  }
}

// weight_grad=fused on CUDA: cuBLAS's bf16 x bf16 -> fp32 product adds into the fp32 buffer
// (beta 1), for whole and column-sliced dy (attention's stacked q, k, v); a linear layer under
// autocast and the fused feed-forward block give their weights the reference's gradients; a
// trainer's step with it makes no host wait.
TEST(CudaOps, WeightGradientAddsBf16ProductsIntoFp32Buffers) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  ops::set_ops("weight_grad=fused");
  torch::manual_seed(41);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const auto dy3 = torch::randn({1000, 3 * 256}, bf16), x = torch::randn({1000, 768}, bf16);
  for (const bool sliced : {false, true}) {
    const auto dy = sliced ? dy3.narrow(1, 256, 256) : dy3;
    const auto earlier = torch::randn({dy.size(1), 768});
    auto buffer = earlier.to(kCuda);
    const auto* address = buffer.data_ptr();
    ops::accumulate_weight_gradient(buffer, dy, x);
    EXPECT_EQ(buffer.data_ptr(), address);
    const auto want = earlier.to(torch::kDouble) +
                      dy.to(torch::kCPU, torch::kDouble).t().mm(x.to(torch::kCPU, torch::kDouble));
    const double error =
        ((buffer.to(torch::kCPU, torch::kDouble) - want).norm() / want.norm()).item<double>();
    std::cout << "[ wgrad    ] " << (sliced ? "sliced" : "whole") << " dy: relative error " << error
              << std::endl;
    EXPECT_LT(error, 1e-5) << (sliced ? "sliced" : "whole");
  }
  // A feed-forward block under autocast, fused and not, in place and through autograd.
  for (const std::string block_ops : {"feed_forward=reference", "feed_forward=fused"}) {
    std::vector<std::vector<torch::Tensor>> grads;
    for (const std::string weight_ops : {"weight_grad=reference", "weight_grad=fused"}) {
      ops::set_ops(block_ops + "," + weight_ops);
      torch::manual_seed(42);
      model::FeedForward block(768, 3072, 0.02);
      block->to(kCuda);
      for (auto& p : block->parameters()) p.mutable_grad() = torch::zeros_like(p);
      const auto input = torch::randn({2, 300, 768}, torch::TensorOptions().device(kCuda));
      torch::Tensor out;
      {
        AutocastScope scope(kCuda, true);
        out = block->forward(input);
      }
      out.to(torch::kFloat32).pow(2).sum().backward();
      grads.emplace_back();
      for (const auto& p : block->parameters()) grads.back().push_back(p.grad().to(torch::kCPU));
    }
    for (size_t i = 0; i < grads[0].size(); ++i) {
      const double error = ((grads[1][i] - grads[0][i]).norm() / grads[0][i].norm()).item<double>();
      std::cout << "[ wgrad    ] " << block_ops << " parameter " << i
                << ": in place vs autograd, relative " << error << std::endl;
      EXPECT_LT(error, 1e-2) << block_ops << " parameter " << i;  // dW's bf16 rounding apart
    }
  }
  ops::set_ops("weight_grad=fused");
  EXPECT_EQ(third_step_error_with_sync_debug(), "") << "a host wait inside the micro-batch loop";
}

// --- (g) CUDA graphs of the micro-batch (train.cuda_graphs)
// ---------------------------------------

// Five micro-batches of one padded shape through MicroBatchGraphs (two eager, one captured and
// replayed, two replays) against the same five as plain eager passes on a twin model, from the
// same generator state: every micro-batch's terms and the accumulated gradients agree (dropout
// 0.1: a replay draws the eager pass's dropout masks; argmax sampling, whose draws the atomics'
// rounding cannot flip), and a replay marks the parameters it gives gradients as present.
void expect_replays_equal_eager_passes() {
  auto c = on_cuda(xlme::testing::tiny_train_config(4, 1, /*dropout=*/0.1));
  c.train.precision = "fp32";
  c.model.generator.sampling_temperature = 1e-6;
  const objectives::Objectives objectives(c.objectives, c.distill);
  auto batches = cuda_test_batches(c);
  std::vector<model::ModelInputs> inputs;
  auto shape_model = xlme::testing::make_tiny_model(c, 5);
  for (int i = 0; i < 5; ++i) {
    const auto host = shape_model->inputs(batches.next(data::Task::kMono));
    const int64_t capacity =
        model::masked_capacity(host.labels.size(0), host.labels.size(1), c.objectives.mask_ratio);
    inputs.push_back(host.padded_masked(capacity).to(kCuda, /*non_blocking=*/false));
  }
  struct Run {
    std::vector<double> losses;
    std::vector<torch::Tensor> grads;
    std::vector<char> present;
    int64_t captured = 0, replays = 0;
  };
  auto run = [&](bool graphed) {
    auto model = xlme::testing::make_tiny_model(c, 5);
    model->to(kCuda);
    model->train();
    auto parameters = model->parameters();
    auto comm = xlme::testing::single_process(kCuda);
    train::GradientBuckets buckets(parameters, 1 << 20, *comm,
                                   train::GradientBuckets::Reduction::kAllReduce);
    train::MicroBatchGraphs graphs(buckets);
    std::map<std::string, torch::Tensor> step;
    for (const auto& name : objectives.term_names()) {
      step[name] = torch::full({}, 50.0, torch::TensorOptions(kCuda).dtype(torch::kFloat64));
    }
    const auto& normalizers = graphs.normalizers(step);
    const auto pass = [&](const model::ModelInputs& in) {
      auto terms = objectives.compute(model->forward(in), data::Task::kMono);
      objectives::weighted_loss(terms, normalizers).backward();
      return terms;
    };
    Run r;
    torch::manual_seed(7);
    buckets.attach();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (i == 4) buckets.attach();  // a new step: the last replay alone marks the presence
      const auto terms = graphed ? graphs.run("mono", inputs[i], pass) : pass(inputs[i]);
      double loss = 0;
      for (const auto& t : terms) loss += t.weight * t.loss_sum.item<double>();
      r.losses.push_back(loss);
    }
    torch::cuda::synchronize();
    for (const auto& p : parameters) r.grads.push_back(p.grad().detach().cpu().clone());
    for (std::size_t i = 0; i < parameters.size(); ++i) r.present.push_back(buckets.present(i));
    r.captured = graphs.captured();
    r.replays = graphs.replays();
    return r;
  };
  const Run eager = run(false);
  const Run graphed = run(true);
  EXPECT_EQ(graphed.captured, 1);
  EXPECT_EQ(graphed.replays, 3);
  for (std::size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-4 * std::abs(eager.losses[i]) + 1e-5)
        << "micro-batch " << i;
  }
  ASSERT_EQ(graphed.grads.size(), eager.grads.size());
  for (std::size_t i = 0; i < eager.grads.size(); ++i) {
    EXPECT_LE(relative_error(graphed.grads[i], eager.grads[i]), 1e-4) << "parameter " << i;
    EXPECT_EQ(graphed.present[i], eager.present[i]) << "parameter " << i;
  }
}

TEST(CudaGraphs, ReplaysEqualEagerPassesTermsAndGradients) {
  XLME_REQUIRE_CUDA();
  expect_replays_equal_eager_passes();
}

// The same with the fused random kernels (the generator's draws, residual + dropout + LayerNorm)
// captured in the graph: under a capture they read the generator's seed and offset on the device,
// so that every replay draws what its eager pass drew (docs/gpu.md#cuda-graphs). A capture that
// froze the host's values would replay the first replay's masks and fail here.
TEST(CudaGraphs, FusedRandomKernelsInAGraphDrawAsTheirEagerPasses) {
  XLME_REQUIRE_CUDA();
  const fused::OpsRestored restore;
  ops::set_ops("masked_lm=fused,residual_layernorm=fused,attention=fused");
  const fused::ExpectLaunches draws("masked_lm_forward_fp32_sample");
  const fused::ExpectLaunches dropout("residual_layernorm_forward_fp32_fp32_1024_dropout");
  expect_replays_equal_eager_passes();
}

// A trainer with train.cuda_graphs=on: four micro-batches per task, so that the mono shape is
// warmed up, captured and replayed and the para one captured; finite losses, no host wait in the
// micro-batch loop once the graphs exist, and a checkpoint that resumes (graphs captured anew).
TEST(CudaGraphs, ATrainerWithGraphsTrainsWithoutHostWaitsAndResumes) {
  XLME_REQUIRE_CUDA();
  auto c = on_cuda(xlme::testing::tiny_train_config(4, 4, /*dropout=*/0.1));
  c.train.cuda_graphs = "on";
  auto source = cuda_test_batches(c);
  train::Trainer trainer(c, xlme::testing::make_tiny_model(c, 5), source,
                         xlme::testing::single_process(kCuda));
  ASSERT_NE(trainer.cuda_graphs(), nullptr) << trainer.cuda_graphs_choice();
  trainer.train_step();
  const auto second = trainer.train_step();
  EXPECT_GE(trainer.cuda_graphs()->captured(), 2);
  EXPECT_GE(trainer.cuda_graphs()->replays(), 2);
  EXPECT_TRUE(std::isfinite(second.loss));
  EXPECT_EQ(step_error_with_sync_debug(trainer), "")
      << "a host wait inside the micro-batch loop with graphs";
  TempDir dir;
  const auto checkpoint =
      trainer.save_checkpoint(checkpoint::CheckpointManager(dir / "ckpt", 2, 0));
  auto resumed_source = cuda_test_batches(c);
  train::Trainer resumed(c, xlme::testing::make_tiny_model(c, 6), resumed_source,
                         xlme::testing::single_process(kCuda));
  resumed.load_checkpoint(checkpoint::CheckpointManager::verify(checkpoint));
  const auto after = resumed.train_step();
  EXPECT_TRUE(std::isfinite(after.loss));
  EXPECT_EQ(resumed.step(), 4);
}

}  // namespace
}  // namespace xlme
