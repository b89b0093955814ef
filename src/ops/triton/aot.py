"""Compiles xlme's Triton kernels ahead of time and embeds them in a C++ source (docs/ops.md).

Run by the build (CMakeLists.txt) with the project's Python, on any machine: Triton compiles for
an explicit target and needs no GPU. Every kernel variant below is compiled for sm_90a (H100,
H200) and sm_80 (A100; its cubin also runs on the other 8.x GPUs), and the output file holds each
cubin with what the C++ launcher (src/ops/triton_launch.cpp) needs: the entry name, the warps,
the shared memory, and the kernel's parameter types in order (what the launcher checks its
arguments against). The build fails here, naming the variant, when a cubin's parameters differ
from the signature (the compiled kernel has one per non-constexpr argument, then Triton's two
scratch pointers), or when a kernel needs scratch memory the launcher does not provide.
With --table it also writes each cubin's static figures (registers, spills, shared memory, load
widths, atomics: kernel_table.py), which tests/python/kernel_checks.py checks. The C++ callers
launch through structs that launchers.py generates from the same variants' signatures (a member
per parameter, args() in signature order), in a build step of its own that compiles nothing.

    python src/ops/triton/aot.py --out build/generated/triton_kernels.cpp --table build/kernels.tsv
"""

import argparse
import concurrent.futures
import hashlib
import importlib.metadata
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import attention  # noqa: E402
import gemm_gelu  # noqa: E402
import kernel_table  # noqa: E402
import masked_lm  # noqa: E402
import residual_layernorm  # noqa: E402

ARCHS = [(90, "sm_90a"), (80, "sm_80")]


# Each kernel module lists its own variants: aot_variants() yields (name, function, signature,
# constexprs, num_warps[, options]) for every compiled form. A signature type ending in ":16"
# ("*bf16:16", "i32:16") tells the compiler the pointer is 16-byte aligned or the integer a
# multiple of 16 (so that loads are vectorized); the launcher checks it at every launch.
# `options` are more of triton.compile's options (e.g. num_stages).
MODULES = (masked_lm, residual_layernorm, attention, gemm_gelu)
VARIANTS = [variant for module in MODULES for variant in module.aot_variants()]


def entry_params(ptx, name):
    """The parameter list of `.entry name(...)` in the PTX."""
    match = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if not match:
        raise SystemExit(f"aot.py: no '.entry {name}' in the PTX")
    return [line for line in match.group(1).split(",") if ".param" in line]


def compile_variant(name, fn, signature, constexprs, num_warps, options, capability):
    full = {key: kind.split(":")[0] for key, kind in signature.items()}
    for key in constexprs:
        full[key] = "constexpr"
    attrs = {}
    for key, kind in signature.items():
        if kind.endswith(":16"):
            attrs[(fn.arg_names.index(key),)] = [["tt.divisibility", 16]]
        elif ":" in kind:
            raise SystemExit(f"aot.py: {name}: argument {key} is {kind}; the only hint is :16")
    source = triton.compiler.ASTSource(fn=fn, signature=full, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                            options={"num_warps": num_warps, **options})
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


# A byte as it appears in a C++ string literal: printable ASCII as itself, every other byte as a
# three-digit octal escape (which ends there, so that a digit after it stays a character; "?" is
# escaped too, against trigraphs). A compiler reads megabytes of string literal many times faster
# than the same bytes as an initializer list of numbers.
_LITERAL = [chr(b) if 0x20 <= b < 0x7F and chr(b) not in '"\\?' else f"\\{b:03o}"
            for b in range(256)]


def cpp_bytes(data):
    """`data` as adjacent string literals of about 4,000 characters a line. The array they
    initialize is one byte longer than `data` (the literal's closing NUL)."""
    lines, line, width = [], [], 0
    for b in data:
        piece = _LITERAL[b]
        if width + len(piece) > 4000:
            lines.append('    "' + "".join(line) + '"')
            line, width = [], 0
        line.append(piece)
        width += len(piece)
    lines.append('    "' + "".join(line) + '"')
    return "\n".join(lines)


def inputs_hash():
    """What the output depends on: every kernel source beside this file (this one included; not
    launchers.py, which writes the C++ launchers), the Triton version and the architectures."""
    digest = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py") and name != "launchers.py":
            digest.update(name.encode() + b"\0")
            with open(os.path.join(here, name), "rb") as f:
                digest.update(f.read() + b"\0")
    digest.update(importlib.metadata.version("triton").encode() + repr(ARCHS).encode())
    return digest.hexdigest()[:32]


def write_atomically(path, write):
    """write(tmp) fills a temporary file that then replaces `path`: a killed run leaves no half."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the C++ source to write")
    parser.add_argument("--table", help="the table of every cubin's static figures to write "
                        "(src/ops/triton/kernel_table.py prints it)")
    parser.add_argument("--cache-dir", help="reuse the outputs of an earlier run with the same "
                        "kernel sources, Triton version and architectures (files per hash)")
    args = parser.parse_args()
    cached = os.path.join(args.cache_dir, inputs_hash()) if args.cache_dir else None
    outputs = [(args.out, ".cpp")] + ([(args.table, ".tsv")] if args.table else [])
    if cached and all(os.path.exists(cached + suffix) for _, suffix in outputs):
        for path, suffix in outputs:
            write_atomically(path, lambda tmp: shutil.copyfile(cached + suffix, tmp))
        print(f"aot.py: {len(VARIANTS)} kernels x {len(ARCHS)} architectures -> "
              f"{' and '.join(path for path, _ in outputs)} (unchanged inputs: reused {cached}.*)")
        return
    # cuobjdump disassembles each cubin on a thread of its own while the next one compiles.
    cuobjdump = triton.knobs.nvidia.cuobjdump.path
    disassembler = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    arrays, entries, rows = [], [], []
    for index, (name, fn, signature, constexprs, num_warps, *more) in enumerate(VARIANTS):
        options = more[0] if more else {}
        for capability, arch in ARCHS:
            kernel = compile_variant(name, fn, signature, constexprs, num_warps, options,
                                     capability)
            meta = kernel.metadata
            cubin = kernel.asm["cubin"]
            dump = disassembler.submit(kernel_table.disassemble, cubin, cuobjdump)
            rows.append((name, arch, signature, meta.name, meta.num_warps, meta.shared,
                         kernel.asm["ptx"], dump))
            symbol = f"k{index}_sm{capability}"
            arrays.append(f"alignas(8) const unsigned char {symbol}[] =\n{cpp_bytes(cubin)};\n")
            types = ",".join(signature.values())
            constants = ",".join(f"{k}={int(v)}" for k, v in constexprs.items()
                                 if not isinstance(v, str))
            entries.append(f'      {{"{name}", "{meta.name}", {capability}, "{arch}", {symbol}, '
                           f'sizeof({symbol}) - 1, {meta.num_warps}, {meta.shared}, "{types}", '
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
    table = [kernel_table.row(*fields, dump.result()) for *fields, dump in rows]
    disassembler.shutdown()
    write_atomically(args.out, lambda tmp: write_text(tmp, text))
    if args.table:
        write_atomically(args.table, lambda tmp: kernel_table.write(tmp, table))
    if cached:
        os.makedirs(args.cache_dir, exist_ok=True)
        write_atomically(cached + ".cpp", lambda tmp: write_text(tmp, text))
        write_atomically(cached + ".tsv", lambda tmp: kernel_table.write(tmp, table))
    print(f"aot.py: {len(VARIANTS)} kernels x {len(ARCHS)} architectures -> "
          f"{' and '.join(path for path, _ in outputs)}")


if __name__ == "__main__":
    main()
