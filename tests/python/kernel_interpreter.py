"""Sets up Triton's interpreter for the kernel tests (tests/python/test_*kernel*.py): import it
before triton. It sets TRITON_INTERPRET=1, puts src/ops/triton on the path, and mends Triton
3.6's interpreter where it differs from the compiled kernels."""

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
