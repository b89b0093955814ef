#!/usr/bin/env bash
# Where a clean build spends its time: configures a fresh build folder as scripts/setup.sh does
# (unity batches on; without the compiler cache, so that every object is compiled), builds the
# given targets (the four binaries by default; --all for everything) and prints
#   - the wall time of the build;
#   - every object's time from .ninja_log, slowest first, and the sum per area (src/<area>,
#     tests, generated, the precompiled header);
#   - for the --headers slowest objects: how many headers the compiler opened (-H), how many of
#     them are LibTorch's, and the time of the front end alone (-fsyntax-only) against the whole
#     compile, i.e. how much is parsing headers and how much is code generation.
#
#   scripts/build_profile.sh [--dir DIR] [--all] [--headers N] [--jobs N] [--keep] [-- CMAKE ARGS]
#
# Defaults: --dir build-profile (removed first), --headers 8, --jobs: Ninja's default. Arguments
# after -- go to cmake (e.g. -DXLME_UNITY_BUILD=OFF). Prints Markdown tables
# (docs/performance.md#build-time keeps them).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$root/build-profile
all=0
headers=8
jobs=()
keep=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$(realpath -m "$2"); shift ;;
    --all) all=1 ;;
    --headers) headers=$2; shift ;;
    --jobs) jobs=(-j "$2"); shift ;;
    --keep) keep=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "build_profile.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
venv=${XLME_VENV:-$root/.venv}
[ -x "$venv/bin/python3" ] || { echo "build_profile.sh: no $venv: run scripts/setup.sh --no-build first" >&2; exit 1; }

[ "$keep" -eq 1 ] || rm -rf "$dir"
cmake -S "$root" -B "$dir" -G Ninja -DXLME_WERROR=ON -DXLME_BUILD_TESTS=ON \
  "-DXLME_PYTHON=$venv/bin/python3" -DXLME_USE_CCACHE=OFF -DXLME_TRITON_AOT_CACHE= -DXLME_UNITY_BUILD=ON "${extra[@]}" \
  >"$dir.configure.log" 2>&1 \
  || { cat "$dir.configure.log" >&2; exit 1; }
targets=()
[ "$all" -eq 1 ] || targets=(--target xlme-data xlme-pretrain xlme-finetune xlme-export)
start=$(date +%s.%N)
cmake --build "$dir" "${jobs[@]}" "${targets[@]}" >"$dir.build.log" 2>&1 \
  || { tail -50 "$dir.build.log" >&2; exit 1; }
end=$(date +%s.%N)

"$venv/bin/python3" - "$dir" "$start" "$end" "$headers" "$root" <<'PY'
import json, os, re, shlex, subprocess, sys, time
build, start, end, top, root = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = []
with open(os.path.join(build, ".ninja_log")) as f:
    next(f)
    for line in f:
        begin, finish, _, output, _ = line.rstrip("\n").split("\t")
        rows.append(((int(finish) - int(begin)) / 1000.0, output))
latest = {}
for seconds, output in rows:  # the last entry of an output is the build's
    latest[output] = seconds
objects = sorted(((s, o) for o, s in latest.items() if o.endswith((".o", ".gch", ".cpp"))),
                 reverse=True)
def area(output):
    if output.endswith(".gch"):
        return "precompiled header"
    m = re.search(r"/src/([^/]+)/", output)
    if m:
        return "src/" + m.group(1)
    if "/tests/" in output or output.startswith("tests/"):
        return "tests"
    if "generated" in output:
        return "generated"
    return "other"
print(f"## Clean build of {build}: {end - start:.0f} s wall, {len(objects)} compile steps, "
      f"{sum(s for s, _ in objects):.0f} s summed (steps run side by side)\n")
print("| area | steps | seconds (sum) |\n|---|---:|---:|")
areas = {}
for s, o in objects:
    a = areas.setdefault(area(o), [0, 0.0])
    a[0] += 1
    a[1] += s
for name, (n, s) in sorted(areas.items(), key=lambda kv: -kv[1][1]):
    print(f"| {name} | {n} | {s:.0f} |")
print("\n| slowest steps | seconds |\n|---|---:|")
for s, o in objects[:25]:
    print(f"| {o} | {s:.1f} |")
commands = {}
with open(os.path.join(build, "compile_commands.json")) as f:
    for entry in json.load(f):
        commands[entry["output"] if "output" in entry else ""] = entry
        out = re.search(r"-o (\S+)", entry["command"])
        if out:
            commands[out.group(1)] = entry
if top > 0:
    print(f"\n| object | headers opened | of them LibTorch's | front end alone (s) | whole compile (s) |")
    print("|---|---:|---:|---:|---:|")
    for s, o in [x for x in objects if x[1].endswith(".o")][:top]:
        entry = commands.get(o)
        if not entry:
            continue
        args = shlex.split(entry["command"])
        if "-o" in args:
            i = args.index("-o")
            del args[i:i + 2]
        t0 = time.time()
        probe = subprocess.run(args + ["-fsyntax-only", "-H"], cwd=entry["directory"],
                               capture_output=True, text=True)
        front = time.time() - t0
        opened = [l.lstrip(". ").strip() for l in probe.stderr.splitlines() if l.startswith(".")]
        torch = sum(1 for h in opened if "/torch/include/" in h)
        print(f"| {o} | {len(opened)} | {torch} | {front:.1f} | {s:.1f} |")
PY
