"""The generator's loss and its replacement draw, fused (xlme::ops::masked_lm, docs/ops.md).

At the masked rows only, one pass over the logits [N, V] (bf16 or fp32, read once, computed in
fp32) gives per row: the log-sum-exp, the loss lse - x[target], the argmax (MLM accuracy) and,
when sampling, an exact draw from softmax(x / temperature) over the ids that are not excluded
(the special ids): Gumbel-max, argmax(x / temperature + G) with G = -log(-log U).

The uniforms come from Philox4x32-10 (Salmon et al. 2011; Triton's tl.philox) keyed by the
generator's seed, with the counter (group, row, offset_lo, offset_hi): one Philox call gives four
32-bit draws, for the columns 4 * QUARTER * chunk + j * QUARTER + lane (j = 0..3) with
group = QUARTER * chunk + lane. `offset` is the generator's Philox offset, advanced by the caller
for every call, so that a resumed run (generator state restored) draws the same tokens. A draw
u = (r >> 9 + 1/2) / 2^23 lies strictly inside (0, 1).

The backward writes d loss / d x = grad[row] * (softmax(x) - onehot(target)) in one pass, in the
logits' dtype, from the saved log-sum-exp.

The same source runs on a GPU (compiled ahead of time by src/ops/triton/aot.py) and on the CPU
through Triton's interpreter (TRITON_INTERPRET=1; tests/python/test_kernels.py).
"""

import triton
import triton.language as tl

from philox_state import launch_args, philox_key


