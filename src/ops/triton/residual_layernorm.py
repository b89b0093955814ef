"""Residual + dropout + LayerNorm, fused (xlme::ops::residual_dropout_layernorm, docs/ops.md).

The post-norm encoder's sub-layer output: out = LayerNorm(x + dropout(y)) with weight w and bias
b, per row of H features. x is the residual stream (fp32 under autocast, as LibTorch's autocast
keeps LayerNorm's output), y the sub-layer's output (bf16 under autocast), out in x's dtype; the
statistics in fp32. The forward reads x and y once and writes out and the row's mean and 1/std;
the backward recomputes x + dropout(y) and gives dx, dy and per-program partial sums of dw and db.

Dropout's keep mask is not stored: element (row, col) is kept when word col % 4 of
Philox4x32-10(key = seed, counter = (col / 4, row, offset_lo, offset_hi)) is at least
threshold = round(p * 2^32) (one Philox call for four neighbouring features), and the backward
draws the same words again. seed and offset come
from LibTorch's CUDA generator (a resumed run draws the same masks).

Same source on the GPU (src/ops/triton/aot.py) and on the CPU through Triton's interpreter
(tests/python/test_kernels.py).
"""

import triton
import triton.language as tl

from philox_state import launch_args, philox_key


@triton.jit
def _keep(rows, seed, offset_lo, offset_hi, threshold, BLOCK: tl.constexpr):
    """[len(rows), BLOCK]: which features 0 .. BLOCK - 1 of each row the dropout keeps."""
    tl.static_assert(BLOCK % 4 == 0, "one Philox call draws four features: BLOCK >= 4")
    groups = tl.arange(0, BLOCK // 4).to(tl.uint32)[None, :]
    c1 = rows.to(tl.uint32)[:, None]
    zero = groups * 0 + c1 * 0
    r0, r1, r2, r3 = tl.philox(seed, groups + zero, c1 + zero, zero + offset_lo, zero + offset_hi)
    # join() adds a last dimension: [.., g, y, x] is word 2y + x of group g, so that the reshape
    # puts words 0 .. 3 of group g at 4g .. 4g + 3.
    words = tl.join(tl.join(r0, r2), tl.join(r1, r3))
    return tl.reshape(words, (rows.shape[0], BLOCK)) >= threshold


@triton.jit
def _summed(x_ptr, y_ptr, rows, cols, ok, width, seed, offset_lo, offset_hi, threshold, scale,
            BLOCK: tl.constexpr, DROPOUT: tl.constexpr):
    at = rows.to(tl.int64)[:, None] * width + cols
    h = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + at, mask=ok, other=0.0).to(tl.float32)
    if DROPOUT:
        y = tl.where(_keep(rows, seed, offset_lo, offset_hi, threshold, BLOCK), y * scale, 0.0)
    return h + y


@triton.jit
def residual_layernorm_forward(x_ptr, y_ptr, w_ptr, b_ptr, out_ptr, mean_ptr, rstd_ptr, n_rows,
                               width, eps, seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                               captured, threshold, scale, ROWS: tl.constexpr,
                               BLOCK: tl.constexpr, DROPOUT: tl.constexpr):
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)[None, :]
    row_ok = rows < n_rows
    ok = row_ok[:, None] & (cols < width)
    h = _summed(x_ptr, y_ptr, rows, cols, ok, width, seed, offset_lo, offset_hi, threshold, scale,
                BLOCK, DROPOUT)
    mean = tl.sum(h, axis=1) / width
    centred = tl.where(ok, h - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / width + eps)
    w = tl.load(w_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
    out = centred * rstd[:, None] * w + b
    at = rows.to(tl.int64)[:, None] * width + cols
    tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def residual_layernorm_backward(x_ptr, y_ptr, w_ptr, mean_ptr, rstd_ptr, dout_ptr, dx_ptr, dy_ptr,
                                dw_part_ptr, db_part_ptr, n_rows, width, rows_per_program, seed,
                                offset_lo, offset_hi, seed_ptr, offset_ptr, captured, threshold,
                                scale, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                                DROPOUT: tl.constexpr):
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)[None, :]
    col_ok = cols < width
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((ROWS, BLOCK), tl.float32)
    db = tl.zeros((ROWS, BLOCK), tl.float32)
    first = program * rows_per_program
    for start in range(first, first + rows_per_program, ROWS):
        rows = start + tl.arange(0, ROWS)
        row_ok = (rows < n_rows) & (rows < first + rows_per_program)
        ok = row_ok[:, None] & col_ok
        h = _summed(x_ptr, y_ptr, rows, cols, ok, width, seed, offset_lo, offset_hi, threshold,
                    scale, BLOCK, DROPOUT)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        at = rows.to(tl.int64)[:, None] * width + cols
        dout = tl.load(dout_ptr + at, mask=ok, other=0.0).to(tl.float32)
        xhat = tl.where(ok, (h - mean[:, None]) * rstd[:, None], 0.0)
        g = dout * w
        c1 = tl.sum(g * xhat, axis=1) / width
        c2 = tl.sum(g, axis=1) / width
        dh = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(dx_ptr + at, dh.to(dx_ptr.dtype.element_ty), mask=ok)
        dy = dh
        if DROPOUT:
            dy = tl.where(_keep(rows, seed, offset_lo, offset_hi, threshold, BLOCK), dh * scale,
                          0.0)
        tl.store(dy_ptr + at, dy.to(dy_ptr.dtype.element_ty), mask=ok)
        dw += dout * xhat
        db += dout
    part = program.to(tl.int64) * width + tl.arange(0, BLOCK)
    part_ok = tl.arange(0, BLOCK) < width
    tl.store(dw_part_ptr + part, tl.sum(dw, axis=0), mask=part_ok)
    tl.store(db_part_ptr + part, tl.sum(db, axis=0), mask=part_ok)


