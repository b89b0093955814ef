// The masked-LM loss and the generator's replacement draw (docs/ops.md, `masked_lm`): at the masked
// rows, the summed cross-entropy, the number of rows whose argmax is the target (MLM accuracy),
// and optionally one draw per row from softmax(logits / temperature) with some ids excluded
// (XLM-E's generator sampling, ../shared/DESIGN.md).
//
// Reference (ops::reference): LibTorch's cross_entropy and max; draws on the CPU by inverse CDF,
// elsewhere by Gumbel-max from torch::rand. Fused (CUDA, XLME_OPS masked_lm=fused): one Triton
// pass over the logits gives the log-sum-exp, the loss, the argmax and a Gumbel-max draw from
// in-kernel Philox counters of LibTorch's CUDA generator (so a resumed run draws the same tokens),
// and the backward writes grad * (softmax - onehot) in one pass (src/ops/triton/masked_lm.py).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace xlme::ops {

struct Sampling {
  double temperature = 1.0;
  std::vector<int64_t> excluded;  // ids never drawn (at most 8): the special ids
};

struct MaskedLm {
  torch::Tensor loss_sum;  // [] float32 (float64 for float64 logits): sum of -log p(target)
  torch::Tensor correct;   // [] int64: rows whose first maximum is the target
  torch::Tensor sampled;   // [N] int64 draws, without gradient; undefined without sampling
};

// logits: [N, V] floating, targets: [N] int64 in [0, V), on one device; a target of -100
// (model::kIgnoredTarget: a padding row) adds nothing to the loss or the correct count, and its
// row's gradient is zero. The loss has a gradient with respect to the logits.
MaskedLm masked_lm(const torch::Tensor& logits, const torch::Tensor& targets,
                   const Sampling* sampling = nullptr);

// The multiple of ids to which the logits' rows are best padded for masked_lm on `device`: 64
// where its fused form runs (rows that start 16-byte aligned, which its kernels read 16 bytes at
// a time, and which cuBLAS writes and reads with aligned leading dimensions), else 1 (no
// padding). The generator's head lays its logits out so (ops::linear's row_multiple).
int64_t logits_row_multiple(const torch::Device& device);

// The draws alone: [N] int64, no gradient.
torch::Tensor sample(const torch::Tensor& logits, const Sampling& sampling);

namespace reference {
MaskedLm masked_lm(const torch::Tensor& logits, const torch::Tensor& targets,
                   const Sampling* sampling = nullptr);
torch::Tensor sample(const torch::Tensor& logits, const Sampling& sampling);
}  // namespace reference

}  // namespace xlme::ops
