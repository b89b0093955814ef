"""xlme's Triton kernels on the CPU, through Triton's interpreter (TRITON_INTERPRET=1), from the
same source the build compiles for the GPU (src/ops/triton/*.py), against float64 references at
awkward sizes: the masked-LM loss and sampler, and residual + dropout + LayerNorm. Run by CTest
(tests/CMakeLists.txt; the attention kernel's tests are tests/python/test_attention_kernel.py):

    .venv/bin/python -m unittest -v tests/python/test_kernels.py
"""

import unittest

import kernel_interpreter  # noqa: F401  (TRITON_INTERPRET=1 and the kernels' folder, before triton)
import numpy as np
import torch
from kernel_interpreter import philox4x32_10

import masked_lm
import residual_layernorm as rln


def reference(logits64, targets):
    loss = torch.nn.functional.cross_entropy(logits64, targets, reduction="none")
    return loss, torch.logsumexp(logits64, 1)


class MaskedLmForward(unittest.TestCase):
    # (rows, vocab): one id, lengths that are not multiples of the block, one row, many rows.
    SHAPES = [(1, 1), (1, 17), (3, 65), (5, 512), (2, 1031), (7, 2049)]

    def check(self, dtype, quarter, rows_per_program):
        torch.manual_seed(1)
        for n, v in self.SHAPES:
            x64 = torch.randn(n, v, dtype=torch.float64) * 4
            x = x64.to(dtype)
            targets = torch.randint(0, v, (n, ))
            loss, lse, argmax, drawn = masked_lm.forward(x, targets, rows=rows_per_program,
                                                         quarter=quarter)
            ref_loss, ref_lse = reference(x.to(torch.float64), targets)
            # fp32 accumulation over at most 2,049 terms: ~1e-6 relative.
            torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5,
                                       msg=f"loss {n}x{v} {dtype}")
            torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
            self.assertTrue(torch.equal(argmax, x.to(torch.float64).argmax(1)), f"{n}x{v}")
            self.assertIsNone(drawn)

    def test_fp32_at_the_compiled_block(self):
        self.check(torch.float32, masked_lm.FORWARD_QUARTER, 1)

    def test_bf16_at_the_compiled_block(self):
        self.check(torch.bfloat16, masked_lm.FORWARD_QUARTER, 1)

    def test_small_blocks_and_several_rows_per_program(self):
        self.check(torch.float32, 16, 4)

    def test_argmax_is_the_first_maximum(self):
        x = torch.zeros(2, 40)
        x[0, [3, 17, 35]] = 5.0  # in different lanes and chunks
        x[1, [36, 4]] = 2.0
        _, _, argmax, _ = masked_lm.forward(x, torch.zeros(2, dtype=torch.int64), quarter=8)
        self.assertEqual(argmax.tolist(), [3, 4])

    def test_extreme_logits_stay_finite(self):
        x = torch.tensor([[1e4, -1e4, 0.0, 30.0], [-1e4, -1e4, -1e4, -1e4]])
        loss, lse, _, _ = masked_lm.forward(x, torch.tensor([1, 2]), quarter=4)
        ref_loss, ref_lse = reference(x.double(), torch.tensor([1, 2]))
        torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=0)


class MaskedLmBackward(unittest.TestCase):
    def test_gradient_against_float64_autograd(self):
        torch.manual_seed(2)
        for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 8e-3)):
            for n, v, block in ((1, 1, 1024), (3, 65, 16), (4, 1031, 1024), (2, 2049, 1024)):
                x = (torch.randn(n, v) * 3).to(dtype)
                targets = torch.randint(0, v, (n, ))
                grad_rows = torch.rand(n)
                # The forward at the compiled block only supplies lse (tested above).
                _, lse, _, _ = masked_lm.forward(x, targets)
                grad = masked_lm.backward(x, targets, lse, grad_rows, block=block)
                self.assertEqual(grad.dtype, dtype)
                x64 = x.to(torch.float64).requires_grad_()
                loss, _ = reference(x64, targets)
                (loss * grad_rows.double()).sum().backward()
                # bf16 output: half a unit in the last place of values up to 1.
                torch.testing.assert_close(grad.double(), x64.grad, rtol=0, atol=tol,
                                           msg=f"{n}x{v} {dtype}")


