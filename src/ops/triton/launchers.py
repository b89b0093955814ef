"""Writes the typed C++ launchers of xlme's Triton kernels from their signatures (docs/ops.md).

For every @triton.jit function that src/ops/triton/aot.py compiles (its modules' aot_variants()),
one struct in a C++ header, named after the function in CamelCase (residual_layernorm_forward:
triton::ResidualLayernormForward), with a member per parameter and args(), the launch arguments
in signature order, typed from the signature. A caller fills the members by name and launches
with triton::launch(variant, device, grid, kernel.args()): no argument list is written by hand.

The members: a pointer parameter is a torch::Tensor named without its "_ptr" suffix; i32, i64,
u32, u64 and fp32 parameters are std::optional<int64_t>, <uint64_t> or <double>; the six Philox
parameters (seed, offset_lo, offset_hi, seed_ptr, offset_ptr, captured: philox_state.py) are one
std::optional<triton::PhiloxArgs> philox; a run of scalars named stem0, stem1, ... is one
std::optional<std::array<...>> stem. A name that is a C++ keyword takes a "_" (do_ptr: do_).
args() throws, naming the kernel and the member, where one is left unset.

The variants of one function share their parameters: the same names in the same order, the same
scalar types and pointers in the same places; they may differ in the pointers' dtypes and the
":16" hints, which the launch checks against the variant's image (check_args). The generation
fails, naming the variant, where they do not, or where a signature's order is not the
function's.

Run by the build (CMakeLists.txt) apart from the kernels' compilation, which it never triggers:
only the variants' lists are read (nothing is compiled), and the header is rewritten only when
its text changes.

    python src/ops/triton/launchers.py --out build/generated/include/xlme/ops/triton_launchers.h
"""

import argparse
import os
import re
import sys
import textwrap

HEADER_PATH = "xlme/ops/triton_launchers.h"
PHILOX = (("seed", "u64"), ("offset_lo", "u32"), ("offset_hi", "u32"), ("seed_ptr", "*i64"),
          ("offset_ptr", "*i64"), ("captured", "i32"))
# A signature's scalar type: the C++ type of its member, and the triton::Arg factory.
SCALARS = {"i32": ("int64_t", "i32"), "i64": ("int64_t", "i64"), "u32": ("uint64_t", "u32"),
           "u64": ("uint64_t", "u64"), "fp32": ("double", "f32")}
# Names a member cannot take: those the struct's code uses.
RESERVED = {"args", "kKernel", "value", "launcher_member", "Arg", "PhiloxArgs", "std", "torch"}
# The names of xlme/ops/triton.h's types, which a struct cannot take.
TYPES = {"Arg", "PhiloxArgs", "Grid", "KernelImage"}
# C++'s keywords and alternative tokens: a member named after a parameter that is one gets a "_"
# (attention's do_ptr: do_).
CPP_KEYWORDS = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char
    char8_t char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else enum
    explicit export extern false float for friend goto if inline int long mutable namespace new
    noexcept not not_eq nullptr operator or or_eq private protected public register
    reinterpret_cast requires return short signed sizeof static static_assert static_cast struct
    switch template this thread_local throw true try typedef typeid typename union unsigned using
    virtual void volatile wchar_t while xor xor_eq""".split())


class LauncherError(Exception):
    """A signature the launchers cannot be generated from; the message names the variant."""


def base_type(kind):
    """A signature type without its ":16" hint."""
    return kind[:-3] if kind.endswith(":16") else kind


def kind_of(kind):
    """What decides a parameter's member and Arg: "pointer" for any "*<dtype>", else the scalar
    type itself (an i32 and an i64 take different Args)."""
    return "pointer" if kind.startswith("*") else base_type(kind)


def cpp_name(name):
    """A member's name: `name`, with a "_" where it is a C++ keyword."""
    return name + "_" if name in CPP_KEYWORDS else name


