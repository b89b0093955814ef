"""The feed-forward block's GELU epilogue kernels (src/ops/triton/gemm_gelu.py) on the CPU, through
Triton's interpreter, against float64 references: sizes that are not multiples of the tiles, one
row, several row-groups; fp32 operands (the arithmetic) and bf16 (the rounding the unfused bf16
path does). Run by CTest (tests/CMakeLists.txt):

    .venv/bin/python tests/python/test_gemm_gelu_kernel.py -v
"""

import unittest

import kernel_interpreter  # noqa: F401  (TRITON_INTERPRET=1 and the kernels' folder, before triton)
import torch

import gemm_gelu

# (M, K, N, H, tile): one row; M, N, K that are not multiples of the tile; more row-blocks than
# GROUP_M so that the grouped order wraps; the compiled 64-deep steps over a 2-step K.
CASES = [(1, 16, 32, 16, 16), (37, 48, 80, 32, 16), (130, 32, 48, 16, 16),
         (70, 128, 96, 48, 32)]


def reference(x, w1, b1, w2, dout):
    """The unfused block in float64: h, gelu(h), and the gradients of gelu(h) w2^T wrt h, b1."""
    h = (x.double() @ w1.double().t() + b1.double()).requires_grad_()
    a = torch.nn.functional.gelu(h)
    (a @ w2.double().t()).backward(dout.double())
    return h.detach(), a.detach(), h.grad, h.grad.sum(0)


def inputs(m, k, n, hidden, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w1 = (torch.randn(n, k, generator=g) * k**-0.5).to(dtype)
    b1 = torch.randn(n, generator=g) * 0.5
    w2 = (torch.randn(hidden, n, generator=g) * n**-0.5).to(dtype)
    dout = torch.randn(m, hidden, generator=g).to(dtype)
    return x, w1, b1, w2, dout


class GemmBiasGelu(unittest.TestCase):
    def test_fp32_values_and_gradients(self):
        for m, k, n, hidden, tile in CASES:
            # Every grouped order where the row-blocks outnumber 8 (one per group; groups of two,
            # then a short one; the order wrapping after eight), the compiled 8 elsewhere (one
            # group wider than the row-blocks).
            for group_m in ((1, 2, 8) if m > 8 * tile else (8, )):
                where = f"M={m} K={k} N={n} H={hidden} tile={tile} group={group_m}"
                x, w1, b1, w2, dout = inputs(m, k, n, hidden, torch.float32)
                h_ref, a_ref, dh_ref, db_ref = reference(x, w1, b1, w2, dout)
                tiles = dict(bm=tile, bn=tile, bk=tile, group_m=group_m)
                h, a = gemm_gelu.bias_gelu(x, w1, b1, **tiles)
                torch.testing.assert_close(h.double(), h_ref, rtol=0, atol=1e-5, msg=where)
                torch.testing.assert_close(a.double(), a_ref, rtol=0, atol=1e-5, msg=where)
                dh, db = gemm_gelu.dgelu_bgrad(dout, w2, h, **tiles)
                torch.testing.assert_close(dh.double(), dh_ref, rtol=0, atol=1e-5, msg=where)
                torch.testing.assert_close(db.double(), db_ref, rtol=0, atol=1e-4, msg=where)

    def test_bf16_rounds_where_the_unfused_path_rounds(self):
        for m, k, n, hidden, tile in CASES:
            x, w1, b1, w2, dout = inputs(m, k, n, hidden, torch.bfloat16, seed=1)
            tiles = dict(bm=tile, bn=tile, bk=tile)
            h, a = gemm_gelu.bias_gelu(x, w1, b1, **tiles)
            self.assertEqual((h.dtype, a.dtype), (torch.bfloat16, torch.bfloat16))
            # The unfused bf16 path: h rounded to bf16, then the GELU of the rounded h.
            h_ref = (x.double() @ w1.double().t() + b1.double()).to(torch.bfloat16)
            a_ref = torch.nn.functional.gelu(h_ref.double()).to(torch.bfloat16)
            ulp = 2.0**-7  # a sum in another order may round one bf16 step away
            self.assertLessEqual(((h.double() - h_ref.double()).abs() /
                                  h_ref.double().abs().clamp_min(1e-3)).max().item(), ulp)
            # The GELU of the kernel's own h must be exactly the GELU the unfused path computes.
            a_of_h = torch.nn.functional.gelu(h.double()).to(torch.bfloat16)
            torch.testing.assert_close(a, a_of_h, rtol=0, atol=0)
            self.assertLessEqual((a.double() - a_ref.double()).abs().max().item(),
                                 ulp * a_ref.double().abs().max().item())
            dh, db = gemm_gelu.dgelu_bgrad(dout, w2, h, **tiles)
            self.assertEqual((dh.dtype, db.dtype), (torch.bfloat16, torch.float32))
            da = (dout.double() @ w2.double()).to(torch.bfloat16).double()
            hd = h.double().requires_grad_()
            torch.nn.functional.gelu(hd).backward(da)
            dh_ref = hd.grad.to(torch.bfloat16)
            scale = dh_ref.double().abs().max().item()
            self.assertLessEqual((dh.double() - dh_ref.double()).abs().max().item(), ulp * scale)
            # The bias gradient sums the kernel's rounded dh, in fp32.
            torch.testing.assert_close(db.double(), dh.double().sum(0), rtol=0, atol=1e-4)

    def test_the_bias_gradient_is_the_same_every_run(self):
        x, w1, b1, w2, dout = inputs(70, 32, 48, 16, torch.float32, seed=2)
        h, _ = gemm_gelu.bias_gelu(x, w1, b1, bm=16, bn=16, bk=16)
        first = gemm_gelu.dgelu_bgrad(dout, w2, h, bm=16, bn=16, bk=16)[1]
        again = gemm_gelu.dgelu_bgrad(dout, w2, h, bm=16, bn=16, bk=16)[1]
        self.assertTrue(torch.equal(first, again))


if __name__ == "__main__":
    unittest.main()