class MaskedLmPaddedRows(unittest.TestCase):
    # Logits laid out with a padded row stride (a multiple of 64, as the generator's head writes
    # them for 16-byte loads): a view [N, V] of a [N, V + pad] buffer whose pad holds garbage.
    def test_padded_rows_give_the_same_bits_as_contiguous_ones(self):
        torch.manual_seed(5)
        for dtype in (torch.float32, torch.bfloat16):
            for n, v in ((3, 65), (5, 1031), (2, 2049)):
                padded = (v + 63) // 64 * 64
                buffer = torch.full((n, padded), float("nan"), dtype=dtype)
                view = buffer[:, :v]
                view.copy_(torch.randn(n, v) * 3)
                dense = view.contiguous()
                self.assertEqual(view.stride(0), padded)
                targets = torch.randint(0, v, (n, ))
                for sample in (False, True):
                    got = masked_lm.forward(view, targets, sample=sample, seed=7, offset=12,
                                            excluded=(0, 2), rows=masked_lm.FORWARD_ROWS)
                    want = masked_lm.forward(dense, targets, sample=sample, seed=7, offset=12,
                                             excluded=(0, 2), rows=masked_lm.FORWARD_ROWS)
                    for a, b in zip(got, want):
                        if b is not None:
                            self.assertTrue(torch.equal(a, b), f"{n}x{v} {dtype} {sample}")
                lse = want[1]
                grad_rows = torch.rand(n)
                grad = masked_lm.backward(view, targets, lse, grad_rows, padded_grad=True)
                self.assertEqual(grad.stride(0), padded)
                self.assertTrue(torch.equal(grad, masked_lm.backward(dense, targets, lse,
                                                                     grad_rows)), f"{n}x{v}")


class MaskedLmSampling(unittest.TestCase):
    # rows: rows per program, many by default (the interpreter's cost is per program and step).
    def draws(self, x, seed, offset, excluded=(), temperature=1.0, rows=1 << 14):
        n = x.shape[0]
        return masked_lm.forward(x, torch.zeros(n, dtype=torch.int64), sample=True,
                                 inv_temperature=1.0 / temperature, seed=seed, offset=offset,
                                 excluded=excluded, rows=rows, quarter=4)[3]

    def test_draws_follow_the_softmax_without_the_excluded_ids(self):
        # 200,000 draws from one row of 13 ids (4 excluded), at temperature 0.7: the total
        # variation between the draws' frequencies and softmax(x / 0.7) over the others.
        logits = torch.tensor([2.0, 0.5, -1.0, 3.0, 0.0, 1.0, -0.5, 4.0, 1.5, 0.2, -2.0, 2.5, 0.8])
        excluded = (0, 3, 7, 12)
        n = 200_000
        drawn = self.draws(logits.expand(n, -1).contiguous(), seed=1234, offset=8,
                           excluded=excluded, temperature=0.7)
        counts = torch.bincount(drawn, minlength=13).double()
        self.assertEqual(counts[list(excluded)].sum().item(), 0)
        scores = logits.double() / 0.7
        scores[list(excluded)] = float("-inf")
        p = torch.softmax(scores, 0)
        tv = 0.5 * (counts / n - p).abs().sum().item()
        # Sampling noise alone: E[TV] ~ 0.002 at n = 200,000.
        self.assertLess(tv, 0.006, f"total variation {tv}")

    def test_same_seed_and_offset_same_draws(self):
        # 24 rows of 50 ids: four steps a row, two programs of 16 rows (the second with 8); a row's
        # draw repeats with probability ~0.05, so 24 rows never all repeat by chance.
        torch.manual_seed(3)
        x = torch.randn(24, 50)
        a = self.draws(x, seed=99, offset=4, rows=16)
        self.assertTrue(torch.equal(a, self.draws(x, seed=99, offset=4, rows=1)))  # per-row counters
        self.assertFalse(torch.equal(a, self.draws(x, seed=99, offset=8, rows=16)))
        self.assertFalse(torch.equal(a, self.draws(x, seed=98, offset=4, rows=16)))
        self.assertFalse(torch.equal(a, self.draws(x, seed=99, offset=4 + (1 << 32), rows=16)))