def camel(name):
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def parameters(variant):
    """(function name, [(parameter, type)]) of one aot_variants() entry, its signature in the
    function's order."""
    name, fn, signature, constexprs = variant[:4]
    order = [arg for arg in fn.arg_names if arg not in constexprs]
    if order != list(signature):
        raise LauncherError(f"{name}: the signature lists ({', '.join(signature)}), the function "
                            f"{fn.__name__} takes ({', '.join(order)}) besides its "
                            "constexprs")
    for param, kind in signature.items():
        if kind_of(kind) != "pointer" and kind_of(kind) not in SCALARS:
            raise LauncherError(f"{name}: parameter {param} is {kind}; a launcher passes "
                                f"pointers and {', '.join(SCALARS)}")
    return fn.__name__, list(signature.items())


def members(function, params, variant):
    """The struct's members in signature order: (kind, member name, parameter names, C++ type,
    Arg factory); kind is "tensor", "scalar", "philox" or "array"."""
    out, i = [], 0
    names = [param for param, _ in params]
    while i < len(params):
        param, kind = params[i]
        if param in dict(PHILOX):
            group = [(p, base_type(k)) for p, k in params[i:i + len(PHILOX)]]
            if group != list(PHILOX):
                raise LauncherError(
                    f"{variant}: the Philox parameters of {function} must be "
                    f"({', '.join(p + ' ' + k for p, k in PHILOX)}) in a row, found "
                    f"({', '.join(p + ' ' + k for p, k in group)})")
            out.append(("philox", "philox", [p for p, _ in PHILOX], "PhiloxArgs", None))
            i += len(PHILOX)
            continue
        if kind_of(kind) == "pointer":
            out.append(("tensor", cpp_name(re.sub(r"_ptr$", "", param)), [param],
                        "torch::Tensor", "pointer"))
            i += 1
            continue
        cpp, factory = SCALARS[base_type(kind)]
        numbered = re.fullmatch(r"([A-Za-z_]\w*?)0", param)
        run = 1
        if numbered and numbered.group(1) not in names:
            while (i + run < len(params) and params[i + run][0] == f"{numbered.group(1)}{run}"
                   and base_type(params[i + run][1]) == base_type(kind)):
                run += 1
        if run > 1:
            out.append(("array", cpp_name(numbered.group(1)), names[i:i + run],
                        f"std::array<{cpp}, {run}>", factory))
        else:
            out.append(("scalar", cpp_name(param), [param], cpp, factory))
        i += run
    seen = {}
    for _, member, group, _, _ in out:
        if member in RESERVED or member in seen:
            clash = f"that of parameter {seen[member]}" if member in seen else "a reserved name"
            raise LauncherError(f"{variant}: the member of {function}'s parameter {group[0]} "
                                f"would be named {member}, {clash}")
        seen[member] = group[0]
    return out


def functions(variants):
    """{function name: (its members, [(variant, signature)])}, in the order the variants come;
    raises LauncherError where two variants of one function differ in their parameters' names,
    order or kinds."""
    out = {}
    for variant in variants:
        name = variant[0]
        function, params = parameters(variant)
        found = members(function, params, name)
        if function not in out:
            if camel(function) in TYPES:
                raise LauncherError(f"{name}: the launcher of {function} would be named "
                                    f"{camel(function)}, a type of xlme/ops/triton.h")
            out[function] = (params, found, [(name, dict(params))])
            continue
        first_params, _, seen = out[function]
        first = seen[0][0]
        if [p for p, _ in params] != [p for p, _ in first_params]:
            raise LauncherError(
                f"{name}: {function}'s parameters are ({', '.join(p for p, _ in params)}), "
                f"those of its variant {first} ({', '.join(p for p, _ in first_params)}): the "
                "variants of one function share their parameter names")
        for (param, kind), (_, first_kind) in zip(params, first_params):
            if kind_of(kind) != kind_of(first_kind):
                raise LauncherError(
                    f"{name}: {function}'s parameter {param} is {kind}, {first_kind} in its "
                    f"variant {first}: the variants of one function differ only in pointer "
                    "dtypes and :16 hints")
        seen.append((name, dict(params)))
    return {function: (found, seen) for function, (_, found, seen) in out.items()}


