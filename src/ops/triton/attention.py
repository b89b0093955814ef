"""Attention with XLM-E's gated relative position bias, flash-style (docs/ops.md).

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

Dropout on the probabilities: element (i, j) of head (b, h) is kept when word j % 4 of
Philox4x32-10(key = seed; counter = (i * ceil(Tk / 4) + j / 4, b * H + h, offset_lo, offset_hi))
is at least threshold = round(p * 2^32), in the forward and again in the backward: one Philox call
gives four neighbouring keys their words.

Backward: dK and dV per key block (looping over the queries), dQ per query block (looping over
the keys), both from one tile function (_backward_tile), with the bias' gradients reduced on the
fly in the dQ kernel: df_i = sum_j dS_ij t[h, i - j + Tk - 1] per query, and the table's gradient
dt[h, delta] = sum over (b, i, j) with i - j = delta of dS_ij f_i without atomics, so that it has
the same bits in every run whatever order the programs run in: each dQ program sums its tiles
along their diagonals and writes its own row of partial sums by distance (plain stores, each
entry once), and the caller adds the rows of all sequences and query blocks in a fixed order
(table_gradient). Far tiles add their whole sum into two per-program slots instead, one per
direction, which the caller adds to the entries at +-far.

Same source on the GPU (ahead-of-time compiled) and on the CPU through Triton's interpreter
(tests/python/test_attention_kernel.py).
"""

import triton
import triton.language as tl

from philox_state import launch_args, philox_key