@triton.jit
def dropout_keep_mask(out_ptr, n_rows, width, seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                      captured, threshold, BLOCK: tl.constexpr):
    """The keep mask the two kernels above draw (1 kept, 0 dropped): for the tests."""
    seed, offset_lo, offset_hi = philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr,
                                            captured)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)[None, :]
    rows = tl.zeros((1, ), tl.int32) + row
    keep = _keep(rows, seed, offset_lo, offset_hi, threshold, BLOCK)
    tl.store(out_ptr + row * width + cols, keep.to(tl.float32), mask=cols < width)


# --- Launches from Python (the interpreter tests; C++ launches the compiled kernels itself) -----

ROWS = 4  # rows per forward program and per backward step
BACKWARD_PROGRAMS = 256  # dw/db partial sums: at most this many rows of [H] to add up after


def _block(width):
    """The features one program covers: the row's width rounded up to a power of two, at least
    four (one Philox call draws four features' words)."""
    return max(4, triton.next_power_of_2(width))


def threshold_of(p):
    return min(int(round(p * 2.0**32)), 2**32 - 1)


def forward(x, y, w, b, eps, p=0.0, seed=0, offset=0, rows=ROWS, captured=None):
    import torch
    n, width = x.shape
    block = _block(width)
    out = torch.empty_like(x)
    mean = x.new_empty(n, dtype=torch.float32)
    rstd = x.new_empty(n, dtype=torch.float32)
    residual_layernorm_forward[(triton.cdiv(n, rows), )](
        x, y, w, b, out, mean, rstd, n, width, eps,
        *launch_args(seed, offset, x.device, captured), threshold_of(p), 1.0 / (1.0 - p),
        ROWS=rows, BLOCK=block, DROPOUT=p > 0)
    return out, mean, rstd


def backward(x, y, w, mean, rstd, dout, p=0.0, seed=0, offset=0, rows=ROWS,
             programs=BACKWARD_PROGRAMS, captured=None):
    import torch
    n, width = x.shape
    block = _block(width)
    per_program = triton.cdiv(triton.cdiv(n, programs), rows) * rows
    grid = triton.cdiv(n, per_program)
    dx, dy = torch.empty_like(x), torch.empty_like(y)
    dw = x.new_empty(grid, width, dtype=torch.float32)
    db = x.new_empty(grid, width, dtype=torch.float32)
    residual_layernorm_backward[(grid, )](
        x, y, w, mean, rstd, dout, dx, dy, dw, db, n, width, per_program,
        *launch_args(seed, offset, x.device, captured), threshold_of(p), 1.0 / (1.0 - p), ROWS=rows,
        BLOCK=block, DROPOUT=p > 0)
    return dx, dy, dw.sum(0), db.sum(0)


def keep_mask(n, width, p, seed=0, offset=0, captured=None):
    import torch
    out = torch.empty(n, width)
    dropout_keep_mask[(n, )](out, n, width, *launch_args(seed, offset, out.device, captured),
                             threshold_of(p), BLOCK=_block(width))
    return out


def aot_variants():
    """The forms src/ops/triton/aot.py compiles ahead of time. The "_aligned" ones promise
    16-byte aligned rows (pointers ":16", the width a multiple of 16), so that their loads and
    stores move 16 bytes at a time; src/ops/residual_layernorm.cpp picks them where the launch
    satisfies that, the others elsewhere."""
    # (x = out, y): autocast's fp32 residual stream with bf16 sub-layer outputs, and fp32.
    for x, y in (("fp32", "bf16"), ("fp32", "fp32")):
        for aligned in (True, False):
            a = ":16" if aligned else ""
            scalars = {"seed": "u64", "offset_lo": "u32", "offset_hi": "u32", "seed_ptr": "*i64",
                       "offset_ptr": "*i64", "captured": "i32", "threshold": "u32",
                       "scale": "fp32"}
            forward = {"x_ptr": f"*{x}{a}", "y_ptr": f"*{y}{a}", "w_ptr": f"*fp32{a}",
                       "b_ptr": f"*fp32{a}", "out_ptr": f"*{x}{a}", "mean_ptr": "*fp32",
                       "rstd_ptr": "*fp32", "n_rows": "i32", "width": f"i32{a}", "eps": "fp32",
                       **scalars}
            backward = {"x_ptr": f"*{x}{a}", "y_ptr": f"*{y}{a}", "w_ptr": f"*fp32{a}",
                        "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "dout_ptr": f"*{x}{a}",
                        "dx_ptr": f"*{x}{a}", "dy_ptr": f"*{y}{a}", "dw_part_ptr": f"*fp32{a}",
                        "db_part_ptr": f"*fp32{a}", "n_rows": "i32", "width": f"i32{a}",
                        "rows_per_program": "i32", **scalars}
            # Widths up to 1,024 (every paper size but XL's) and up to 4,096.
            for block, rows, warps in ((1024, 2, 4), (4096, 1, 8)):
                for dropout in (True, False):
                    tag = (f"{x}_{y}_{block}{'_dropout' if dropout else ''}"
                           f"{'_aligned' if aligned else ''}")
                    constants = {"ROWS": rows, "BLOCK": block, "DROPOUT": dropout}
                    yield (f"residual_layernorm_forward_{tag}",
                           residual_layernorm_forward, forward, constants, warps)
                    yield (f"residual_layernorm_backward_{tag}",
                           residual_layernorm_backward, backward, constants, warps)
