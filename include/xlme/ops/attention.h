// Attention with XLM-E's gated relative position bias as one fused op on CUDA
// (src/ops/triton/attention.py; docs/ops.md#the-attention-kernel): no [B, H, T, T] tensor, the
// bias built from a per-distance table and the gate factor inside the kernel, key padding from
// each sequence's length, dropout from Philox counters of LibTorch's CUDA generator.
//
// The reference is model/attention.h's math and SDPA paths; model::attention() asks
// fused_attention_applies() first. XLME_OPS attention=fused turns it on; `auto` keeps the
// reference until a GPU run has verified the kernel.
#pragma once

#include <torch/types.h>

namespace xlme::ops {

// Whether the fused kernel runs for these inputs: chosen in the registry, a CUDA device with a
// compiled image, bf16 q, k and v of head size 64 or 32 whose last dimension is contiguous.
bool fused_attention_applies(const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v);

// q: [B, H, Tq, d], k and v: [B, H, Tk, d]; padding: [B, Tk] bool, true at padded keys, which
// must be trailing (xlme's batches are right-padded: data/batch_writer.cpp), or undefined;
// table: [H, Tq, Tk] Toeplitz bias (undefined: none), factor: [B, H, Tq, 1] (undefined: no gate);
// far: the distance |i - j| from which the table is constant on each side (model::PositionBias::
// far), so that tiles wholly beyond it read one value and reduce their gradient to one entry;
// 0: unknown, every tile gathers. Differentiable with respect to q, k, v, table and factor.
// Returns [B, H, Tq, d] in q's dtype.
torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& padding,
                              const torch::Tensor& table, const torch::Tensor& factor,
                              double dropout, bool training, int64_t far = 0);

// [H, Tq, Tk] Toeplitz table -> [H, Tq + Tk - 1] float32, what the kernel reads: the bias at
// distance delta = i - j at index delta + Tk - 1 (the first row reversed, then the first column
// below the corner). Differentiable; any device.
torch::Tensor distance_table(const torch::Tensor& table);

// The table's gradient [H, Tq + Tk - 1] float32 from the rows of partial sums the kernel's dQ
// programs write, without atomics so that it has the same bits in every run: `sums` is
// [B * H, Q, (Q + K) * block + 2] (Q, K: the query and key blocks of `block` rows), program
// (b, h, q)'s row holding its tiles' sums by distance delta at index delta + K * block, and the
// sums of its far tiles at +far and -far in the last two entries. Adds the rows of every sequence
// and query block in a fixed order; any device.
torch::Tensor attention_table_gradient(const torch::Tensor& sums, int64_t batch, int64_t heads,
                                       int64_t tq, int64_t tk, int64_t far, int64_t block);

}  // namespace xlme::ops
