"""Attention with XLM-E's gated relative position bias, flash-style (issue 33; docs/ops.md).

Scores s_ij = scale * q_i . k_j + f_i * t[h, i - j + Tk - 1] over the keys j < length[b], where t
is the head's bias per distance (d[h, bucket(i - j)] expanded over the 2T - 1 distances, a few KB)
and f the gate factor per (b, h, query) (1 without the gate). No [B, H, Tq, Tk] tensor is ever
written: the forward keeps Q, K and V tiles on chip with an online softmax (fp32 accumulation)
and saves the log-sum-exp per query; the backward recomputes the probabilities tile by tile.

Dropout on the probabilities: element (i, j) of head (b, h) is kept when the first Philox4x32-10
word of (key = seed; counter = (i * Tk + j, b * H + h, offset_lo, offset_hi)) is at least
threshold = round(p * 2^32), in the forward and again in the backward.

Backward: dK and dV per key block (looping over the queries), dQ per query block (looping over
the keys), with the bias' gradients reduced on the fly: df_i = sum_j dS_ij t[h, i - j + Tk - 1]
per query, and dt[h, i - j + Tk - 1] += dS_ij f_i by atomic adds into an fp32 [H, Tq + Tk - 1].

Same source on the GPU (ahead-of-time compiled) and on the CPU through Triton's interpreter
(tests/python/test_attention_kernel.py).
"""

import triton
import triton.language as tl


@triton.jit
def _keep(rows, cols, tk, bh, seed, offset_lo, offset_hi, threshold):
    c0 = (rows * tk + cols).to(tl.uint32)
    zero = c0 * 0
    r, _, _, _ = tl.philox(seed, c0, zero + bh.to(tl.uint32), zero + offset_lo, zero + offset_hi)
    return r >= threshold


