"""Static checks of every compiled Triton kernel, from the table the build writes
(build/kernels.tsv: src/ops/triton/aot.py, src/ops/triton/kernel_table.py). CTest runs

    .venv/bin/python tests/python/kernel_checks.py build/kernels.tsv

which prints every violation, naming the variant, the architecture, the figure and the limit,
and fails if there is one. The rules (docs/ops.md#static-checks-of-the-compiled-kernels):
- a variant that serves Base's shapes does not spill on sm_90a;
- a variant's shared memory fits what the launcher can get for it;
- a variant whose signature promises 16-byte aligned pointers loads 16 bytes at a time somewhere;
- no atomic is stronger than relaxed.
tests/python/test_kernel_table.py shows each rule failing on hand-written rows.
"""

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src",
                                "ops", "triton"))

import kernel_table  # noqa: E402

# The variants Base's shapes launch (configs/model/base.yaml under bf16 autocast): head size 64;
# bf16 logits over 250,002 ids; 768 features, an fp32 residual stream plus bf16 sub-layer outputs;
# the 768 -> 3,072 feed-forward products. The names are the ones src/ops/*.cpp build (with
# "_aligned" where the rows are: the generator's padded logits, the activations).
BASE_VARIANTS = (r"attention_\w+_bf16_d64_\w+",
                 r"masked_lm_(forward|backward)_bf16(_sample)?(_aligned)?",
                 r"residual_layernorm_(forward|backward)_fp32_bf16_1024(_dropout)?(_aligned)?",
                 r"gemm_(bias_gelu|dgelu_bgrad)_bf16")
SPILL_ARCHS = ("sm_90a",)  # where Base trains (H100, H200)

# Shared memory per block. Without an opt-in a kernel gets 48 KB, static and dynamic together;
# src/ops/triton_launch.cpp (load()) opts in, up to the variant's dynamic bytes, when those exceed
# 48 KB, and the opt-in reaches 227 KB on sm_90 and 163 KB on sm_80.
NO_OPT_IN_LIMIT = 48 * 1024
OPT_IN_ABOVE = 48 * 1024
OPT_IN_LIMIT = {"sm_90a": 227 * 1024, "sm_80": 163 * 1024}

ALIGNED_LOAD_BITS = 128  # what a 16-byte alignment promise is for


def used_at_base(variant):
    return any(re.fullmatch(pattern, variant) for pattern in BASE_VARIANTS)


def violations(rows):
    """Every broken rule in the table's rows, as messages naming the variant, the architecture,
    the figure and the limit."""
    found = []
    for r in rows:
        where = f"{r['variant']} on {r['arch']}"
        if r["arch"] in SPILL_ARCHS and used_at_base(r["variant"]) and (
                r["stack"] or r["local"] or r["stl"] or r["ldl"]):
            found.append(f"{where} spills at Base shapes: {r['stack']} bytes of stack frame, "
                         f"{r['local']} of local memory, {r['stl']} STL and {r['ldl']} LDL "
                         "instructions (limit: 0)")
        total = r["shared_static"] + r["shared_dynamic"]
        if r["shared_dynamic"] > OPT_IN_ABOVE:
            limit = OPT_IN_LIMIT.get(r["arch"])
            if limit is None:
                found.append(f"{where}: no shared-memory limit known for {r['arch']} (add it to "
                             "OPT_IN_LIMIT in tests/python/kernel_checks.py)")
            elif total > limit:
                found.append(f"{where} uses {total:,} bytes of shared memory "
                             f"({r['shared_static']:,} static + {r['shared_dynamic']:,} dynamic; "
                             f"limit with the launcher's opt-in: {limit:,})")
        elif total > NO_OPT_IN_LIMIT:
            found.append(f"{where} uses {total:,} bytes of shared memory ({r['shared_static']:,} "
                         f"static + {r['shared_dynamic']:,} dynamic; limit: {NO_OPT_IN_LIMIT:,}, "
                         f"as the launcher opts in only above {OPT_IN_ABOVE:,} dynamic bytes)")
        if r["aligned_ptrs"] and r["sass_load_bits"] < ALIGNED_LOAD_BITS:
            found.append(f"{where}: its signature promises 16-byte aligned {r['aligned_ptrs']} "
                         f"but its widest global load is {r['sass_load_bits']} bits (PTX: "
                         f"{r['ptx_load_bits']}; limit: at least {ALIGNED_LOAD_BITS})")
        for op, count in kernel_table.atomics(r):
            semantics = kernel_table.semantics(op)
            if semantics != "relaxed":
                found.append(f"{where}: {count} x {op}, {semantics} semantics, and "
                             f"{r['membars_gpu']} GPU-scope MEMBAR fences in its SASS "
                             "(limit: relaxed)")
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} build/kernels.tsv")
    path = sys.argv[1]
    if not os.path.exists(path):
        sys.exit(f"{path} does not exist: build the xlme_triton_kernels target first")
    rows = kernel_table.read(path)
    if not rows:
        sys.exit(f"{path} lists no kernels: rebuild the xlme_triton_kernels target")
    found = violations(rows)
    for message in found:
        print(message)
    if found:
        sys.exit(f"{len(found)} violation{'s' if len(found) > 1 else ''} in {path}")
    print(f"{path}: all {len(rows)} kernels (variant x architecture) pass")


if __name__ == "__main__":
    main()
