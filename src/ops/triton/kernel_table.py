"""The static figures of every compiled kernel (docs/ops.md#static-checks-of-the-compiled-kernels).

src/ops/triton/aot.py records, per variant and architecture, what the cubin and its PTX say
without a GPU: registers, stack and spill instructions, shared memory, the widest global load,
cp.async, atomics and their memory semantics, fences, and the alignment the signature promises.
It writes them to a table (build/kernels.tsv, one row per variant x architecture), which
tests/python/kernel_checks.py checks. This file prints the table:

    python src/ops/triton/kernel_table.py build/kernels.tsv             # per variant, both archs
    python src/ops/triton/kernel_table.py build/kernels.tsv --markdown  # the same, for the docs
    python src/ops/triton/kernel_table.py build/kernels.tsv --rows      # every column, every row
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

# The table's columns, in order. From cuobjdump's --dump-resource-usage: regs, stack (the stack
# frame: spills and local arrays; what Triton calls n_spills), local, shared_static (on sm_90a
# ptxas reserves 1,024 bytes in a kernel that uses shared memory). From the SASS: stl and ldl
# (local-memory stores and loads: spill code), sass_load_bits (widest LDG or LDGSTS), ldgsts
# (cp.async copies), membars_gpu (MEMBAR fences at GPU or system scope, what stronger-than-relaxed
# atomics cost; the CTA-scope ones of sm_90a's async proxy are left out). From the PTX:
# ptx_load_bits (widest ld.global or cp.async), cp_async (copies, not commits or waits), atomics
# (each atom/red opcode with its count, ';' between). shared_dynamic is Triton's metadata.shared,
# what the launcher passes to cuLaunchKernel; aligned_ptrs the pointer arguments the signature
# marks ":16" (16-byte aligned).
COLUMNS = ("variant", "arch", "entry", "warps", "regs", "stack", "local", "stl", "ldl",
           "shared_static", "shared_dynamic", "ptx_load_bits", "sass_load_bits", "cp_async",
           "ldgsts", "atomics", "membars_gpu", "aligned_ptrs")
TEXT_COLUMNS = ("variant", "arch", "entry", "atomics", "aligned_ptrs")
NONE = "-"

SEMANTICS = ("relaxed", "acquire", "release", "acq_rel", "sc")


def ptx_figures(ptx):
    """Widest global load in bits (ld.global or cp.async into shared memory), cp.async copies,
    and the atomics as {opcode: count}."""
    widest, copies = 0, 0
    atomics = collections.Counter()
    for match in re.finditer(r"\bld\.global((?:\.[\w:]+)*)", ptx):
        qualifiers = match.group(1).split(".")
        lanes = next((int(q[1:]) for q in qualifiers if re.fullmatch(r"v\d", q)), 1)
        bits = next((int(q[1:]) for q in qualifiers if re.fullmatch(r"[bsuf]\d+", q)), 0)
        widest = max(widest, lanes * bits)
    for match in re.finditer(r"\bcp\.async\.(?:ca|cg)\.shared(?:::cta)?\.global[\w.:]*\s+"
                             r"\[[^\]]*\],\s*\[[^\]]*\],\s*(\w+)", ptx):
        copies += 1
        widest = max(widest, 8 * int(match.group(1), 0))
    for _ in re.finditer(r"\bcp\.async\.bulk\.[\w.:]*global", ptx):
        copies += 1  # a TMA copy: whole tiles, 16-byte aligned
        widest = max(widest, 128)
    for match in re.finditer(r"\b((?:atom|red)\.[\w.:]+)", ptx):
        atomics[match.group(1)] += 1
    return {"ptx_load_bits": widest, "cp_async": copies, "atomics": dict(atomics)}


def semantics(opcode):
    """The memory semantics of a PTX atom/red opcode; none written means .relaxed (PTX ISA)."""
    found = [q for q in opcode.split(".") if q in SEMANTICS]
    return found[0] if found else "relaxed"


def sass_load_bits(opcode):
    """Bits per thread of a SASS global load opcode (LDG.E.128, LDGSTS.E.BYPASS.64, LDG.E.U16);
    a cache hint such as LTC128B is not a width."""
    parts = opcode.split(".")
    if parts[0] == "UTMALDG":
        return 128
    for part, bits in (("128", 128), ("64", 64), ("U16", 16), ("S16", 16), ("U8", 8), ("S8", 8)):
        if part in parts[1:]:
            return bits
    return 32


def sass_figures(sass):
    """From cuobjdump -sass: spill stores and loads (STL, LDL), the widest global load, cp.async
    copies (LDGSTS, and TMA's UTMALDG) and MEMBAR fences at GPU or system scope."""
    counts = collections.Counter()
    widest = 0
    for match in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass):
        opcode = match.group(1)
        base = opcode.split(".")[0]
        counts[base] += 1
        if base == "MEMBAR" and ({"GPU", "SYS"} & set(opcode.split("."))):
            counts["MEMBAR_GPU"] += 1
        if base in ("LDG", "LDGSTS", "UTMALDG"):
            widest = max(widest, sass_load_bits(opcode))
    return {"stl": counts["STL"], "ldl": counts["LDL"], "sass_load_bits": widest,
            "ldgsts": counts["LDGSTS"] + counts["UTMALDG"], "membars_gpu": counts["MEMBAR_GPU"]}


def resource_figures(usage, entry):
    """From cuobjdump --dump-resource-usage: the entry's REG, STACK, LOCAL and SHARED."""
    match = re.search(r"Function " + re.escape(entry) + r":\s*\n\s*(.*)", usage)
    if not match:
        raise SystemExit(f"kernel_table.py: cuobjdump reports no resource usage for {entry}")
    fields = dict(re.findall(r"(\w+):(\d+)", match.group(1)))
    return {"regs": int(fields["REG"]), "stack": int(fields["STACK"]),
            "local": int(fields["LOCAL"]), "shared_static": int(fields["SHARED"])}


