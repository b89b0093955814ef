"""xlme's attention kernel with the gated relative position bias (src/ops/triton/attention.py) on
the CPU, through Triton's interpreter, against a float64 reference: every variant the model has,
awkward lengths, padding, dropout, the far-tile shortcut, and the kernel inside two layers that
share their weights (ALBERT). Run by CTest (tests/CMakeLists.txt):

    .venv/bin/python -m unittest -v tests/python/test_attention_kernel.py
"""

import collections
import contextlib
import unittest

import kernel_interpreter  # noqa: F401  (TRITON_INTERPRET=1 and the kernels' folder, before triton)
import numpy as np
import torch
from kernel_interpreter import philox4x32_10

import attention
from triton.runtime import interpreter

# One case: batch, heads, query and key lengths, head size, bias, gate, dropout, tile size; the
# far distance (0: no shortcut) and each sequence's key length (None: Tk, then Tk - 5).
Case = collections.namedtuple("Case", "b h tq tk d bias gated p block far lengths",
                              defaults=(0, None))


def distances(tq, tk):
    """[Tq, Tk]: i - j."""
    return torch.arange(tq)[:, None] - torch.arange(tk)[None, :]


def far_index(tq, tk, far):
    """[Tq + Tk - 1]: the table entry each distance reads when the table is constant beyond
    `far` (the entry itself when far = 0)."""
    delta = torch.arange(tq + tk - 1) - (tk - 1)
    if far > 0:
        delta = delta.clamp(-far, far)
    return delta + tk - 1


def far_table(h, tq, tk, far, block):
    """A random per-distance table that is constant beyond `far` as far as any tile that straddles
    the far boundary reads it, and NaN where only far tiles reach (|i - j| >= far + 2 * block - 1):
    a kernel that gathered there would produce NaN."""
    table = torch.randn(h, tq + tk - 1)[:, far_index(tq, tk, far)]
    delta = torch.arange(tq + tk - 1) - (tk - 1)
    table[:, delta.abs() >= far + 2 * block - 1] = float("nan")
    return table


def fold_far(dtable, tq, tk, far):
    """A table gradient with every distance beyond `far` added into the entry at +-far."""
    if far == 0:
        return dtable
    return torch.zeros_like(dtable).index_add_(1, far_index(tq, tk, far), dtable)


