"""xlme's attention kernel with the gated relative position bias (src/ops/triton/attention.py) on
the CPU, through Triton's interpreter, against a float64 reference: every variant the model has,
awkward lengths, padding, dropout. Run by CTest (tests/CMakeLists.txt):

    .venv/bin/python -m unittest -v tests/python/test_attention_kernel.py
"""

import unittest

import kernel_interpreter  # noqa: F401  (TRITON_INTERPRET=1 and the kernels' folder, before triton)
import torch

import attention


def attention_reference(q, k, v, lengths, table, f, keep, p):
    """Softmax attention with the gated relative bias per distance, key padding and dropout."""
    tq, tk, d = q.shape[2], k.shape[2], q.shape[3]
    s = q @ k.transpose(-1, -2) / d**0.5
    if table is not None:
        i, j = torch.arange(tq)[:, None], torch.arange(tk)[None, :]
        bias = table[:, i - j + tk - 1]  # [H, Tq, Tk]
        s = s + (f[..., None] * bias if f is not None else bias)
    padded = torch.arange(tk)[None, :] >= lengths.long()[:, None]  # [B, Tk]
    probs = torch.softmax(s.masked_fill(padded[:, None, None, :], float("-inf")), -1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    return probs @ v


class GatedBiasAttention(unittest.TestCase):
    # (B, H, Tq, Tk, head size, bias, gate, dropout, block): T = 1, lengths that are not
    # multiples of the block, padding in the second sequence, cross-attention (Tq != Tk) without
    # bias, the plain bias, and Base's head size at the compiled 64 x 64 tiles.
    CASES = [(2, 2, 17, 17, 32, True, True, 0.0, 16), (2, 2, 33, 33, 64, True, True, 0.1, 16),
             (1, 2, 1, 1, 32, True, True, 0.0, 16), (2, 2, 17, 33, 32, False, False, 0.1, 16),
             (2, 1, 130, 130, 64, True, False, 0.0, 64), (2, 1, 65, 65, 64, True, True, 0.0, 64)]

    def run_case(self, case, dtype, tol):
        b, h, tq, tk, d, bias, gated, p, block = case
        torch.manual_seed(7)
        q, k, v = (torch.randn(b, h, t, d).to(dtype) for t in (tq, tk, tk))
        lengths = torch.tensor([tk, max(1, tk - 5)][:b], dtype=torch.int32)
        table = torch.randn(h, tq + tk - 1) if bias else None
        f = torch.rand(b, h, tq) + 0.5 if gated else None
        o, lse = attention.forward(q, k, v, lengths, table, f, p=p, seed=3, offset=8, bm=block,
                                   bn=block)
        keep = attention.keep_mask(b, h, tq, tk, p, seed=3, offset=8) if p > 0 else None
        leaves = [None if t is None else t.double().requires_grad_() for t in (q, k, v, table, f)]
        ref = attention_reference(*leaves[:3], lengths, leaves[3], leaves[4],
                                  None if keep is None else keep.double(), p)
        where = f"{case} {dtype}"
        torch.testing.assert_close(o.double(), ref, rtol=0, atol=tol, msg=where)
        self.assertEqual(o.dtype, dtype)
        do = torch.randn(b, h, tq, d).to(dtype)
        ref.backward(do.double())
        grads = attention.backward(q, k, v, o, lse, do, lengths, table, f, p=p, seed=3, offset=8,
                                   bm=block, bn=block)
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
        for case in (self.CASES[0], self.CASES[4]):
            self.run_case(case, torch.bfloat16, 3e-2)

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


if __name__ == "__main__":
    unittest.main()