class ResidualLayerNorm(unittest.TestCase):
    # (rows, width): one feature, widths that are not powers of two, Base's 768, XL-sized 2,560.
    SHAPES = [(1, 1), (3, 17), (17, 65), (5, 768), (2, 2560)]

    def check(self, y_dtype, p, tol):
        torch.manual_seed(5)
        for n, width in self.SHAPES:
            x, y = torch.randn(n, width), torch.randn(n, width).to(y_dtype)
            w, b = torch.randn(width), torch.randn(width)
            out, mean, rstd = rln.forward(x, y, w, b, 1e-5, p=p, seed=11, offset=12)
            keep = rln.keep_mask(n, width, p, seed=11, offset=12) if p > 0 else torch.ones(n, width)
            x64, y64, w64, b64 = [t.double().requires_grad_() for t in (x, y, w, b)]
            ref = torch.nn.functional.layer_norm(x64 + y64 * keep.double() / (1 - p), (width, ),
                                                 w64, b64, 1e-5)
            where = f"{n}x{width} p={p} {y_dtype}"
            torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol, msg=where)
            self.assertEqual(out.dtype, torch.float32)
            dout = torch.randn(n, width)
            ref.backward(dout.double())
            # Two programs' partial sums of dw and db at least, where there are two rows.
            dx, dy, dw, db = rln.backward(x, y, w, mean, rstd, dout, p=p, seed=11, offset=12,
                                          programs=2)
            self.assertEqual(dy.dtype, y_dtype)
            for name, got, want in (("dx", dx, x64), ("dy", dy, y64), ("dw", dw, w64),
                                    ("db", db, b64)):
                scale = max(1.0, want.grad.abs().max().item())
                tol_here = tol * scale * (4 if y_dtype == torch.bfloat16 and name == "dy" else 1)
                torch.testing.assert_close(got.double(), want.grad, rtol=0, atol=tol_here,
                                           msg=f"{name} {where}")

    def test_fp32_without_dropout(self):
        self.check(torch.float32, 0.0, 2e-5)

    def test_fp32_with_dropout(self):
        self.check(torch.float32, 0.1, 2e-5)

    def test_bf16_sublayer_output_with_dropout(self):
        # y in bf16, x and the output in fp32 (autocast); dy rounded to bf16.
        self.check(torch.bfloat16, 0.1, 1e-2)

    def test_the_mask_keeps_one_minus_p_and_repeats_with_the_seed(self):
        keep = rln.keep_mask(64, 1000, 0.1, seed=7, offset=20)
        self.assertAlmostEqual(keep.mean().item(), 0.9, delta=0.004)  # 64,000 draws: sd 0.0012
        self.assertTrue(torch.equal(keep, rln.keep_mask(64, 1000, 0.1, seed=7, offset=20)))
        # Another offset or seed changes the first rows (a row's mask does not depend on the count).
        self.assertFalse(torch.equal(keep[:4], rln.keep_mask(4, 1000, 0.1, seed=7, offset=24)))
        self.assertFalse(torch.equal(keep[:4], rln.keep_mask(4, 1000, 0.1, seed=8, offset=20)))
        # Neighbouring elements are not correlated: both kept as often as independence says.
        pairs = (keep[:, :-1] * keep[:, 1:]).mean().item()
        self.assertAlmostEqual(pairs, 0.81, delta=0.006)
        self.assertEqual(rln.keep_mask(4, 10, 0.0).min().item(), 1.0)

    def test_the_mask_is_each_features_own_philox_word(self):
        # Feature c of row r keeps word c % 4 of Philox4x32-10(seed; c / 4, r, offset), computed
        # here without Triton: four features a call, none sharing a word; a width that is not a
        # multiple of four and a seed and offset with both 32-bit halves set.
        seed, offset, p, n, width = (7 << 32) | 12345, (3 << 32) | 40, 0.3, 5, 70
        keep = rln.keep_mask(n, width, p, seed=seed, offset=offset)
        cols, rows = np.meshgrid(np.arange(width), np.arange(n))
        words = philox4x32_10(seed, cols // 4, rows, offset & 0xFFFFFFFF, offset >> 32)
        word = np.choose(cols % 4, words)
        want = torch.from_numpy((word >= rln.threshold_of(p)).astype(np.float32))
        self.assertTrue(torch.equal(keep, want), f"{(keep != want).sum().item()} differ")


class GraphCapturedPhilox(unittest.TestCase):
    # Under a CUDA graph capture the kernels read the generator's seed and base offset from device
    # memory and add their offset within the graph (src/ops/triton/philox_state.py): the same
    # numbers as the host values seed and base + that offset, here with a sum that carries into
    # the offset's high half. The host's seed argument is then ignored (launch_args passes 0).
    SEED, BASE, INTRAGRAPH = (5 << 32) | 321, (3 << 32) | 0xFFFFFFF0, 0x24

    def captured(self):
        return (torch.tensor([self.SEED]), torch.tensor([self.BASE]), self.INTRAGRAPH)

    def test_masked_lm_draws_from_the_device_state(self):
        torch.manual_seed(6)
        x = torch.randn(8, 50)
        host = masked_lm.forward(x, torch.zeros(8, dtype=torch.int64), sample=True, seed=self.SEED,
                                 offset=self.BASE + self.INTRAGRAPH, excluded=(1, ), rows=8,
                                 quarter=4)[3]
        device = masked_lm.forward(x, torch.zeros(8, dtype=torch.int64), sample=True,
                                   excluded=(1, ), rows=8, quarter=4, captured=self.captured())[3]
        self.assertTrue(torch.equal(host, device))
        other = masked_lm.forward(x, torch.zeros(8, dtype=torch.int64), sample=True,
                                  excluded=(1, ), rows=8, quarter=4,
                                  captured=(torch.tensor([self.SEED]), torch.tensor([self.BASE]),
                                            0))[3]
        self.assertFalse(torch.equal(host, other), "the offset within the graph is added")

    def test_residual_layernorm_masks_and_values_from_the_device_state(self):
        offset = self.BASE + self.INTRAGRAPH
        keep = rln.keep_mask(6, 70, 0.3, seed=self.SEED, offset=offset)
        self.assertTrue(torch.equal(keep, rln.keep_mask(6, 70, 0.3, captured=self.captured())))
        self.assertFalse(torch.equal(keep, rln.keep_mask(6, 70, 0.3, seed=self.SEED,
                                                         offset=self.BASE)))
        torch.manual_seed(7)
        x, y, dout = torch.randn(5, 40), torch.randn(5, 40), torch.randn(5, 40)
        w, b = torch.randn(40), torch.randn(40)
        out, mean, rstd = rln.forward(x, y, w, b, 1e-5, p=0.3, seed=self.SEED, offset=offset)
        got = rln.forward(x, y, w, b, 1e-5, p=0.3, captured=self.captured())
        self.assertTrue(torch.equal(out, got[0]))
        grads = rln.backward(x, y, w, mean, rstd, dout, p=0.3, seed=self.SEED, offset=offset)
        for a, g in zip(grads, rln.backward(x, y, w, mean, rstd, dout, p=0.3,
                                            captured=self.captured())):
            self.assertTrue(torch.equal(a, g))


class Philox(unittest.TestCase):
    def test_the_reference_gives_random123s_known_answers(self):
        # Philox4x32-10's known-answer vectors from Random123 (kat_vectors).
        cases = [(0, (0, 0, 0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
                 (2**64 - 1, (2**32 - 1, ) * 4, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
                 ((0x299f31d0 << 32) | 0xa4093822, (0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344),
                  (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
        for seed, counter, want in cases:
            self.assertEqual(tuple(int(w) for w in philox4x32_10(seed, *counter)), want)


if __name__ == "__main__":
    unittest.main()
