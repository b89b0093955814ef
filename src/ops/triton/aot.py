"""Compiles xlme's Triton kernels ahead of time and embeds them in a C++ source (docs/ops.md).

Run by the build (CMakeLists.txt) with the project's Python, on any machine: Triton compiles for
an explicit target and needs no GPU. Every kernel variant below is compiled for sm_90a (H100,
H200) and sm_80 (A100; its cubin also runs on the other 8.x GPUs), and the output file holds each
cubin with what the C++ launcher (src/ops/triton_launch.cpp) needs: the entry name, the warps,
the shared memory, and the kernel's parameter types in order (what the launcher checks its
arguments against). The build fails here, naming the variant, when a cubin's parameters differ
from the signature (the compiled kernel has one per non-constexpr argument, then Triton's two
scratch pointers), or when a kernel needs scratch memory the launcher does not provide.

    python src/ops/triton/aot.py --out build/generated/triton_kernels.cpp
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import attention  # noqa: E402
import masked_lm  # noqa: E402
import residual_layernorm  # noqa: E402

ARCHS = [(90, "sm_90a"), (80, "sm_80")]


def masked_lm_variants():
    for dtype in ("bf16", "fp32"):
        forward = {
            "logits_ptr": f"*{dtype}", "row_stride": "i64", "targets_ptr": "*i64", "n_rows": "i32",
            "vocab": "i32", "inv_temperature": "fp32", "seed": "u64", "offset_lo": "u32",
            "offset_hi": "u32", **{f"ex{i}": "i32" for i in range(8)}, "loss_ptr": "*fp32",
            "lse_ptr": "*fp32", "argmax_ptr": "*i64", "sample_ptr": "*i64"}
        for sample in (True, False):
            yield (f"masked_lm_forward_{dtype}{'_sample' if sample else ''}",
                   masked_lm.masked_lm_forward, forward,
                   {"ROWS": 1, "QUARTER": masked_lm.FORWARD_QUARTER, "SAMPLE": sample}, 4)
        backward = {
            "logits_ptr": f"*{dtype}", "row_stride": "i64", "targets_ptr": "*i64",
            "lse_ptr": "*fp32", "grad_loss_ptr": "*fp32", "grad_ptr": f"*{dtype}",
            "grad_stride": "i64", "n_rows": "i32", "vocab": "i32"}
        yield (f"masked_lm_backward_{dtype}", masked_lm.masked_lm_backward, backward,
               {"ROWS": 1, "BLOCK": masked_lm.BACKWARD_BLOCK}, 4)


def residual_layernorm_variants():
    # (x = out, y): autocast's fp32 residual stream with bf16 sub-layer outputs, and fp32.
    for x, y in (("fp32", "bf16"), ("fp32", "fp32")):
        scalars = {"seed": "u64", "offset_lo": "u32", "offset_hi": "u32", "threshold": "u32",
                   "scale": "fp32"}
        forward = {"x_ptr": f"*{x}", "y_ptr": f"*{y}", "w_ptr": "*fp32", "b_ptr": "*fp32",
                   "out_ptr": f"*{x}", "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "n_rows": "i32",
                   "width": "i32", "eps": "fp32", **scalars}
        backward = {"x_ptr": f"*{x}", "y_ptr": f"*{y}", "w_ptr": "*fp32", "mean_ptr": "*fp32",
                    "rstd_ptr": "*fp32", "dout_ptr": f"*{x}", "dx_ptr": f"*{x}", "dy_ptr": f"*{y}",
                    "dw_part_ptr": "*fp32", "db_part_ptr": "*fp32", "n_rows": "i32",
                    "width": "i32", "rows_per_program": "i32", **scalars}
        # Widths up to 1,024 (every paper size but XL's) and up to 4,096.
        for block, rows, warps in ((1024, 2, 4), (4096, 1, 8)):
            for dropout in (True, False):
                tag = f"{x}_{y}_{block}{'_dropout' if dropout else ''}"
                constants = {"ROWS": rows, "BLOCK": block, "DROPOUT": dropout}
                yield (f"residual_layernorm_forward_{tag}",
                       residual_layernorm.residual_layernorm_forward, forward, constants, warps)
                yield (f"residual_layernorm_backward_{tag}",
                       residual_layernorm.residual_layernorm_backward, backward, constants, warps)


def attention_variants():
    # bf16 q, k, v (autocast); head sizes 64 (every paper size) and 32 (the demo model); the
    # gated relative bias, the plain relative bias, no bias (cross-attention); dropout or not.
    scalars = {"sqb": "i64", "sqh": "i64", "sqt": "i64", "skb": "i64", "skh": "i64", "skt": "i64",
               "svb": "i64", "svh": "i64", "svt": "i64", "heads": "i32", "tq": "i32", "tk": "i32",
               "scale": "fp32", "seed": "u64", "offset_lo": "u32", "offset_hi": "u32",
               "threshold": "u32", "drop_scale": "fp32"}
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
                constants = {"D": d, "BM": attention.BLOCK, "BN": attention.BLOCK, "BIAS": bias,
                             "GATED": gated, "DROPOUT": dropout, "PRECISION": "tf32"}
                for kind, fn, signature in (("forward", attention.attention_forward, forward),
                                            ("backward_dkdv", attention.attention_backward_dkdv,
                                             dkdv),
                                            ("backward_dq", attention.attention_backward_dq, dq)):
                    yield f"attention_{kind}_{tag}", fn, signature, constants, 4


VARIANTS = (list(masked_lm_variants()) + list(residual_layernorm_variants()) +
            list(attention_variants()))


def entry_params(ptx, name):
    """The parameter list of `.entry name(...)` in the PTX."""
    match = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if not match:
        raise SystemExit(f"aot.py: no '.entry {name}' in the PTX")
    return [line for line in match.group(1).split(",") if ".param" in line]


def compile_variant(name, fn, signature, constexprs, num_warps, capability):
    full = dict(signature)
    for key in constexprs:
        full[key] = "constexpr"
    source = triton.compiler.ASTSource(fn=fn, signature=full, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                            options={"num_warps": num_warps})
    meta = kernel.metadata
    params = entry_params(kernel.asm["ptx"], meta.name)
    if len(params) != len(signature) + 2:
        raise SystemExit(f"aot.py: {name} for sm_{capability}: the cubin takes {len(params)} "
                         f"parameters, the signature {len(signature)} + 2 scratch pointers")
    if meta.global_scratch_size or meta.profile_scratch_size or meta.num_ctas != 1:
        raise SystemExit(f"aot.py: {name} for sm_{capability} needs scratch memory or clusters "
                         "(global_scratch_size, profile_scratch_size, num_ctas), which "
                         "src/ops/triton_launch.cpp does not provide")
    return kernel


def cpp_bytes(data):
    rows = []
    for i in range(0, len(data), 24):
        rows.append("    " + ",".join(str(b) for b in data[i:i + 24]) + ",")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the C++ source to write")
    args = parser.parse_args()
    arrays, entries = [], []
    for index, (name, fn, signature, constexprs, num_warps) in enumerate(VARIANTS):
        for capability, arch in ARCHS:
            kernel = compile_variant(name, fn, signature, constexprs, num_warps, capability)
            meta = kernel.metadata
            cubin = kernel.asm["cubin"]
            symbol = f"k{index}_sm{capability}"
            arrays.append(f"const unsigned char {symbol}[] = {{\n{cpp_bytes(cubin)}\n}};\n")
            types = ",".join(signature.values())
            constants = ",".join(f"{k}={int(v)}" for k, v in constexprs.items()
                                 if not isinstance(v, str))
            entries.append(f'      {{"{name}", "{meta.name}", {capability}, "{arch}", {symbol}, '
                           f'sizeof({symbol}), {meta.num_warps}, {meta.shared}, "{types}", '
                           f'"{constants}"}},')
    text = ("// Generated by src/ops/triton/aot.py from src/ops/triton/*.py: do not edit.\n"
            f"// Triton {triton.__version__}.\n"
            '#include "xlme/ops/triton_images.h"\n\nnamespace xlme::ops::triton {\n\nnamespace {\n\n'
            + "\n".join(arrays) + "\n}  // namespace\n\n"
            "const std::vector<KernelImage>& kernel_images() {\n"
            "  static const std::vector<KernelImage> images{\n" + "\n".join(entries) +
            "\n  };\n  return images;\n}\n\n"
            f'const char* triton_version() {{ return "{triton.__version__}"; }}\n\n'
            "}  // namespace xlme::ops::triton\n")
    tmp = args.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"aot.py: {len(VARIANTS)} kernels x {len(ARCHS)} architectures -> {args.out}")


if __name__ == "__main__":
    main()
