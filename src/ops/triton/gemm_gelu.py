"""Matrix products with GELU epilogues for the feed-forward block (docs/ops.md).

The block is out = gelu(x W1^T + b1) W2^T + b2 with erf-GELU (the model's and the export's
`hidden_act: gelu`). Two kernels fold its element-wise passes into the products around them:

- gemm_bias_gelu: h = x W1^T + b1 and a = gelu(h) in one pass: the tile of the product gets the
  bias and the GELU in registers and is written twice, h (kept for the backward) and a (the next
  product's input). Without it the product writes h, then a bias pass and a GELU pass read and
  write [M, F] again.
- gemm_dgelu_bgrad: the backward's dA = dOut W2 with the GELU's derivative and the bias gradient
  in its epilogue: dh = dA * gelu'(h), and each row-block's column sums of dh (partials, summed
  in a fixed order by the caller: no atomics, the same bits every run). Without it the product
  writes dA, a GELU-backward pass reads dA and h and writes dh, and a reduction reads dh again.

Rounding follows the unfused bf16 path exactly where it rounds: h is rounded to the output dtype
before the GELU (autocast's linear returns bf16 h, and the GELU reads it), dA before the
derivative, and the bias gradient sums the rounded dh in fp32. The products accumulate in fp32.
Tiles: BM x BN outputs per program, BK deep steps, programs grouped GROUP_M row-blocks at a time
so that neighbouring programs share B's column-blocks in L2.

Same source on the GPU (compiled ahead of time by aot.py) and on the CPU through Triton's
interpreter (tests/python/test_gemm_gelu_kernel.py).
"""

import torch
import triton
import triton.language as tl

SQRT_HALF = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """The (row-block, column-block) of program `pid`, grouped GROUP_M row-blocks at a time."""
    blocks_m = tl.cdiv(M, BM)
    blocks_n = tl.cdiv(N, BN)
    per_group = GROUP_M * blocks_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _product(a_ptr, b_ptr, M, N, K, pid_m, pid_n, B_NK: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, BK: tl.constexpr):
    """The fp32 [BM, BN] tile (pid_m, pid_n) of A B: A [M, K] row-major; B [K, N] row-major, or
    given as its transpose [N, K] row-major when B_NK (a linear layer's weight)."""
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
    if B_NK:
        b_ptrs = b_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
        b_step = BK
    else:
        b_ptrs = b_ptr + rk[:, None].to(tl.int64) * N + rn[None, :]
        b_step = BK * N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        left = K - k * BK
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += b_step
    return acc, rm, rn


@triton.jit
def gemm_bias_gelu(a_ptr, b_ptr, bias_ptr, h_ptr, y_ptr, M, N, K, B_NK: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """h = A B + bias, y = gelu(h), both [M, N] row-major in h's dtype; bias fp32 [N]."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    acc, rm, rn = _product(a_ptr, b_ptr, M, N, K, pid_m, pid_n, B_NK, BM, BN, BK)
    bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0)
    h = (acc + bias[None, :]).to(h_ptr.dtype.element_ty)
    x = h.to(tl.float32)
    y = 0.5 * x * (1.0 + tl.math.erf(x * SQRT_HALF))
    offsets = rm[:, None].to(tl.int64) * N + rn[None, :]
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(h_ptr + offsets, h, mask=inside)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def gemm_dgelu_bgrad(a_ptr, b_ptr, h_ptr, dh_ptr, part_ptr, M, N, K, B_NK: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """dh = (A B) * gelu'(h), [M, N] row-major in h's dtype; part[pid_m, n] = the fp32 sum of
    dh's rows in row-block pid_m (part: [cdiv(M, BM), N] fp32)."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    acc, rm, rn = _product(a_ptr, b_ptr, M, N, K, pid_m, pid_n, B_NK, BM, BN, BK)
    offsets = rm[:, None].to(tl.int64) * N + rn[None, :]
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(h_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    da = acc.to(dh_ptr.dtype.element_ty).to(tl.float32)
    slope = 0.5 * (1.0 + tl.math.erf(x * SQRT_HALF)) + x * INV_SQRT_2PI * tl.exp(-0.5 * x * x)
    dh = (da * slope).to(dh_ptr.dtype.element_ty)
    tl.store(dh_ptr + offsets, dh, mask=inside)
    sums = tl.sum(tl.where(inside, dh.to(tl.float32), 0.0), axis=0)
    tl.store(part_ptr + pid_m.to(tl.int64) * N + rn, sums, mask=rn < N)


# The compiled tiles: 128 x 128 outputs, 64 deep, 8 warps, 3 stages of A and B tiles in shared
# memory (96 KB in bf16; fits the H100's 227 KB and the A100's 163 KB).
BM, BN, BK, GROUP_M, WARPS, STAGES = 128, 128, 64, 8, 8, 3


def _launch(kernel, a, b, extra, m, n, k, b_nk, bm, bn, bk, group_m):
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    kernel[grid](a.contiguous(), b.contiguous(), *extra, m, n, k, B_NK=b_nk, BM=bm, BN=bn, BK=bk,
                 GROUP_M=group_m)


def bias_gelu(x, w, bias, bm=BM, bn=BN, bk=BK, group_m=GROUP_M):
    """(h, y) = (x w^T + bias, gelu(h)) for x [M, K], w [N, K] (the layer's weight), bias [N]."""
    m, k = x.shape
    n = w.shape[0]
    h = torch.empty(m, n, dtype=x.dtype)
    y = torch.empty_like(h)
    _launch(gemm_bias_gelu, x, w, (bias.float(), h, y), m, n, k, True, bm, bn, bk, group_m)
    return h, y


def dgelu_bgrad(dout, w, h, bm=BM, bn=BN, bk=BK, group_m=GROUP_M):
    """(dh, dbias) for dA = dout w (w [K, N]: the next layer's weight [out, in]) and the saved
    pre-activation h [M, N]."""
    m, k = dout.shape
    n = w.shape[1]
    dh = torch.empty(m, n, dtype=h.dtype)
    part = torch.empty(triton.cdiv(m, bm), n, dtype=torch.float32)
    _launch(gemm_dgelu_bgrad, dout, w, (h, dh, part), m, n, k, False, bm, bn, bk, group_m)
    return dh, part.sum(0)


def aot_variants():
    """The forms src/ops/triton/aot.py compiles ahead of time: bf16 operands (autocast). ":16"
    marks what the launcher guarantees and the compiler may assume: pointers 16-byte aligned,
    N and K multiples of 16 (the loads are then vectorized)."""
    shape = {"M": "i32", "N": "i32:16", "K": "i32:16"}
    options = {"num_stages": STAGES}
    forward = {"a_ptr": "*bf16:16", "b_ptr": "*bf16:16", "bias_ptr": "*fp32:16",
               "h_ptr": "*bf16:16", "y_ptr": "*bf16:16", **shape}
    backward = {"a_ptr": "*bf16:16", "b_ptr": "*bf16:16", "h_ptr": "*bf16:16",
                "dh_ptr": "*bf16:16", "part_ptr": "*fp32:16", **shape}
    for name, fn, signature, b_nk in (("gemm_bias_gelu_bf16", gemm_bias_gelu, forward, True),
                                      ("gemm_dgelu_bgrad_bf16", gemm_dgelu_bgrad, backward,
                                       False)):
        constants = {"B_NK": b_nk, "BM": BM, "BN": BN, "BK": BK, "GROUP_M": GROUP_M}
        yield name, fn, signature, constants, WARPS, options