def comment_lines(text, indent=""):
    return [f"{indent}// {line}" for line in textwrap.wrap(text, 97 - len(indent))]


def struct(function, found, variants, module):
    """The declaration of one function's struct, and the definition of its args()."""
    name = camel(function)
    where = f" in src/ops/triton/{module}.py" if module else ""
    lines = comment_lines(f"{function}{where}; its variants: "
                          + ", ".join(variant for variant, _ in variants) + ".")
    lines += [f"struct {name} {{", f'  static constexpr const char* kKernel = "{function}";']
    count = sum(len(group) for _, _, group, _, _ in found)
    body = [f"inline std::vector<Arg> {name}::args() const {{", "  std::vector<Arg> args;",
            f"  args.reserve({count});"]
    for kind, member, group, cpp, factory in found:
        value = f'launcher_member({member}, kKernel, "{member}")'
        if kind == "philox":
            lines.append(f"  std::optional<PhiloxArgs> philox;  // {', '.join(group)}")
            body.append(f"  {value}.append_to(args);")
            continue
        types = sorted({signature[p] for p in group for _, signature in variants})
        params = group[0] if len(group) == 1 else f"{group[0]}..{group[-1]}"
        note = f"  // {'' if params == member else params + ': '}{', '.join(types)}"
        if kind == "tensor":
            lines.append(f"  torch::Tensor {member};{note}")
        else:
            lines.append(f"  std::optional<{cpp}> {member};{note}")
        if kind == "array":
            body.append(f"  for (const auto value : {value}) "
                        f"args.push_back(Arg::{factory}(value));")
        else:
            body.append(f"  args.push_back(Arg::{factory}({value}));")
    lines += ["", "  // The launch arguments in signature order; throws where a member is unset.",
              "  std::vector<Arg> args() const;", "};", ""]
    body += ["  return args;", "}", ""]
    return lines, body


def generate(variants, modules=None):
    """The header's text for aot_variants() entries; `modules` maps a function name to the
    module that defines it (for the comments)."""
    structs, bodies = [], []
    for function, (found, seen) in functions(variants).items():
        lines, body = struct(function, found, seen, (modules or {}).get(function))
        structs += lines
        bodies += body
    return "\n".join([
        "// Generated by src/ops/triton/launchers.py from the signatures of the kernel variants",
        "// (src/ops/triton/*.py, aot_variants()): do not edit. One struct per @triton.jit",
        "// function: fill its members by name, launch with",
        "// triton::launch(variant, device, grid, kernel.args()) (xlme/ops/triton.h).",
        "#pragma once", "", '#include "xlme/ops/triton.h"', "", "#include <torch/types.h>", "",
        "#include <array>", "#include <cstdint>", "#include <optional>", "#include <vector>", "",
        "namespace xlme::ops::triton {", "", *structs, *bodies,
        "}  // namespace xlme::ops::triton", ""])


def write_if_changed(path, text):
    """Writes `path` unless it already holds `text` (so that what includes it stays built)."""
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return False
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help=f"the header to write (.../{HEADER_PATH})")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import aot  # the kernel modules and their variants (imports Triton; compiles nothing)
    modules = {fn.__name__: module.__name__
               for module in aot.MODULES for _, fn, *_ in module.aot_variants()}
    try:
        text = generate(aot.VARIANTS, modules)
    except LauncherError as e:
        raise SystemExit(f"launchers.py: {e}")
    changed = write_if_changed(args.out, text)
    count = text.count("static constexpr const char* kKernel")
    print(f"launchers.py: {count} launchers -> {args.out}{'' if changed else ' (unchanged)'}")


if __name__ == "__main__":
    main()
