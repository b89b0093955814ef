"""Attention with XLM-E's gated relative position bias, flash-style (issue 33; docs/ops.md).

Scores s_ij = scale * q_i . k_j + f_i * t[h, i - j + Tk - 1] over the keys j < length[b], where t
is the head's bias per distance (d[h, bucket(i - j)] expanded over the Tq + Tk - 1 distances, a
few KB) and f the gate factor per (b, h, query) (1 without the gate). No [B, H, Tq, Tk] tensor is
ever written: the forward keeps Q, K and V tiles on chip with an online softmax (fp32
accumulation) and saves the log-sum-exp per query; the backward recomputes the probabilities tile
by tile.

Far tiles: with `far` > 0 the caller promises t[h, delta] = t[h, far] for every delta >= far and
t[h, delta] = t[h, -far] for every delta <= -far (delta = i - j; every distance beyond the
buckets' last boundary shares its direction's last bucket). A tile whose keys all lie at least
`far` before (or after) all of its queries then reads one table entry instead of gathering one
per element, and the backward adds its table gradient to that one entry as a sum, instead of one
atomic add per element. far = 0: every tile gathers.

Dropout on the probabilities: element (i, j) of head (b, h) is kept when the first Philox4x32-10
word of (key = seed; counter = (i * Tk + j, b * H + h, offset_lo, offset_hi)) is at least
threshold = round(p * 2^32), in the forward and again in the backward.

Backward: dK and dV per key block (looping over the queries), dQ per query block (looping over
the keys), both from one tile function (_backward_tile), with the bias' gradients reduced on the
fly in the dQ kernel: df_i = sum_j dS_ij t[h, i - j + Tk - 1] per query, and
dt[h, i - j + Tk - 1] += dS_ij f_i by atomic adds into an fp32 [H, Tq + Tk - 1] (far tiles: the
tile's sum of dS_ij f_i, added once per program and direction).

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
def _far_side(r0, c0, far, BM: tl.constexpr, BN: tl.constexpr):
    """For the tile of queries r0 .. r0 + BM - 1 and keys c0 .. c0 + BN - 1: 1 when every
    i - j >= far, -1 when every i - j <= -far, else 0 (and always 0 when far = 0)."""
    after = (far > 0) & (r0 - (c0 + BN - 1) >= far)
    before = (far > 0) & (c0 - (r0 + BM - 1) >= far)
    return tl.where(after, 1, tl.where(before, -1, 0))


@triton.jit
def _scores(q, kt, rows, cols, row_ok, col_ok, side, far, table_row, fi, scale,
            BIAS: tl.constexpr, GATED: tl.constexpr, PRECISION: tl.constexpr):
    """The tile's masked scores and its table values; table_row points at t[h, Tk - 1]
    (distance 0)."""
    s = tl.dot(q, kt, input_precision=PRECISION) * scale
    bias = tl.zeros(s.shape, tl.float32)
    if BIAS:
        if side == 0:
            bias = tl.load(table_row + rows[:, None] - cols[None, :],
                           mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        else:  # a far tile: one entry for the whole tile
            bias = tl.zeros(s.shape, tl.float32) + tl.load(table_row + side * far)
        if GATED:
            s += fi[:, None] * bias
        else:
            s += bias
    return tl.where(col_ok[None, :], s, float("-inf")), bias


@triton.jit
def _backward_tile(q, kt, vt, do, lse, dlt, fi, rows, cols, row_ok, col_ok, side, far, table_row,
                   scale, tk, bh, seed, offset_lo, offset_hi, threshold, drop_scale,
                   BIAS: tl.constexpr, GATED: tl.constexpr, DROPOUT: tl.constexpr,
                   PRECISION: tl.constexpr):
    """One tile of the backward: the probabilities as dropout left them (for dV), dS (for dQ,
    dK and the bias' gradients) and the tile's table values."""
    s, bias = _scores(q, kt, rows, cols, row_ok, col_ok, side, far, table_row, fi, scale, BIAS,
                      GATED, PRECISION)
    p = tl.exp(s - lse[:, None])
    dp = tl.dot(do, vt, input_precision=PRECISION)
    kept = p
    if DROPOUT:
        keep = _keep(rows[:, None], cols[None, :], tk, bh, seed, offset_lo, offset_hi, threshold)
        kept = tl.where(keep, p * drop_scale, 0.0)
        dp = tl.where(keep, dp * drop_scale, 0.0)
    ds = p * (dp - dlt[:, None])
    return kept, ds, bias


@triton.jit
def attention_forward(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, f_ptr, table_ptr, len_ptr, sqb, sqh,
                      sqt, skb, skh, skt, svb, svh, svt, heads, tq, tk, far, scale, seed,
                      offset_lo, offset_hi, threshold, drop_scale, D: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BIAS: tl.constexpr,
                      GATED: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    r0 = tl.program_id(0) * BM
    rows = r0 + tl.arange(0, BM)
    dims = tl.arange(0, D)
    row_ok = rows < tq
    table_row = table_ptr + h * (tq + tk - 1) + tk - 1
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
        side = _far_side(r0, start, far, BM, BN)
        s, _ = _scores(q, kt, rows, cols, row_ok, col_ok, side, far, table_row, fi, scale, BIAS,
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
                            heads, tq, tk, far, scale, seed, offset_lo, offset_hi, threshold,
                            drop_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                            BIAS: tl.constexpr, GATED: tl.constexpr, DROPOUT: tl.constexpr,
                            PRECISION: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    c0 = tl.program_id(0) * BN
    cols = c0 + tl.arange(0, BN)
    dims = tl.arange(0, D)
    table_row = table_ptr + h * (tq + tk - 1) + tk - 1
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
        side = _far_side(start, c0, far, BM, BN)
        kept, ds, _ = _backward_tile(q, kt, vt, do, lse, dlt, fi, rows, cols, row_ok, col_ok,
                                     side, far, table_row, scale, tk, bh, seed, offset_lo,
                                     offset_hi, threshold, drop_scale, BIAS, GATED, DROPOUT,
                                     PRECISION)
        dv += tl.dot(tl.trans(kept).to(do.dtype), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    at = (bh * tk + cols[:, None]) * D + dims[None, :]
    tl.store(dk_ptr + at, (dk * scale).to(dk_ptr.dtype.element_ty), mask=(cols < tk)[:, None])
    tl.store(dv_ptr + at, dv.to(dv_ptr.dtype.element_ty), mask=(cols < tk)[:, None])


@triton.jit
def attention_backward_dq(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, f_ptr, table_ptr,
                          len_ptr, dq_ptr, df_ptr, dtable_ptr, sqb, sqh, sqt, skb, skh, skt, svb,
                          svh, svt, heads, tq, tk, far, scale, seed, offset_lo, offset_hi,
                          threshold, drop_scale, D: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, BIAS: tl.constexpr, GATED: tl.constexpr,
                          DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    r0 = tl.program_id(0) * BM
    rows = r0 + tl.arange(0, BM)
    dims = tl.arange(0, D)
    row_ok = rows < tq
    table_row = table_ptr + h * (tq + tk - 1) + tk - 1
    dtable_row = dtable_ptr + h * (tq + tk - 1) + tk - 1
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
    far_after = 0.0  # the sum of dS_ij f_i over the far tiles at distances >= far
    far_before = 0.0  # and at distances <= -far
    for start in range(0, tk, BN):
        cols = start + tl.arange(0, BN)
        col_ok = cols < length
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skt + dims[:, None],
                     mask=col_ok[None, :], other=0.0)
        vt = tl.load(v_ptr + b * svb + h * svh + cols[None, :] * svt + dims[:, None],
                     mask=col_ok[None, :], other=0.0)
        side = _far_side(r0, start, far, BM, BN)
        _, ds, bias = _backward_tile(q, kt, vt, do, lse, dlt, fi, rows, cols, row_ok, col_ok,
                                     side, far, table_row, scale, tk, bh, seed, offset_lo,
                                     offset_hi, threshold, drop_scale, BIAS, GATED, DROPOUT,
                                     PRECISION)
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)
        if BIAS:
            if side == 0:
                if GATED:
                    df += tl.sum(ds * bias, axis=1)
                    tl.atomic_add(dtable_row + rows[:, None] - cols[None, :], ds * fi[:, None],
                                  mask=row_ok[:, None] & col_ok[None, :])
                else:
                    tl.atomic_add(dtable_row + rows[:, None] - cols[None, :], ds,
                                  mask=row_ok[:, None] & col_ok[None, :])
            else:  # one table entry: df_i = t_far sum_j dS_ij, dt[far] += sum_i f_i sum_j dS_ij
                row_sums = tl.sum(ds, axis=1)
                if GATED:
                    df += row_sums * tl.load(table_row + side * far)
                    total = tl.sum(row_sums * fi, axis=0)
                else:
                    total = tl.sum(row_sums, axis=0)
                if side > 0:
                    far_after += total
                else:
                    far_before += total
    tl.store(dq_ptr + (bh * tq + rows[:, None]) * D + dims[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=row_ok[:, None])
    if GATED:
        tl.store(df_ptr + bh * tq + rows, df, mask=row_ok)
    if BIAS:
        # Only where a far tile can exist (far < Tq: distance +far; far < Tk: -far), so that the
        # entry is inside the table.
        tl.atomic_add(dtable_row + far, far_after, mask=(far > 0) & (far < tq))
        tl.atomic_add(dtable_row - far, far_before, mask=(far > 0) & (far < tk))


@triton.jit
def attention_keep_mask(out_ptr, heads, tq, tk, seed, offset_lo, offset_hi, threshold,
                        BM: tl.constexpr, BN: tl.constexpr):
    """The keep mask of BM query rows of one head, as the kernels above draw it: for the tests."""
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    for start in range(0, tk, BN):
        cols = start + tl.arange(0, BN)
        keep = _keep(rows[:, None], cols[None, :], tk, bh, seed, offset_lo, offset_hi, threshold)
        tl.store(out_ptr + (bh * tq + rows[:, None]) * tk + cols[None, :], keep.to(tl.float32),
                 mask=(rows < tq)[:, None] & (cols < tk)[None, :])


# --- Launches from Python (the interpreter tests; C++ launches the compiled kernels itself) -----

BLOCK = 64  # queries and keys per tile on the GPU


def _common(q, k, v, lengths, table, f, p, seed, offset, far):
    b, heads, tq, d = q.shape
    tk = k.shape[2]
    assert q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1
    threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
    precision = "ieee" if q.dtype.itemsize == 4 else "tf32"
    dummy = q.new_zeros(1, dtype=__import__("torch").float32)
    args = dict(D=d, BIAS=table is not None, GATED=f is not None, DROPOUT=p > 0,
                PRECISION=precision)
    scalars = (heads, tq, tk, far, 1.0 / d**0.5, seed, offset & 0xFFFFFFFF, offset >> 32,
               threshold, 1.0 / (1.0 - p))
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    tensors = (f if f is not None else dummy, table if table is not None else dummy, lengths)
    return b, heads, tq, tk, d, args, scalars, strides, tensors


def forward(q, k, v, lengths, table=None, f=None, p=0.0, seed=0, offset=0, far=0, bm=BLOCK,
            bn=BLOCK):
    import torch
    b, heads, tq, tk, d, args, scalars, strides, (f_, t_, len_) = _common(
        q, k, v, lengths, table, f, p, seed, offset, far)
    o = q.new_empty(b, heads, tq, d)
    lse = q.new_empty(b, heads, tq, dtype=torch.float32)
    attention_forward[(triton.cdiv(tq, bm), b * heads)](q, k, v, o, lse, f_, t_, len_, *strides,
                                                        *scalars, BM=bm, BN=bn, **args)
    return o, lse


def backward(q, k, v, o, lse, do, lengths, table=None, f=None, p=0.0, seed=0, offset=0, far=0,
             bm=BLOCK, bn=BLOCK):
    import torch
    b, heads, tq, tk, d, args, scalars, strides, (f_, t_, len_) = _common(
        q, k, v, lengths, table, f, p, seed, offset, far)
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


def keep_mask(b, heads, tq, tk, p, seed=0, offset=0, block=64):
    import torch
    out = torch.empty(b, heads, tq, tk)
    threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
    attention_keep_mask[(triton.cdiv(tq, block), b * heads)](
        out, heads, tq, tk, seed, offset & 0xFFFFFFFF, offset >> 32, threshold, BM=block,
        BN=block)
    return out


def aot_variants():
    """The forms src/ops/triton/aot.py compiles ahead of time."""
    # bf16 q, k, v (autocast); head sizes 64 (every paper size) and 32 (the demo model); the
    # gated relative bias, the plain relative bias, no bias (cross-attention); dropout or not.
    scalars = {"sqb": "i64", "sqh": "i64", "sqt": "i64", "skb": "i64", "skh": "i64", "skt": "i64",
               "svb": "i64", "svh": "i64", "svt": "i64", "heads": "i32", "tq": "i32", "tk": "i32",
               "far": "i32", "scale": "fp32", "seed": "u64", "offset_lo": "u32",
               "offset_hi": "u32", "threshold": "u32", "drop_scale": "fp32"}
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
