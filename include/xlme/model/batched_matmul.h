// The attention's batched products on the CPU. LibTorch 1.13's CPU bmm loops over the batch and
// hands every small product ([T, d_k] x [d_k, T] per head) to a BLAS that splits each one over its
// threads; at these sizes the threads spend more time meeting than multiplying (measured on 2 AMD
// EPYC cores under OpenBLAS: 13-15 GFLOP/s with 2 threads, 28-37 with 1). Here the batch is split
// over LibTorch's threads instead, each product running on one BLAS thread, reading the operands
// through their strides (the heads' views of [B, T, H, d_k] need no copy).
#pragma once

#include <torch/types.h>

namespace xlme::model {

// alpha a [..., M, K] x b [..., K, N] -> [..., M, N] (the same leading dimensions, no
// broadcasting), with autograd. The fast path runs for float32 / float64 CPU tensors outside
// autocast when LibTorch's BLAS exports sgemm_/dgemm_ (found at run time), with alpha as the BLAS
// product's own factor (no pass over a, forward or backward); under bf16 CPU autocast on a CPU
// without fast bf16 products it runs on the bf16-rounded operands (see linear.h); anything else is
// torch::matmul(a * alpha, b).
torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b, double alpha = 1.0);

// The emulated bf16 product itself, whatever the CPU (tests; see linear.h).
torch::Tensor bf16_emulated_matmul(const torch::Tensor& a, const torch::Tensor& b);

// Whether batched_matmul takes its own path for these operands (tests and benchmarks).
bool batched_matmul_fast_path(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace xlme::model
