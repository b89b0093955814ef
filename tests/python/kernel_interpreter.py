"""Sets up Triton's interpreter for the kernel tests (tests/python/test_*kernel*.py): import it
before triton. It sets TRITON_INTERPRET=1, puts src/ops/triton on the path, and mends Triton
3.6's interpreter where it differs from the compiled kernels (bf16 products, bf16 rounding)."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src",
                                "ops", "triton"))

np.seterr(all="ignore")  # masked lanes compute exp(-inf - -inf) and log(0) before tl.where


def _patch_interpreter_bf16_dot():
    """Triton 3.6's interpreter stores bf16 as uint16 and its tl.dot multiplies those integers
    (a bf16 x bf16 product of randn values comes out near 1e10). The compiled kernels are not
    affected. The operands are widened to fp32 here, exactly, as the tensor cores read them."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def widen(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = (handle.data.astype(np.uint32) << 16).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


_patch_interpreter_bf16_dot()


def _patch_interpreter_bf16_rounding():
    """Triton 3.6's interpreter narrows fp32 to bf16 by cutting the low 16 bits (round toward
    zero) where the GPU's `.to(tl.bfloat16)` rounds to the nearest even (cvt.rn.bf16.f32), so a
    kernel's bf16 results came out up to one bf16 step below the compiled kernel's. Narrowing is
    done here as the GPU does it; NaN stays NaN."""
    import triton.language as tl
    from triton.runtime import interpreter

    def narrow(data):
        bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
        rounded = np.where(np.isnan(data), (bits >> 16) | 0x40, rounded)
        return rounded.astype(np.uint16)

    def handles(src, dst_type):
        return src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16

    cast_impl = interpreter.InterpreterBuilder.cast_impl
    fp_to_fp = interpreter.InterpreterBuilder.create_fp_to_fp

    def patched_cast(self, src, dst_type):
        if handles(src, dst_type):
            return interpreter.TensorHandle(narrow(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    def patched_fp_to_fp(self, src, dst_type, rounding_mode):
        if handles(src, dst_type) and rounding_mode != interpreter._ir.ROUNDING_MODE.RTZ:
            return interpreter.TensorHandle(narrow(src.data), tl.bfloat16)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    interpreter.InterpreterBuilder.cast_impl = patched_cast
    interpreter.InterpreterBuilder.create_fp_to_fp = patched_fp_to_fp


_patch_interpreter_bf16_rounding()


def philox4x32_10(seed, c0, c1, c2, c3):
    """Philox4x32-10 (Salmon et al. 2011) in NumPy, independent of Triton's tl.philox: the four
    32-bit words for key (seed's low and high halves) and counters c0 .. c3 (arrays broadcast
    together). Checked against Random123's known-answer vectors in tests/python/test_kernels.py."""
    mask = np.uint64(0xFFFFFFFF)
    c = [np.asarray(x, dtype=np.uint64) & mask for x in np.broadcast_arrays(c0, c1, c2, c3)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    round_a, round_b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p2 = round_b * c[2], round_a * c[0]
        c = [((p0 >> np.uint64(32)) ^ c[1] ^ k0) & mask, p0 & mask,
             ((p2 >> np.uint64(32)) ^ c[3] ^ k1) & mask, p2 & mask]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return [word.astype(np.uint32) for word in c]
