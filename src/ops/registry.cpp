#include "xlme/ops/registry.h"

#include "xlme/common/error.h"

#include <c10/core/Device.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <sstream>

namespace xlme::ops {

namespace {

enum class Choice { kAuto, kReference, kFused };

// Per op, in Op's order: whether a fused form exists on the CPU and on CUDA, whether `auto` picks
// it there, and whether `auto` keeps the reference while CUDA graphs live (a fused form that draws
// random numbers, which no GPU run has yet checked inside a captured graph). A fused CUDA form
// turns auto on only after a GPU run showed it correct and faster in the Base step (docs/ops.md
// lists what each one measured), and on under graphs after a captured step equalled the eager one.
struct Row {
  Op op;
  const char* cpu_form;   // nullptr: no fused CPU form
  const char* cuda_form;  // nullptr: no fused CUDA form
  bool auto_cpu;
  bool auto_cuda;
  bool unproven_in_graphs;
};

constexpr std::array<Row, kOpCount> kOps{{
    {Op::kDropout, "cpu kernel", nullptr, true, false, false},
    {Op::kMaskedLm, nullptr, "triton", false, true, true},
    {Op::kResidualLayerNorm, nullptr, "triton", false, true, true},
    // Correct on CUDA, but slower than SDPA's memory-efficient kernel (docs/gpu.md).
    {Op::kAttention, nullptr, "triton", false, false, true},
    // The reference's index_select backward adds atomically, T^2 adds into 32 addresses a head.
    {Op::kToeplitzBias, nullptr, "one-hot backward", false, true, false},
    {Op::kFeedForward, nullptr, "triton", false, true, false},
    // CPUs without AVX512 have no bf16 products of their own (docs/performance.md).
    {Op::kLinear, "bf16 emulation", nullptr, true, false, false},
    // CPU: fewer passes per weight and micro-batch (docs/ops.md, `weight_grad`, has the figures).
    {Op::kWeightGradient, "in-place fp32 product", "cuBLAS bf16 x bf16 -> fp32, beta 1", true,
     false, false},
}};

constexpr bool rows_in_op_order() {
  for (size_t i = 0; i < kOps.size(); ++i) {
    if (static_cast<size_t>(kOps[i].op) != i) return false;
  }
  return true;
}
static_assert(rows_in_op_order(), "kOps holds one row per op of XLME_OP_LIST, in its order");

std::atomic<int> graph_safe_holders{0};

std::vector<Choice> parse(const std::string& spec) {
  const auto value = [&](const std::string& text) {
    if (text == "auto") return Choice::kAuto;
    if (text == "reference") return Choice::kReference;
    XLME_CHECK(text == "fused", "XLME_OPS: '{}' in '{}' is not auto, reference or fused", text,
               spec);
    return Choice::kFused;
  };
  std::vector<Choice> choices(kOps.size(), Choice::kAuto);
  std::stringstream stream(spec);
  for (std::string token; std::getline(stream, token, ',');) {
    if (token.empty()) continue;
    const auto eq = token.find('=');
    if (eq == std::string::npos) {
      std::fill(choices.begin(), choices.end(), value(token));
      continue;
    }
    const auto name = token.substr(0, eq);
    const auto& names = op_names();
    const auto it = std::find(names.begin(), names.end(), name);
    XLME_CHECK(it != names.end(), "XLME_OPS: unknown op '{}' in '{}'; the ops are {}", name, spec,
               fmt::join(names, ", "));
    choices[static_cast<size_t>(it - names.begin())] = value(token.substr(eq + 1));
  }
  return choices;
}

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

std::vector<Choice>& state() {
  static std::vector<Choice> choices = [] {
    const char* env = std::getenv("XLME_OPS");
    return parse(env ? env : "");
  }();
  return choices;
}

}  // namespace

bool sdpa_by_default(const c10::Device& device) {
  return device.is_cuda();
}

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = [] {
#define XLME_OP_NAME(op, name) name,
    return std::vector<std::string>{XLME_OP_LIST(XLME_OP_NAME)};
#undef XLME_OP_NAME
  }();
  return names;
}

Impl implementation(Op op, const c10::Device& device) {
  const auto index = static_cast<size_t>(op);
  const Row& row = kOps[index];
  Choice choice;
  {
    std::lock_guard<std::mutex> lock(mutex());
    choice = state()[index];
  }
  const bool cuda = device.is_cuda();
  const bool exists = cuda ? row.cuda_form != nullptr : device.is_cpu() && row.cpu_form != nullptr;
  if (!exists || choice == Choice::kReference) return Impl::kReference;
  if (choice == Choice::kFused) return Impl::kFused;
  if (cuda && row.unproven_in_graphs && graph_safe_holders.load() > 0) return Impl::kReference;
  return (cuda ? row.auto_cuda : row.auto_cpu) ? Impl::kFused : Impl::kReference;
}

GraphSafeOps::GraphSafeOps() {
  ++graph_safe_holders;
}

GraphSafeOps::~GraphSafeOps() {
  --graph_safe_holders;
}

void set_ops(const std::string& spec) {
  auto parsed = parse(spec);
  std::lock_guard<std::mutex> lock(mutex());
  state() = std::move(parsed);
}

std::string describe(const c10::Device& device) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < kOps.size(); ++i) {
    const auto impl = implementation(static_cast<Op>(i), device);
    const char* form = device.is_cuda() ? kOps[i].cuda_form : kOps[i].cpu_form;
    const std::string& name = op_names()[i];
    parts.push_back(impl == Impl::kFused ? fmt::format("{}=fused ({})", name, form)
                                         : fmt::format("{}=reference", name));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace xlme::ops