def disassemble(cubin, cuobjdump):
    """cuobjdump's resource usage and SASS of one cubin, given as bytes."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        result = subprocess.run([cuobjdump, "--dump-resource-usage", "-sass", f.name],
                                capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"kernel_table.py: {cuobjdump} failed: {result.stderr.strip()}")
    return result.stdout


def row(variant, arch, signature, entry, warps, shared_dynamic, ptx, dump):
    """One table row from a compiled variant: its PTX and cuobjdump's output (disassemble)."""
    figures = {**resource_figures(dump, entry), **sass_figures(dump), **ptx_figures(ptx)}
    figures["atomics"] = ";".join(f"{op} x{n}" for op, n in sorted(figures["atomics"].items()))
    aligned = [name for name, kind in signature.items()
               if kind.startswith("*") and kind.endswith(":16")]
    return {"variant": variant, "arch": arch, "entry": entry, "warps": warps,
            "shared_dynamic": shared_dynamic, "aligned_ptrs": ",".join(aligned), **figures}


def atomics(r):
    """[(opcode, count)] of a row's atomics column."""
    if not r["atomics"]:
        return []
    return [(op, int(n)) for op, n in (entry.rsplit(" x", 1) for entry in r["atomics"].split(";"))]


def write(path, rows):
    with open(path, "w") as f:
        f.write("\t".join(COLUMNS) + "\n")
        for r in rows:
            f.write("\t".join(str(r[c]) if r[c] != "" else NONE for c in COLUMNS) + "\n")


def read(path):
    """The rows of a table written by write(): numbers as ints, empty fields as ''."""
    with open(path) as f:
        lines = f.read().splitlines()
    header = tuple(lines[0].split("\t")) if lines else ()
    if header != COLUMNS:
        raise SystemExit(f"{path} has the columns {', '.join(header) or '(none)'}, not this "
                         "version's: rebuild the xlme_triton_kernels target")
    rows = []
    for line in lines[1:]:
        values = ["" if v == NONE else v for v in line.split("\t")]
        rows.append({c: v if c in TEXT_COLUMNS else int(v) for c, v in zip(COLUMNS, values)})
    return rows


def summary(r):
    """A row's figures in a few words each, for the printed table."""
    spill = f"{r['stack']} B, {r['stl']}/{r['ldl']}" if r["stack"] or r["stl"] or r["ldl"] else "0"
    shared = r["shared_static"] + r["shared_dynamic"]
    copies = str(r["ldgsts"]) if r["ldgsts"] else "-"
    sems = collections.Counter()
    for op, n in atomics(r):
        sems[semantics(op)] += n
    atomic = ", ".join(f"{sem} x{n}" for sem, n in sorted(sems.items())) or "-"
    if r["membars_gpu"]:
        atomic += f" (MEMBAR x{r['membars_gpu']})"
    return {"regs": str(r["regs"]), "spills": spill, "shared KB": f"{shared / 1024:.1f}",
            "load": str(r["sass_load_bits"]), "cp.async": copies, "atomics": atomic}


def by_variant(rows):
    """[(variant, aligned_ptrs, {arch: row})] in the table's order."""
    grouped = {}
    for r in rows:
        grouped.setdefault(r["variant"], (r["aligned_ptrs"], {}))[1][r["arch"]] = r
    return [(variant, aligned, archs) for variant, (aligned, archs) in grouped.items()]


def compact(rows):
    """The header and, per variant, each figure as 'sm_90a / sm_80' (the table's arch order)."""
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    fields = ("regs", "spills", "shared KB", "load", "cp.async", "atomics")
    lines = []
    for variant, aligned, by_arch in by_variant(rows):
        sums = [summary(by_arch[a]) if a in by_arch else None for a in archs]
        cells = [" / ".join(s[f] if s else "?" for s in sums) for f in fields]
        lines.append([variant, *cells, "yes" if aligned else "-"])
    return ["variant", *fields, ":16"], lines


def print_table(rows, markdown):
    header, lines = compact(rows)
    if markdown:
        print(f"| {' | '.join(header)} |")
        print(f"|{'|'.join(' --- ' for _ in header)}|")
        for line in lines:
            print(f"| `{line[0]}` | {' | '.join(line[1:])} |")
        return
    archs = " / ".join(dict.fromkeys(r["arch"] for r in rows))
    print(f"each figure: {archs}; spills: stack bytes, STL/LDL instructions; load: widest global "
          "load in bits (SASS); cp.async: LDGSTS copies; :16: the signature promises 16-byte "
          "aligned pointers")
    widths = [max(len(x) for x in column) for column in zip(header, *lines)]
    for line in [header, *lines]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the table aot.py wrote (build/kernels.tsv)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("--rows", action="store_true", help="every column of every row")
    args = parser.parse_args()
    if not os.path.exists(args.table):
        sys.exit(f"{args.table} does not exist: build the xlme_triton_kernels target first")
    rows = read(args.table)
    if args.rows:
        widths = [max(len(str(r[c]) or NONE) for r in rows + [dict(zip(COLUMNS, COLUMNS))])
                  for c in COLUMNS]
        for r in [dict(zip(COLUMNS, COLUMNS)), *rows]:
            print("  ".join((str(r[c]) or NONE).ljust(w)
                            for c, w in zip(COLUMNS, widths)).rstrip())
        return
    print_table(rows, args.markdown)


if __name__ == "__main__":
    main()