@triton.jit
def _uniform_open(r):
    # 23 random bits, centred: (k + 1/2) / 2^23 for k in [0, 2^23), never 0 or 1 in fp32.
    return ((r >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def _gumbel_score(x, r, cols, inv_temperature, ex0, ex1, ex2, ex3, ex4, ex5, ex6, ex7):
    u = _uniform_open(r)
    score = x * inv_temperature - tl.log(-tl.log(u))
    excluded = ((cols == ex0) | (cols == ex1) | (cols == ex2) | (cols == ex3) | (cols == ex4)
                | (cols == ex5) | (cols == ex6) | (cols == ex7))
    return tl.where(excluded, float("-inf"), score)


@triton.jit
def _forward_step(base, start, row_ok, lane, run_max, run_sum, best, best_col, draw, draw_col,
                  counter_row, zero, vocab, inv_temperature, seed, offset_lo, offset_hi, ex0, ex1,
                  ex2, ex3, ex4, ex5, ex6, ex7, QUARTER: tl.constexpr, SAMPLE: tl.constexpr,
                  MASKED: tl.constexpr):
    # Columns start .. start + 4 * QUARTER of every row. Unmasked along the columns (all inside
    # the vocabulary), the loads of an aligned row are 16 bytes wide; the last, partial step of a
    # row is MASKED.
    neg_inf = float("-inf")
    if SAMPLE:
        group = (start // 4 + lane + zero).to(tl.uint32)
        r0, r1, r2, r3 = tl.philox(seed, group, counter_row, zero + offset_lo, zero + offset_hi)
    for j in tl.static_range(4):
        cols = start + j * QUARTER + lane
        if MASKED:
            ok = row_ok[:, None] & (cols < vocab)
        else:
            ok = row_ok[:, None]
        x = tl.load(base + cols, mask=ok, other=neg_inf).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        live = new_max != neg_inf  # else both are -inf: nothing summed yet
        run_sum = tl.where(live, run_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max), 0.0)
        run_max = new_max
        better = x > best  # strict: the first maximum along the lane's columns
        best_col = tl.where(better, cols, best_col)
        best = tl.where(better, x, best)
        if SAMPLE:
            if j == 0:
                r = r0
            elif j == 1:
                r = r1
            elif j == 2:
                r = r2
            else:
                r = r3
            score = _gumbel_score(x, r, cols, inv_temperature, ex0, ex1, ex2, ex3, ex4, ex5, ex6,
                                  ex7)
            score = tl.where(ok, score, neg_inf)
            won = score > draw
            draw_col = tl.where(won, cols, draw_col)
            draw = tl.where(won, score, draw)
    return run_max, run_sum, best, best_col, draw, draw_col


@triton.jit
def masked_lm_forward(logits_ptr, row_stride, targets_ptr, n_rows, vocab, inv_temperature, seed,
                      offset_lo, offset_hi, seed_ptr, offset_ptr, captured, ex0, ex1, ex2, ex3,
                      ex4, ex5, ex6, ex7, loss_ptr, lse_ptr, argmax_ptr, sample_ptr,
                      ROWS: tl.constexpr, QUARTER: tl.constexpr, SAMPLE: tl.constexpr):
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    row_ok = rows < n_rows
    base = logits_ptr + rows.to(tl.int64)[:, None] * row_stride  # [ROWS, 1]
    lane = tl.arange(0, QUARTER)[None, :]  # [1, QUARTER]
    neg_inf = float("-inf")
    run_max = tl.full((ROWS, QUARTER), neg_inf, tl.float32)  # per lane: running max ...
    run_sum = tl.zeros((ROWS, QUARTER), tl.float32)  # ... and sum of exp(x - running max)
    best = tl.full((ROWS, QUARTER), neg_inf, tl.float32)  # argmax: value, first column
    best_col = tl.zeros((ROWS, QUARTER), tl.int32)
    draw = tl.full((ROWS, QUARTER), neg_inf, tl.float32)  # Gumbel-max: score, column
    draw_col = tl.zeros((ROWS, QUARTER), tl.int32)
    counter_row = tl.broadcast_to(rows[:, None], (ROWS, QUARTER)).to(tl.uint32)
    zero = tl.zeros((ROWS, QUARTER), tl.uint32)
    whole = vocab - vocab % (4 * QUARTER)  # the columns of the unmasked steps
    for start in range(0, whole, 4 * QUARTER):
        run_max, run_sum, best, best_col, draw, draw_col = _forward_step(
            base, start, row_ok, lane, run_max, run_sum, best, best_col, draw, draw_col,
            counter_row, zero, vocab, inv_temperature, seed, offset_lo, offset_hi, ex0, ex1, ex2,
            ex3, ex4, ex5, ex6, ex7, QUARTER, SAMPLE, False)
    for start in range(whole, vocab, 4 * QUARTER):  # at most one step
        run_max, run_sum, best, best_col, draw, draw_col = _forward_step(
            base, start, row_ok, lane, run_max, run_sum, best, best_col, draw, draw_col,
            counter_row, zero, vocab, inv_temperature, seed, offset_lo, offset_hi, ex0, ex1, ex2,
            ex3, ex4, ex5, ex6, ex7, QUARTER, SAMPLE, True)
    # Lanes to rows.
    row_max = tl.max(run_max, axis=1)  # [ROWS]
    scale = tl.where(run_max == neg_inf, 0.0, tl.exp(run_max - row_max[:, None]))
    log_sum = tl.log(tl.sum(run_sum * scale, axis=1))
    lse = row_max + log_sum
    top = tl.max(best, axis=1)
    top_col = tl.min(tl.where(best == top[:, None], best_col, vocab), axis=1)
    target = tl.load(targets_ptr + rows, mask=row_ok, other=0)
    x_target = tl.load(logits_ptr + rows.to(tl.int64) * row_stride + target, mask=row_ok,
                       other=0.0).to(tl.float32)
    # (max - x_target) + log(sum): no cancellation of two large terms, as lse - x_target would.
    tl.store(loss_ptr + rows, (row_max - x_target) + log_sum, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    tl.store(argmax_ptr + rows, top_col.to(tl.int64), mask=row_ok)
    if SAMPLE:
        top_draw = tl.max(draw, axis=1)
        drawn = tl.min(tl.where(draw == top_draw[:, None], draw_col, vocab), axis=1)
        tl.store(sample_ptr + rows, drawn.to(tl.int64), mask=row_ok)


@triton.jit
def _backward_block(logits_ptr, row_stride, targets_ptr, lse_ptr, grad_loss_ptr, grad_ptr,
                    grad_stride, n_rows, vocab, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                    MASKED: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, BLOCK)[None, :]
    cols = tl.program_id(1) * BLOCK + lanes
    row_ok = rows < n_rows
    if MASKED:
        ok = row_ok[:, None] & (cols < vocab)
    else:
        ok = row_ok[:, None]
    wide = rows.to(tl.int64)[:, None]
    x = tl.load(logits_ptr + wide * row_stride + cols, mask=ok, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    g = tl.load(grad_loss_ptr + rows, mask=row_ok, other=0.0)
    target = tl.load(targets_ptr + rows, mask=row_ok, other=-1)
    p = tl.exp(x - lse[:, None])
    d = g[:, None] * (p - tl.where(cols == target[:, None], 1.0, 0.0))
    tl.store(grad_ptr + wide * grad_stride + cols, d.to(grad_ptr.dtype.element_ty), mask=ok)


@triton.jit
def masked_lm_backward(logits_ptr, row_stride, targets_ptr, lse_ptr, grad_loss_ptr, grad_ptr,
                       grad_stride, n_rows, vocab, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # Every block but a row's last is inside the vocabulary: unmasked along the columns (16-byte
    # loads and stores where the rows are aligned).
    if (tl.program_id(1) + 1) * BLOCK <= vocab:
        _backward_block(logits_ptr, row_stride, targets_ptr, lse_ptr, grad_loss_ptr, grad_ptr,
                        grad_stride, n_rows, vocab, ROWS, BLOCK, False)
    else:
        _backward_block(logits_ptr, row_stride, targets_ptr, lse_ptr, grad_loss_ptr, grad_ptr,
                        grad_stride, n_rows, vocab, ROWS, BLOCK, True)


# --- Launches from Python (the interpreter tests; C++ launches the compiled kernels itself) -----

FORWARD_QUARTER = 256  # columns per lane group: 4 x 256 = 1,024 columns per step of a row
# Rows per program of the compiled forward: 4 x 256 columns a load over 4 warps is 8 per thread,
# 16 bytes of bf16 (one row per warp). The draws do not depend on it (counters are per row).
FORWARD_ROWS = 4
BACKWARD_BLOCK = 1024


def forward(logits, targets, sample=False, inv_temperature=1.0, seed=0, offset=0, excluded=(),
            rows=1, quarter=FORWARD_QUARTER, captured=None):
    """Runs masked_lm_forward: (loss, lse, argmax, sample or None), fp32 / int64 of [N]; the
    generator's state as values, or as tensors (captured: philox_state.launch_args)."""
    import torch
    n, vocab = logits.shape
    assert logits.stride(1) == 1 and len(excluded) <= 8
    ex = list(excluded) + [-1] * (8 - len(excluded))
    out = logits.new_empty
    loss, lse = out(n, dtype=torch.float32), out(n, dtype=torch.float32)
    argmax, drawn = out(n, dtype=torch.int64), out(n, dtype=torch.int64)
    masked_lm_forward[(triton.cdiv(n, rows), )](logits, logits.stride(0), targets, n, vocab,
                                               inv_temperature,
                                               *launch_args(seed, offset, logits.device, captured),
                                               *ex, loss, lse, argmax, drawn, ROWS=rows,
                                               QUARTER=quarter, SAMPLE=sample)
    return loss, lse, argmax, (drawn if sample else None)


def backward(logits, targets, lse, grad_loss, rows=1, block=BACKWARD_BLOCK, padded_grad=False):
    """Runs masked_lm_backward: d loss / d logits in the logits' dtype (padded_grad: laid out
    with the logits' row stride, as src/ops/masked_lm.cpp allocates it)."""
    n, vocab = logits.shape
    if padded_grad:
        grad = logits.new_empty(n, max(logits.stride(0), vocab))[:, :vocab]
    else:
        grad = logits.new_empty(logits.shape)
    masked_lm_backward[(triton.cdiv(n, rows), triton.cdiv(vocab, block))](
        logits, logits.stride(0), targets, lse, grad_loss, grad, grad.stride(0), n, vocab,
        ROWS=rows, BLOCK=block)
    return grad


def aot_variants():
    """The forms src/ops/triton/aot.py compiles ahead of time. The "_aligned" ones promise
    16-byte aligned pointers and row strides that are multiples of 16 elements (":16"), so that
    their unmasked steps load 16 bytes at a time; src/ops/masked_lm.cpp picks them where the
    launch satisfies that, the others elsewhere."""
    for dtype in ("bf16", "fp32"):
        for aligned in (True, False):
            a = ":16" if aligned else ""
            suffix = "_aligned" if aligned else ""
            forward = {
                "logits_ptr": f"*{dtype}{a}", "row_stride": f"i64{a}", "targets_ptr": "*i64",
                "n_rows": "i32", "vocab": "i32", "inv_temperature": "fp32", "seed": "u64",
                "offset_lo": "u32", "offset_hi": "u32", "seed_ptr": "*i64", "offset_ptr": "*i64",
                "captured": "i32", **{f"ex{i}": "i32" for i in range(8)},
                "loss_ptr": "*fp32", "lse_ptr": "*fp32", "argmax_ptr": "*i64",
                "sample_ptr": "*i64"}
            for sample in (True, False):
                yield (f"masked_lm_forward_{dtype}{'_sample' if sample else ''}{suffix}",
                       masked_lm_forward, forward,
                       {"ROWS": FORWARD_ROWS, "QUARTER": FORWARD_QUARTER, "SAMPLE": sample}, 4)
            backward = {
                "logits_ptr": f"*{dtype}{a}", "row_stride": f"i64{a}", "targets_ptr": "*i64",
                "lse_ptr": "*fp32", "grad_loss_ptr": "*fp32", "grad_ptr": f"*{dtype}{a}",
                "grad_stride": f"i64{a}", "n_rows": "i32", "vocab": "i32"}
            yield (f"masked_lm_backward_{dtype}{suffix}", masked_lm_backward, backward,
                   {"ROWS": 1, "BLOCK": BACKWARD_BLOCK}, 4)