@triton.jit
def _keep(rows, start, tk, bh, seed, offset_lo, offset_hi, threshold, BN: tl.constexpr):
    """[len(rows), BN]: which of the keys start .. start + BN - 1 (start a multiple of 4) each
    query row keeps."""
    tl.static_assert(BN % 4 == 0, "one Philox call draws four keys: BN a multiple of 4")
    groups = start // 4 + tl.arange(0, BN // 4)
    c0 = (rows[:, None] * ((tk + 3) // 4) + groups[None, :]).to(tl.uint32)
    zero = c0 * 0
    r0, r1, r2, r3 = tl.philox(seed, c0, zero + bh.to(tl.uint32), zero + offset_lo,
                               zero + offset_hi)
    # join() adds a last dimension: [.., g, y, x] is word 2y + x of group g, so that the reshape
    # puts words 0 .. 3 of group g at 4g .. 4g + 3.
    words = tl.join(tl.join(r0, r2), tl.join(r1, r3))
    return tl.reshape(words, (rows.shape[0], BN)) >= threshold


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
def _backward_tile(q, kt, vt, do, lse, dlt, fi, rows, c0, cols, row_ok, col_ok, side, far,
                   table_row, scale, tk, bh, seed, offset_lo, offset_hi, threshold, drop_scale,
                   BN: tl.constexpr, BIAS: tl.constexpr, GATED: tl.constexpr,
                   DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of the backward (keys c0 .. c0 + BN - 1): the probabilities as dropout left them
    (for dV), dS (for dQ, dK and the bias' gradients) and the tile's table values."""
    s, bias = _scores(q, kt, rows, cols, row_ok, col_ok, side, far, table_row, fi, scale, BIAS,
                      GATED, PRECISION)
    p = tl.exp(s - lse[:, None])
    dp = tl.dot(do, vt, input_precision=PRECISION)
    kept = p
    if DROPOUT:
        keep = _keep(rows, c0, tk, bh, seed, offset_lo, offset_hi, threshold, BN)
        kept = tl.where(keep, p * drop_scale, 0.0)
        dp = tl.where(keep, dp * drop_scale, 0.0)
    ds = p * (dp - dlt[:, None])
    return kept, ds, bias


@triton.jit
def _diagonal_sums(x, BM: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr):
    """The sums of a BN x BN tile along its diagonals, in two halves: for local rows ii and
    columns jj with u = ii - jj + BN, `lo` holds the sums for u = 0 .. BN - 1 and `hi` for
    u = BN .. 2 BN - 1 (u = 0 never occurs). With square tiles the `lo` of the tile at keys
    start .. start + BN - 1 covers the same distances as the `hi` of the tile before it.

    By four small products with 0/1 matrices, not by gathering (which spills registers): with
    BN = S * S, ii = S a + b and jj = S c + e, so i - j = S (a - c) + (b - e). The tile regrouped
    with rows (a, c) and columns (b, e) times E[(b, e), r] = [b - e = r] sums over b - e; [a - c]
    is summed by the second product. Distance S A + r (0 <= r < S) gathers b - e = r with
    a - c = A, and b - e = r - S with a - c = A + 1."""
    tl.static_assert(BM == BN, "the diagonal sums pair tiles of equal sides")
    S: tl.constexpr = 8 if BN == 64 else 4
    tl.static_assert(S * S == BN, "the diagonal sums regroup tiles of 16 or 64 columns")
    regrouped = tl.reshape(tl.permute(tl.reshape(x, (S, S, S, S)), (0, 2, 1, 3)), (BN, BN))
    pairs = tl.arange(0, BN)  # (b, e) as rows of E, (a, c) as columns of the second products
    step = (pairs // S - pairs % S)  # b - e, or a - c
    r = tl.arange(0, S)
    # (Through fp32: Triton's interpreter turns a bool into a bf16 bit pattern, not a value.)
    same = (step[:, None] == r[None, :]).to(tl.float32).to(x.dtype)  # [(b, e), r]: b - e = r
    wrapped = (step[:, None] == r[None, :] - S).to(tl.float32).to(x.dtype)  # b - e = r - S
    by_step = tl.dot(regrouped, same, input_precision=PRECISION)  # [(a, c), r]
    by_wrapped = tl.dot(regrouped, wrapped, input_precision=PRECISION)
    rows = tl.arange(0, 2 * S) - S  # A = a - c for the row A + S of the result
    at = (rows[:, None] == step[None, :]).to(tl.float32)  # [A + S, (a, c)]
    after = (rows[:, None] + 1 == step[None, :]).to(tl.float32)
    sums = (tl.dot(at, by_step, input_precision=PRECISION) +
            tl.dot(after, by_wrapped, input_precision=PRECISION))  # [A + S, r]: u = S (A + S) + r
    lo, hi = tl.split(tl.permute(tl.reshape(sums, (2, S, S)), (1, 2, 0)))
    return tl.reshape(lo, (BN, )), tl.reshape(hi, (BN, ))


@triton.jit
def attention_forward(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, f_ptr, table_ptr, len_ptr, sqb, sqh,
                      sqt, skb, skh, skt, svb, svh, svt, heads, tq, tk, far, scale, seed,
                      offset_lo, offset_hi, seed_ptr, offset_ptr, captured, threshold, drop_scale,
                      D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BIAS: tl.constexpr,
                      GATED: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
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
            keep = _keep(rows, start, tk, bh, seed, offset_lo, offset_hi, threshold, BN)
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
                            heads, tq, tk, far, scale, seed, offset_lo, offset_hi, seed_ptr,
                            offset_ptr, captured, threshold, drop_scale, D: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr, BIAS: tl.constexpr,
                            GATED: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
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
        kept, ds, _ = _backward_tile(q, kt, vt, do, lse, dlt, fi, rows, c0, cols, row_ok, col_ok,
                                     side, far, table_row, scale, tk, bh, seed, offset_lo,
                                     offset_hi, threshold, drop_scale, BN, BIAS, GATED, DROPOUT,
                                     PRECISION)
        dv += tl.dot(tl.trans(kept.to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    at = (bh * tk + cols[:, None]) * D + dims[None, :]
    tl.store(dk_ptr + at, (dk * scale).to(dk_ptr.dtype.element_ty), mask=(cols < tk)[:, None])
    tl.store(dv_ptr + at, dv.to(dv_ptr.dtype.element_ty), mask=(cols < tk)[:, None])


@triton.jit
def attention_backward_dq(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, f_ptr, table_ptr,
                          len_ptr, dq_ptr, df_ptr, dtable_ptr, sqb, sqh, sqt, skb, skh, skt, svb,
                          svh, svt, heads, tq, tk, far, scale, seed, offset_lo, offset_hi,
                          seed_ptr, offset_ptr, captured, threshold, drop_scale, D: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BIAS: tl.constexpr,
                          GATED: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """dQ, df, and for the table this program's row of partial sums (see table_gradient):
    dtable_ptr is [B * H, cdiv(Tq, BM), (cdiv(Tq, BM) + cdiv(Tk, BN)) * BN + 2] fp32, zeroed."""
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    r0 = tl.program_id(0) * BM
    rows = r0 + tl.arange(0, BM)
    dims = tl.arange(0, D)
    row_ok = rows < tq
    table_row = table_ptr + h * (tq + tk - 1) + tk - 1
    # This program's row of table sums, at the entry of distance 0; its far sums in the last two.
    q_blocks = tl.cdiv(tq, BM)
    k_blocks = tl.cdiv(tk, BN)
    width = (q_blocks + k_blocks) * BN + 2
    sums_row = dtable_ptr + (bh * q_blocks + tl.program_id(0)).to(tl.int64) * width
    sums_at = sums_row + k_blocks * BN
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
    carried = tl.zeros((BN, ), tl.float32)  # the previous tile's `lo` diagonal sums
    span = tl.arange(0, BN)
    for start in range(0, tk, BN):
        cols = start + tl.arange(0, BN)
        col_ok = cols < length
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skt + dims[:, None],
                     mask=col_ok[None, :], other=0.0)
        vt = tl.load(v_ptr + b * svb + h * svh + cols[None, :] * svt + dims[:, None],
                     mask=col_ok[None, :], other=0.0)
        side = _far_side(r0, start, far, BM, BN)
        _, ds, _ = _backward_tile(q, kt, vt, do, lse, dlt, fi, rows, start, cols, row_ok, col_ok,
                                  side, far, table_row, scale, tk, bh, seed, offset_lo, offset_hi,
                                  threshold, drop_scale, BN, BIAS, GATED, DROPOUT, PRECISION)
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)
        if BIAS:
            # dS is 0 outside the rows and keys (p = 0 there), so whole tiles are summed.
            lo = tl.zeros((BN, ), tl.float32)
            hi = tl.zeros((BN, ), tl.float32)
            if side == 0:
                if GATED:
                    # The tile's table values again (from cache): keeping the ones the scores
                    # read alive through the products would spill registers.
                    near = tl.load(table_row + rows[:, None] - cols[None, :],
                                   mask=row_ok[:, None] & col_ok[None, :], other=0.0)
                    df += tl.sum(ds * near, axis=1)
                    lo, hi = _diagonal_sums((ds * fi[:, None]).to(kt.dtype), BM, BN, PRECISION)
                else:
                    lo, hi = _diagonal_sums(ds.to(kt.dtype), BM, BN, PRECISION)
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
            # Distances r0 - start .. + BN - 1: this tile's `hi` and the previous tile's `lo`.
            tl.store(sums_at + r0 - start + span, hi + carried)
            carried = lo
    tl.store(dq_ptr + (bh * tq + rows[:, None]) * D + dims[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=row_ok[:, None])
    if GATED:
        tl.store(df_ptr + bh * tq + rows, df, mask=row_ok)
    if BIAS:
        # The last tile's `lo`: distances r0 - k_blocks * BN .. + BN - 1.
        tl.store(sums_at + r0 - k_blocks * BN + span, carried)
        tl.store(sums_row + width - 2, far_after)
        tl.store(sums_row + width - 1, far_before)


@triton.jit
def attention_keep_mask(out_ptr, heads, tq, tk, seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                        captured, threshold, BM: tl.constexpr, BN: tl.constexpr):
    """The keep mask of BM query rows of one head, as the kernels above draw it: for the tests."""
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    for start in range(0, tk, BN):
        cols = start + tl.arange(0, BN)
        keep = _keep(rows, start, tk, bh, seed, offset_lo, offset_hi, threshold, BN)
        tl.store(out_ptr + (bh * tq + rows[:, None]) * tk + cols[None, :], keep.to(tl.float32),
                 mask=(rows < tq)[:, None] & (cols < tk)[None, :])


# --- Launches from Python (the interpreter tests; C++ launches the compiled kernels itself) -----

BLOCK = 64  # queries and keys per tile on the GPU
DKDV_QUERY_BLOCK = 32  # queries per step of the dK/dV kernel on the GPU (its tiles: 32 x 64)
WARPS = 8  # per program on the GPU


def _common(q, k, v, lengths, table, f, p, seed, offset, far, captured=None):
    b, heads, tq, d = q.shape
    tk = k.shape[2]
    assert q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1
    threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
    precision = "ieee" if q.dtype.itemsize == 4 else "tf32"
    dummy = q.new_zeros(1, dtype=__import__("torch").float32)
    args = dict(D=d, BIAS=table is not None, GATED=f is not None, DROPOUT=p > 0,
                PRECISION=precision)
    scalars = (heads, tq, tk, far, 1.0 / d**0.5, *launch_args(seed, offset, q.device, captured),
               threshold, 1.0 / (1.0 - p))
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    tensors = (f if f is not None else dummy, table if table is not None else dummy, lengths)
    return b, heads, tq, tk, d, args, scalars, strides, tensors


def forward(q, k, v, lengths, table=None, f=None, p=0.0, seed=0, offset=0, far=0, bm=BLOCK,
            bn=BLOCK, captured=None):
    import torch
    b, heads, tq, tk, d, args, scalars, strides, (f_, t_, len_) = _common(
        q, k, v, lengths, table, f, p, seed, offset, far, captured)
    o = q.new_empty(b, heads, tq, d)
    lse = q.new_empty(b, heads, tq, dtype=torch.float32)
    attention_forward[(triton.cdiv(tq, bm), b * heads)](q, k, v, o, lse, f_, t_, len_, *strides,
                                                        *scalars, BM=bm, BN=bn, **args)
    return o, lse


def backward(q, k, v, o, lse, do, lengths, table=None, f=None, p=0.0, seed=0, offset=0, far=0,
             bm=BLOCK, bn=BLOCK, captured=None):
    """The dK/dV kernel steps through the queries in half as many rows as the tiles have keys, as
    on the GPU (DKDV_QUERY_BLOCK of BLOCK)."""
    import torch
    b, heads, tq, tk, d, args, scalars, strides, (f_, t_, len_) = _common(
        q, k, v, lengths, table, f, p, seed, offset, far, captured)
    do = do.contiguous()
    delta = (do.float() * o.float()).sum(-1).contiguous()  # [B, H, Tq]
    dq = q.new_empty(b, heads, tq, d)
    dk, dv = k.new_empty(b, heads, tk, d), v.new_empty(b, heads, tk, d)
    df = q.new_zeros(b, heads, tq, dtype=torch.float32)
    q_blocks, k_blocks = triton.cdiv(tq, bm), triton.cdiv(tk, bn)
    sums = q.new_zeros(b * heads, q_blocks, (q_blocks + k_blocks) * bn + 2, dtype=torch.float32)
    attention_backward_dkdv[(triton.cdiv(tk, bn), b * heads)](
        q, k, v, do, lse, delta, f_, t_, len_, dk, dv, *strides, *scalars,
        BM=bm * DKDV_QUERY_BLOCK // BLOCK, BN=bn, **args)
    attention_backward_dq[(q_blocks, b * heads)](
        q, k, v, do, lse, delta, f_, t_, len_, dq, df, sums, *strides, *scalars, BM=bm, BN=bn,
        **args)
    dtable = table_gradient(sums, b, heads, tq, tk, far, bn) if table is not None else None
    return dq, dk, dv, (df if f is not None else None), dtable


def table_gradient(sums, b, heads, tq, tk, far, bn):
    """[H, Tq + Tk - 1]: the table's gradient from the dQ programs' rows of sums, added in a fixed
    order (src/ops/attention.cpp does the same on the GPU)."""
    k_blocks = triton.cdiv(tk, bn)
    total = sums.view(b, heads, -1, sums.shape[-1]).sum((0, 2))  # [H, width]
    dtable = total[:, k_blocks * bn - (tk - 1):k_blocks * bn + tq].clone()
    if 0 < far < tq:
        dtable[:, tk - 1 + far] += total[:, -2]
    if 0 < far < tk:
        dtable[:, tk - 1 - far] += total[:, -1]
    return dtable


def keep_mask(b, heads, tq, tk, p, seed=0, offset=0, block=64, captured=None):
    import torch
    out = torch.empty(b, heads, tq, tk)
    threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
    attention_keep_mask[(triton.cdiv(tq, block), b * heads)](
        out, heads, tq, tk, *launch_args(seed, offset, out.device, captured), threshold, BM=block,
        BN=block)
    return out


def aot_variants():
    """The forms src/ops/triton/aot.py compiles ahead of time."""
    # bf16 q, k, v (autocast); head sizes 64 (every paper size) and 32 (the demo model); the
    # gated relative bias, the plain relative bias, no bias (cross-attention); dropout or not.
    # Every [.., T, D] operand is 16-byte aligned with strides that are multiples of 16 elements
    # (":16": rows of D values load 16 bytes at a time); src/ops/attention.cpp copies an input
    # that is not (triton::aligned_copy), which the model's q, k and v never need.
    scalars = {"sqb": "i64:16", "sqh": "i64:16", "sqt": "i64:16", "skb": "i64:16",
               "skh": "i64:16", "skt": "i64:16", "svb": "i64:16", "svh": "i64:16",
               "svt": "i64:16", "heads": "i32", "tq": "i32", "tk": "i32", "far": "i32",
               "scale": "fp32", "seed": "u64", "offset_lo": "u32", "offset_hi": "u32",
               "seed_ptr": "*i64", "offset_ptr": "*i64", "captured": "i32", "threshold": "u32",
               "drop_scale": "fp32"}
    inputs = {"q_ptr": "*bf16:16", "k_ptr": "*bf16:16", "v_ptr": "*bf16:16"}
    forward = {**inputs, "o_ptr": "*bf16:16", "lse_ptr": "*fp32", "f_ptr": "*fp32",
               "table_ptr": "*fp32", "len_ptr": "*i32", **scalars}
    saved = {**inputs, "do_ptr": "*bf16:16", "lse_ptr": "*fp32", "delta_ptr": "*fp32",
             "f_ptr": "*fp32", "table_ptr": "*fp32", "len_ptr": "*i32"}
    dkdv = {**saved, "dk_ptr": "*bf16:16", "dv_ptr": "*bf16:16", **scalars}
    dq = {**saved, "dq_ptr": "*bf16:16", "df_ptr": "*fp32", "dtable_ptr": "*fp32", **scalars}
    for d in (64, 32):
        for mode, bias, gated in (("gated", True, True), ("bias", True, False),
                                  ("nobias", False, False)):
            for dropout in (True, False):
                tag = f"bf16_d{d}_{mode}{'_dropout' if dropout else ''}"
                flags = {"D": d, "BIAS": bias, "GATED": gated, "DROPOUT": dropout,
                         "PRECISION": "tf32"}
                for kind, fn, signature, bm in (
                        ("forward", attention_forward, forward, BLOCK),
                        ("backward_dkdv", attention_backward_dkdv, dkdv, DKDV_QUERY_BLOCK),
                        ("backward_dq", attention_backward_dq, dq, BLOCK)):
                    yield (f"attention_{kind}_{tag}", fn, signature,
                           {**flags, "BM": bm, "BN": BLOCK}, WARPS)