@triton.jit
def _scores(q, kt, rows, cols, row_ok, col_ok, h, tq, tk, scale, table_ptr, fi,
            BIAS: tl.constexpr, GATED: tl.constexpr, PRECISION: tl.constexpr):
    s = tl.dot(q, kt, input_precision=PRECISION) * scale
    bias = tl.zeros(s.shape, tl.float32)
    if BIAS:
        delta = rows[:, None] - cols[None, :] + tk - 1
        bias = tl.load(table_ptr + h * (tq + tk - 1) + delta,
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        if GATED:
            s += fi[:, None] * bias
        else:
            s += bias
    return tl.where(col_ok[None, :], s, float("-inf")), bias


@triton.jit
def attention_forward(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, f_ptr, table_ptr, len_ptr, sqb, sqh,
                      sqt, skb, skh, skt, svb, svh, svt, heads, tq, tk, scale, seed, offset_lo,
                      offset_hi, threshold, drop_scale, D: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, BIAS: tl.constexpr, GATED: tl.constexpr,
                      DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dims = tl.arange(0, D)
    row_ok = rows < tq
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    length = tl.minimum(tl.load(len_ptr + b), tk)
    fi = tl.full((BM, ), 1.0, tl.float32)
    if GATED:
        fi = tl.load(f_ptr + bh * tq + rows, mask=row_ok, other=0.0)
    m = tl.full((BM, ), float("-inf"), tl.float32)
    l = tl.zeros((BM, ), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for start in range(0, tk, BN):
        cols = start + tl.arange(0, BN)
        col_ok = cols < length
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skt + dims[:, None],
                     mask=col_ok[None, :], other=0.0)
        s, _ = _scores(q, kt, rows, cols, row_ok, col_ok, h, tq, tk, scale, table_ptr, fi, BIAS,
                       GATED, PRECISION)
        new_m = tl.maximum(m, tl.max(s, axis=1))
        safe = tl.where(new_m == float("-inf"), 0.0, new_m)
        p = tl.exp(s - safe[:, None])
        alpha = tl.exp(m - safe)
        l = l * alpha + tl.sum(p, axis=1)
        if DROPOUT:
            keep = _keep(rows[:, None], cols[None, :], tk, bh, seed, offset_lo, offset_hi,
                         threshold)
            p = tl.where(keep, p * drop_scale, 0.0)
        v = tl.load(v_ptr + b * svb + h * svh + cols[:, None] * svt + dims[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = new_m
    empty = l == 0.0  # no key (length 0): output 0, and lse +inf so that the backward's p is 0
    out = acc / tl.where(empty, 1.0, l)[:, None]
    lse = tl.where(empty, float("inf"), m + tl.log(tl.where(empty, 1.0, l)))
    tl.store(o_ptr + (bh * tq + rows[:, None]) * D + dims[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(lse_ptr + bh * tq + rows, lse, mask=row_ok)


@triton.jit
def attention_backward_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, f_ptr, table_ptr,
                            len_ptr, dk_ptr, dv_ptr, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                            heads, tq, tk, scale, seed, offset_lo, offset_hi, threshold,
                            drop_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                            BIAS: tl.constexpr, GATED: tl.constexpr, DROPOUT: tl.constexpr,
                            PRECISION: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    dims = tl.arange(0, D)
    length = tl.minimum(tl.load(len_ptr + b), tk)
    col_ok = cols < length
    kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skt + dims[:, None],
                 mask=col_ok[None, :], other=0.0)
    vt = tl.load(v_ptr + b * svb + h * svh + cols[None, :] * svt + dims[:, None],
                 mask=col_ok[None, :], other=0.0)
    dk = tl.zeros((BN, D), tl.float32)
    dv = tl.zeros((BN, D), tl.float32)
    for start in range(0, tq, BM):
        rows = start + tl.arange(0, BM)
        row_ok = rows < tq
        q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :],
                    mask=row_ok[:, None], other=0.0)
        do = tl.load(do_ptr + (bh * tq + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None],
                     other=0.0)
        lse = tl.load(lse_ptr + bh * tq + rows, mask=row_ok, other=float("inf"))
        dlt = tl.load(delta_ptr + bh * tq + rows, mask=row_ok, other=0.0)
        fi = tl.full((BM, ), 1.0, tl.float32)
        if GATED:
            fi = tl.load(f_ptr + bh * tq + rows, mask=row_ok, other=0.0)
        s, _ = _scores(q, kt, rows, cols, row_ok, col_ok, h, tq, tk, scale, table_ptr, fi, BIAS,
                       GATED, PRECISION)
        p = tl.exp(s - lse[:, None])
        dp = tl.dot(do, vt, input_precision=PRECISION)
        if DROPOUT:
            keep = _keep(rows[:, None], cols[None, :], tk, bh, seed, offset_lo, offset_hi,
                         threshold)
            dv += tl.dot(tl.trans(tl.where(keep, p * drop_scale, 0.0)).to(do.dtype), do,
                         input_precision=PRECISION)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        else:
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
        ds = p * (dp - dlt[:, None])
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    at = (bh * tk + cols[:, None]) * D + dims[None, :]
    tl.store(dk_ptr + at, (dk * scale).to(dk_ptr.dtype.element_ty), mask=(cols < tk)[:, None])
    tl.store(dv_ptr + at, dv.to(dv_ptr.dtype.element_ty), mask=(cols < tk)[:, None])


@triton.jit
def attention_backward_dq(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, f_ptr, table_ptr,
                          len_ptr, dq_ptr, df_ptr, dtable_ptr, sqb, sqh, sqt, skb, skh, skt, svb,
                          svh, svt, heads, tq, tk, scale, seed, offset_lo, offset_hi, threshold,
                          drop_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BIAS: tl.constexpr, GATED: tl.constexpr, DROPOUT: tl.constexpr,
                          PRECISION: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dims = tl.arange(0, D)
    row_ok = rows < tq
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(do_ptr + (bh * tq + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None],
                 other=0.0)
    lse = tl.load(lse_ptr + bh * tq + rows, mask=row_ok, other=float("inf"))
    dlt = tl.load(delta_ptr + bh * tq + rows, mask=row_ok, other=0.0)
    length = tl.minimum(tl.load(len_ptr + b), tk)
    fi = tl.full((BM, ), 1.0, tl.float32)
    if GATED:
        fi = tl.load(f_ptr + bh * tq + rows, mask=row_ok, other=0.0)
    dq = tl.zeros((BM, D), tl.float32)
    df = tl.zeros((BM, ), tl.float32)
    for start in range(0, tk, BN):
        cols = start + tl.arange(0, BN)
        col_ok = cols < length
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skt + dims[:, None],
                     mask=col_ok[None, :], other=0.0)
        vt = tl.load(v_ptr + b * svb + h * svh + cols[None, :] * svt + dims[:, None],
                     mask=col_ok[None, :], other=0.0)
        s, bias = _scores(q, kt, rows, cols, row_ok, col_ok, h, tq, tk, scale, table_ptr, fi,
                          BIAS, GATED, PRECISION)
        p = tl.exp(s - lse[:, None])
        dp = tl.dot(do, vt, input_precision=PRECISION)
        if DROPOUT:
            keep = _keep(rows[:, None], cols[None, :], tk, bh, seed, offset_lo, offset_hi,
                         threshold)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        ds = p * (dp - dlt[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)
        if BIAS:
            ok = row_ok[:, None] & col_ok[None, :]
            delta = rows[:, None] - cols[None, :] + tk - 1
            if GATED:
                df += tl.sum(ds * bias, axis=1)
                tl.atomic_add(dtable_ptr + h * (tq + tk - 1) + delta, ds * fi[:, None], mask=ok)
            else:
                tl.atomic_add(dtable_ptr + h * (tq + tk - 1) + delta, ds, mask=ok)
    tl.store(dq_ptr + (bh * tq + rows[:, None]) * D + dims[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=row_ok[:, None])
    if GATED:
        tl.store(df_ptr + bh * tq + rows, df, mask=row_ok)


@triton.jit
def attention_keep_mask(out_ptr, heads, tq, tk, seed, offset_lo, offset_hi, threshold,
                        BN: tl.constexpr):
    """The keep mask of one query row of one head, as the kernels above draw it: for the tests."""
    bh = tl.program_id(1)
    row = tl.program_id(0)
    for start in range(0, tk, BN):
        cols = start + tl.arange(0, BN)
        keep = _keep(row + cols * 0, cols, tk, bh, seed, offset_lo, offset_hi, threshold)
        tl.store(out_ptr + (bh * tq + row) * tk + cols, keep.to(tl.float32), mask=cols < tk)


# --- Launches from Python (the interpreter tests; C++ launches the compiled kernels itself) -----

BLOCK = 64  # queries and keys per tile on the GPU


def _common(q, k, v, lengths, table, f, p, seed, offset):
    b, heads, tq, d = q.shape
    tk = k.shape[2]
    assert q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1
    threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
    precision = "ieee" if q.dtype.itemsize == 4 else "tf32"
    dummy = q.new_zeros(1, dtype=__import__("torch").float32)
    args = dict(D=d, BIAS=table is not None, GATED=f is not None, DROPOUT=p > 0,
                PRECISION=precision)
    scalars = (heads, tq, tk, 1.0 / d**0.5, seed, offset & 0xFFFFFFFF, offset >> 32, threshold,
               1.0 / (1.0 - p))
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    tensors = (f if f is not None else dummy, table if table is not None else dummy, lengths)
    return b, heads, tq, tk, d, args, scalars, strides, tensors


def forward(q, k, v, lengths, table=None, f=None, p=0.0, seed=0, offset=0, bm=BLOCK, bn=BLOCK):
    import torch
    b, heads, tq, tk, d, args, scalars, strides, (f_, t_, len_) = _common(
        q, k, v, lengths, table, f, p, seed, offset)
    o = q.new_empty(b, heads, tq, d)
    lse = q.new_empty(b, heads, tq, dtype=torch.float32)
    attention_forward[(triton.cdiv(tq, bm), b * heads)](q, k, v, o, lse, f_, t_, len_, *strides,
                                                        *scalars, BM=bm, BN=bn, **args)
    return o, lse


def backward(q, k, v, o, lse, do, lengths, table=None, f=None, p=0.0, seed=0, offset=0, bm=BLOCK,
             bn=BLOCK):
    import torch
    b, heads, tq, tk, d, args, scalars, strides, (f_, t_, len_) = _common(
        q, k, v, lengths, table, f, p, seed, offset)
    do = do.contiguous()
    delta = (do.float() * o.float()).sum(-1).contiguous()  # [B, H, Tq]
    dq = q.new_empty(b, heads, tq, d)
    dk, dv = k.new_empty(b, heads, tk, d), v.new_empty(b, heads, tk, d)
    df = q.new_zeros(b, heads, tq, dtype=torch.float32)
    dtable = q.new_zeros(heads, tq + tk - 1, dtype=torch.float32)
    attention_backward_dkdv[(triton.cdiv(tk, bn), b * heads)](
        q, k, v, do, lse, delta, f_, t_, len_, dk, dv, *strides, *scalars, BM=bm, BN=bn, **args)
    attention_backward_dq[(triton.cdiv(tq, bm), b * heads)](
        q, k, v, do, lse, delta, f_, t_, len_, dq, df, dtable, *strides, *scalars, BM=bm, BN=bn,
        **args)
    return dq, dk, dv, (df if f is not None else None), (dtable if table is not None else None)


def keep_mask(b, heads, tq, tk, p, seed=0, offset=0, bn=16):
    import torch
    out = torch.empty(b, heads, tq, tk)
    threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
    attention_keep_mask[(tq, b * heads)](out, heads, tq, tk, seed, offset & 0xFFFFFFFF,
                                         offset >> 32, threshold, BN=bn)
    return out


def aot_variants():
    """The forms src/ops/triton/aot.py compiles ahead of time."""
    # bf16 q, k, v (autocast); head sizes 64 (every paper size) and 32 (the demo model); the
    # gated relative bias, the plain relative bias, no bias (cross-attention); dropout or not.
    scalars = {"sqb": "i64", "sqh": "i64", "sqt": "i64", "skb": "i64", "skh": "i64", "skt": "i64",
               "svb": "i64", "svh": "i64", "svt": "i64", "heads": "i32", "tq": "i32", "tk": "i32",
               "scale": "fp32", "seed": "u64", "offset_lo": "u32", "offset_hi": "u32",
               "threshold": "u32", "drop_scale": "fp32"}
    inputs = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16"}
    forward = {**inputs, "o_ptr": "*bf16", "lse_ptr": "*fp32", "f_ptr": "*fp32",
               "table_ptr": "*fp32", "len_ptr": "*i32", **scalars}
    saved = {**inputs, "do_ptr": "*bf16", "lse_ptr": "*fp32", "delta_ptr": "*fp32",
             "f_ptr": "*fp32", "table_ptr": "*fp32", "len_ptr": "*i32"}
    dkdv = {**saved, "dk_ptr": "*bf16", "dv_ptr": "*bf16", **scalars}
    dq = {**saved, "dq_ptr": "*bf16", "df_ptr": "*fp32", "dtable_ptr": "*fp32", **scalars}
    for d in (64, 32):
        for mode, bias, gated in (("gated", True, True), ("bias", True, False),
                                  ("nobias", False, False)):
            for dropout in (True, False):
                tag = f"bf16_d{d}_{mode}{'_dropout' if dropout else ''}"
                constants = {"D": d, "BM": BLOCK, "BN": BLOCK, "BIAS": bias,
                             "GATED": gated, "DROPOUT": dropout, "PRECISION": "tf32"}
                for kind, fn, signature in (("forward", attention_forward, forward),
                                            ("backward_dkdv", attention_backward_dkdv,
                                             dkdv),
                                            ("backward_dq", attention_backward_dq, dq)):
                    yield f"attention_{kind}_{tag}", fn, signature, constants, 4