def attention_reference(q, k, v, lengths, table, f, keep, p, far=0):
    """Softmax attention with the gated relative bias per distance, key padding and dropout; with
    far > 0 every distance beyond it reads the entry at +-far."""
    tq, tk, d = q.shape[2], k.shape[2], q.shape[3]
    s = q @ k.transpose(-1, -2) / d**0.5
    if table is not None:
        bias = table[:, far_index(tq, tk, far)][:, distances(tq, tk) + tk - 1]  # [H, Tq, Tk]
        s = s + (f[..., None] * bias if f is not None else bias)
    padded = torch.arange(tk)[None, :] >= lengths.long()[:, None]  # [B, Tk]
    probs = torch.softmax(s.masked_fill(padded[:, None, None, :], float("-inf")), -1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    return probs @ v


class GatedBiasAttention(unittest.TestCase):
    # T = 1, lengths that are not multiples of the block, padding in the second sequence,
    # cross-attention (Tq != Tk) without and with the bias, the plain bias, Base's head size at the
    # compiled 64 x 64 tiles, a sequence of one token in a padded batch. Two or three tiles a side
    # are enough for the online softmax across key tiles and the masked last tile.
    CASES = [Case(2, 2, 17, 17, 32, True, True, 0.0, 16),
             Case(2, 1, 33, 33, 64, True, True, 0.1, 16),
             Case(1, 2, 1, 1, 32, True, True, 0.0, 16),
             Case(2, 2, 17, 33, 32, False, False, 0.1, 16),
             Case(2, 1, 100, 100, 64, True, False, 0.0, 64),
             Case(2, 1, 65, 65, 64, True, True, 0.0, 64),
             Case(2, 1, 33, 17, 32, True, True, 0.1, 16),
             Case(1, 2, 20, 45, 32, True, False, 0.0, 16),
             Case(2, 1, 40, 40, 32, True, True, 0.1, 16, lengths=(40, 1)),
             Case(3, 1, 1, 1, 32, True, True, 0.0, 16, lengths=(1, 1, 1))]
    # The far-tile shortcut: tables constant beyond `far` at lengths where whole tiles lie beyond
    # it in both directions (T >= 2 * block + far), gated and plain, with dropout, Tq != Tk both
    # ways, a one-token sequence, and the model's far distance (91 for 32 buckets up to 128) at the
    # compiled tiles with padding and dropout. Four 16-wide tiles with far = 10, and five 64-wide
    # ones with far = 91, are the fewest where one program meets two far tiles on each side (the
    # sums it carries across tiles), the masked last tiles among them.
    FAR_CASES = [Case(2, 1, 50, 50, 32, True, True, 0.1, 16, far=10),
                 Case(1, 2, 50, 50, 32, True, False, 0.0, 16, far=10),
                 Case(2, 1, 50, 70, 32, True, True, 0.0, 16, far=10),
                 Case(2, 1, 50, 40, 32, True, True, 0.1, 16, far=10, lengths=(40, 1)),
                 Case(1, 1, 300, 300, 64, True, True, 0.1, 64, far=91, lengths=(290, ))]

    def run_case(self, case, dtype, tol, forward_only=False):
        b, h, tq, tk, d, bias, gated, p, block, far, lengths = case
        torch.manual_seed(7)
        q, k, v = (torch.randn(b, h, t, d).to(dtype) for t in (tq, tk, tk))
        lengths = torch.tensor(lengths or [tk, max(1, tk - 5)][:b], dtype=torch.int32)
        table = None
        if bias:
            table = far_table(h, tq, tk, far, block) if far else torch.randn(h, tq + tk - 1)
        f = torch.rand(b, h, tq) + 0.5 if gated else None
        kw = dict(p=p, seed=3, offset=8, far=far, bm=block, bn=block)
        o, lse = attention.forward(q, k, v, lengths, table, f, **kw)
        keep = attention.keep_mask(b, h, tq, tk, p, seed=3, offset=8) if p > 0 else None
        leaves = [None if t is None else t.double().requires_grad_() for t in (q, k, v, table, f)]
        ref = attention_reference(*leaves[:3], lengths, leaves[3], leaves[4],
                                  None if keep is None else keep.double(), p, far)
        where = f"{case} {dtype}"
        torch.testing.assert_close(o.double(), ref, rtol=0, atol=tol, msg=where)
        self.assertEqual(o.dtype, dtype)
        if forward_only:
            return
        do = torch.randn(b, h, tq, d).to(dtype)
        ref.backward(do.double())
        grads = attention.backward(q, k, v, o, lse, do, lengths, table, f, **kw)
        grads = grads[:4] + (None if grads[4] is None else fold_far(grads[4], tq, tk, far),)
        for name, got, leaf in zip(("dq", "dk", "dv", "df", "dtable"), grads,
                                   leaves[:3] + [leaves[4], leaves[3]]):
            self.assertEqual(got is None, leaf is None, name)
            if got is None:
                continue
            scale = max(1.0, leaf.grad.abs().max().item())
            torch.testing.assert_close(got.double(), leaf.grad, rtol=0, atol=tol * scale,
                                       msg=f"{name} {where}")

    def test_fp32_every_variant(self):
        for case in self.CASES:
            self.run_case(case, torch.float32, 2e-5)

    def test_bf16_inputs_with_fp32_accumulation(self):
        for case in (self.CASES[0], self.CASES[4], self.FAR_CASES[2]):
            self.run_case(case, torch.bfloat16, 3e-2)

    def test_far_tiles_read_one_entry(self):
        for case in self.FAR_CASES:
            self.run_case(case, torch.float32, 2e-5)

    def test_length_1024(self):
        # The longest case, at the compiled tiles with the model's far distance and padding: most
        # tiles are far tiles, and the table gradient's two far entries sum most of the scores.
        # One sequence and one head: every other variant is covered at shorter lengths above.
        self.run_case(Case(1, 1, 1024, 1024, 64, True, True, 0.0, 64, far=91, lengths=(1000, )),
                      torch.float32, 2e-5)

    def test_without_the_shortcut_far_tiles_gather(self):
        # The same table read without the promise (far = 0) reaches the NaN entries.
        case = self.FAR_CASES[1]
        table = far_table(case.h, case.tq, case.tk, case.far, case.block)
        q, k, v = (torch.randn(case.b, case.h, t, case.d) for t in (case.tq, case.tk, case.tk))
        lengths = torch.full((case.b, ), case.tk, dtype=torch.int32)
        o, _ = attention.forward(q, k, v, lengths, table, bm=case.block, bn=case.block)
        self.assertTrue(o.isnan().any())
        o, _ = attention.forward(q, k, v, lengths, table, far=case.far, bm=case.block,
                                 bn=case.block)
        self.assertFalse(o.isnan().any())

    def test_dropout_mask_rate_and_seed(self):
        keep = attention.keep_mask(2, 3, 40, 50, 0.1, seed=5, offset=16)
        self.assertAlmostEqual(keep.mean().item(), 0.9, delta=0.006)  # 12,000 draws: sd 0.0027
        self.assertTrue(torch.equal(keep, attention.keep_mask(2, 3, 40, 50, 0.1, seed=5,
                                                              offset=16)))
        self.assertFalse(torch.equal(keep, attention.keep_mask(2, 3, 40, 50, 0.1, seed=5,
                                                               offset=20)))
        # Heads and rows draw their own words: no two heads' masks are equal.
        self.assertFalse(torch.equal(keep[0, 0], keep[0, 1]))
        self.assertFalse(torch.equal(keep[0, 0, 0], keep[0, 0, 1]))

    def test_dropout_mask_is_each_keys_own_philox_word(self):
        # Key j of query i in head bh keeps word j % 4 of Philox4x32-10(seed; i * ceil(Tk / 4) +
        # j / 4, bh, offset), computed here without Triton: four keys a call, none sharing a
        # word; Tk not a multiple of four, more than one key tile, seed and offset over 32 bits.
        seed, offset, p, b, h, tq, tk = (9 << 32) | 77, (5 << 32) | 12, 0.3, 2, 2, 5, 37
        keep = attention.keep_mask(b, h, tq, tk, p, seed=seed, offset=offset, block=16)
        bh, rows, cols = np.meshgrid(np.arange(b * h), np.arange(tq), np.arange(tk), indexing="ij")
        words = philox4x32_10(seed, rows * ((tk + 3) // 4) + cols // 4, bh, offset & 0xFFFFFFFF,
                              offset >> 32)
        threshold = min(int(round(p * 2.0**32)), 2**32 - 1)
        want = np.choose(cols % 4, words) >= threshold
        want = torch.from_numpy(want.astype(np.float32)).view(b, h, tq, tk)
        self.assertTrue(torch.equal(keep, want), f"{(keep != want).sum().item()} differ")

    def test_dropout_same_seed_same_output(self):
        torch.manual_seed(1)
        q, k, v = (torch.randn(2, 2, 17, 32) for _ in range(3))
        lengths = torch.tensor([17, 10], dtype=torch.int32)
        table, f = torch.randn(2, 33), torch.rand(2, 2, 17) + 0.5
        run = lambda seed, offset: attention.forward(q, k, v, lengths, table, f, p=0.2,  # noqa
                                                     seed=seed, offset=offset, bm=16, bn=16)[0]
        first = run(4, 8)
        self.assertTrue(torch.equal(first, run(4, 8)))
        self.assertFalse(torch.equal(first, run(4, 12)))
        self.assertFalse(torch.equal(first, run(5, 8)))

    def test_dropout_from_the_generators_device_state(self):
        # Under a CUDA graph capture the kernels read the seed and the base offset from device
        # memory and add their offset within the graph (src/ops/triton/philox_state.py): the same
        # masks, output and gradients as the host values seed and base + that offset (a sum that
        # carries into the offset's high half).
        seed, base, intragraph = (9 << 32) | 77, (2 << 32) | 0xFFFFFFFC, 8
        captured = (torch.tensor([seed]), torch.tensor([base]), intragraph)
        keep = attention.keep_mask(1, 2, 5, 37, 0.3, seed=seed, offset=base + intragraph,
                                   block=16)
        self.assertTrue(torch.equal(keep, attention.keep_mask(1, 2, 5, 37, 0.3, block=16,
                                                              captured=captured)))
        torch.manual_seed(2)
        q, k, v, do = (torch.randn(1, 2, 17, 32) for _ in range(4))
        lengths = torch.tensor([17], dtype=torch.int32)
        table, f = torch.randn(2, 33), torch.rand(1, 2, 17) + 0.5
        common = dict(table=table, f=f, p=0.2, bm=16, bn=16)
        o, lse = attention.forward(q, k, v, lengths, seed=seed, offset=base + intragraph,
                                   **common)
        got_o, got_lse = attention.forward(q, k, v, lengths, captured=captured, **common)
        self.assertTrue(torch.equal(o, got_o))
        want = attention.backward(q, k, v, o, lse, do, lengths, seed=seed,
                                  offset=base + intragraph, **common)
        got = attention.backward(q, k, v, o, lse, do, lengths, captured=captured, **common)
        for name, a, g in zip(("dq", "dk", "dv", "df", "dt"), want, got):
            self.assertTrue(torch.equal(a, g), name)


@contextlib.contextmanager
def programs_in_reverse():
    """Runs every grid of Triton's interpreter from its last program to its first. The interpreter
    otherwise runs programs one after another in a fixed order, so that results which depend on
    the order in which programs add into shared memory (atomics) are the same in every run; on a
    GPU that order changes from run to run."""
    builder = interpreter.InterpreterBuilder
    original = builder.set_grid_idx

    def reversed_idx(self, x, y, z):
        nx, ny, nz = self.grid_dim
        original(self, nx - 1 - x, ny - 1 - y, nz - 1 - z)

    builder.set_grid_idx = reversed_idx
    try:
        yield
    finally:
        builder.set_grid_idx = original


class Deterministic(unittest.TestCase):
    """The backward gives the same bits whatever order its programs run in, so that a resumed run
    with the fused attention equals the uninterrupted one (the table and gate gradients reduce
    across programs; a sum in arrival order would change with the schedule)."""

    def test_program_order_does_not_change_a_bit(self):
        # Gated bias with dropout; two sequences and three 16-wide query tiles, so that programs of
        # different sequences and tiles add into the same table entries; far tiles on both sides.
        for far in (0, 10):
            torch.manual_seed(3)
            b, h, t, d = 2, 2, 50, 32
            q, k, v, do = (torch.randn(b, h, t, d) for _ in range(4))
            lengths = torch.tensor([t, t - 7], dtype=torch.int32)
            table = far_table(h, t, t, far, 16) if far else torch.randn(h, 2 * t - 1)
            f = torch.rand(b, h, t) + 0.5
            kw = dict(p=0.1, seed=2, offset=4, far=far, bm=16, bn=16)
            o, lse = attention.forward(q, k, v, lengths, table, f, **kw)
            first = attention.backward(q, k, v, o, lse, do, lengths, table, f, **kw)
            with programs_in_reverse():
                second = attention.backward(q, k, v, o, lse, do, lengths, table, f, **kw)
            for name, a, z in zip(("dq", "dk", "dv", "df", "dtable"), first, second):
                self.assertTrue(torch.equal(a, z), f"{name} (far {far}) differs in "
                                f"{(a != z).sum().item()} of {a.numel()} elements")


class KernelAttention(torch.autograd.Function):
    """The kernels as one differentiable op, as src/ops/attention.cpp wraps the compiled ones."""

    @staticmethod
    def forward(ctx, q, k, v, table, f, lengths, p, offset, far, block):
        kw = dict(p=p, seed=11, offset=offset, far=far, bm=block, bn=block)
        o, lse = attention.forward(q, k, v, lengths, table, f, **kw)
        ctx.save_for_backward(q, k, v, o, lse, table, f, lengths)
        ctx.kw = kw
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, table, f, lengths = ctx.saved_tensors
        dq, dk, dv, df, dtable = attention.backward(q, k, v, o, lse, do, lengths, table, f,
                                                    **ctx.kw)
        return dq, dk, dv, dtable, df, None, None, None, None, None


class AlbertSharedLayers(unittest.TestCase):
    """Two layers that share every weight (model.share_layers=all) and the bias table
    (relative_position.shared_across_layers), each with its own dropout draws: outputs and every
    gradient, summed over both layers by autograd, against float64."""

    def test_shared_layers_sum_their_gradients(self):
        # Three 16-wide tiles with far = 8: far tiles on both sides, the last key tile masked in
        # the padded sequence.
        b, h, t, d, p, far, block = 2, 2, 40, 32, 0.1, 8, 16
        torch.manual_seed(5)
        params = {"wq": torch.randn(h * d, h * d) / (h * d)**0.5,
                  "wk": torch.randn(h * d, h * d) / (h * d)**0.5,
                  "wv": torch.randn(h * d, h * d) / (h * d)**0.5,
                  "u": torch.randn(h, d) * 0.2, "gv": torch.randn(h, d) * 0.2,
                  "w": torch.rand(h) + 0.5,
                  "table": torch.randn(h, 2 * far + 1)}  # distances -far .. far
        x0 = torch.randn(b, t, h * d)
        lengths = torch.tensor([t, t - 9], dtype=torch.int32)
        weights = torch.randn(b, t, h * d)
        offsets = (0, 8)  # each layer's Philox offset, as the generator hands them out

        def run(dtype, kernel):
            leaves = {n: v.to(dtype).clone().requires_grad_() for n, v in params.items()}
            x = x0.to(dtype).clone().requires_grad_()
            delta = torch.arange(2 * t - 1) - (t - 1)  # the distances of the [H, 2T - 1] table
            table = leaves["table"][:, delta.clamp(-far, far) + far]
            y = x
            for offset in offsets:
                split = lambda z: z.view(b, t, h, d).transpose(1, 2)  # noqa: E731
                q, k, v = split(y @ leaves["wq"]), split(y @ leaves["wk"]), split(y @ leaves["wv"])
                gu = torch.sigmoid(torch.einsum("bhtd,hd->bht", q, leaves["u"]))
                gr = torch.sigmoid(torch.einsum("bhtd,hd->bht", q, leaves["gv"]))
                f = 1 + gu + (1 - gu) * leaves["w"][:, None] * gr
                if kernel:
                    o = KernelAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(),
                                              table.contiguous(), f.contiguous(), lengths, p,
                                              offset, far, block)
                else:
                    keep = attention.keep_mask(b, h, t, t, p, seed=11, offset=offset).to(dtype)
                    o = attention_reference(q, k, v, lengths, table, f, keep, p)
                y = y + o.transpose(1, 2).reshape(b, t, h * d)
            (y * weights.to(dtype)).sum().backward()
            return y, {"x": x.grad, **{n: leaf.grad for n, leaf in leaves.items()}}

        got, got_grads = run(torch.float32, True)
        want, want_grads = run(torch.float64, False)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)
        for name, grad in want_grads.items():
            scale = max(1.0, grad.abs().max().item())
            torch.testing.assert_close(got_grads[name].double(), grad, rtol=0, atol=1e-4 * scale,
                                       msg=name)


if __name__ == "__main__":
    unittest.main()
