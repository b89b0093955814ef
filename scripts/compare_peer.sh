#!/usr/bin/env bash
# xlme-pretrain --benchmark against its PyTorch peer, scripts/peer_hf_electra.py (HuggingFace
# ELECTRA), at the same shapes, on the same torch, interleaved; prints a Markdown table of the
# median tokens/s over the rounds and xlme / peer (docs/performance.md).
#
#   scripts/compare_peer.sh [--rounds N] [--build DIR] [--device cpu|cuda] [--steps N]
#                           [--shapes LIST] [--precisions LIST] [--threads N] [--set KEY=VALUE]...
#                           [--out DIR]
#
#   --rounds N        rounds (default 3); each runs every shape and precision, xlme and the peer
#                     back to back, the two in turn first
#   --build DIR       xlme's build folder (default build)
#   --device cpu      shapes tiny, small: configs/pretrain/benchmark/cpu_{tiny,small}.yaml, 40 / 8
#                     steps; precisions fp32, bf16 (bf16 autocast on both sides). The default.
#   --device cuda     shape base: configs/pretrain/base.yaml as scripts/gpu_check.sh benchmarks it
#                     (model.attention=sdpa, train.tokens_per_task=65536), 10 steps; bf16
#   --steps N         timed steps of every shape (xlme: optimizer steps; the peer: micro-batches)
#   --shapes, --precisions   comma-separated subsets, e.g. --shapes small --precisions fp32
#   --threads N       CPU threads of both sides (default: every core the process may use)
#   --set KEY=VALUE   an xlme config override; the peer's shapes come from xlme's resolved config
#                     (--print-config), so it reaches both sides
#   --out DIR         where the logs and runs.jsonl go (default: a new /tmp/xlme-compare-peer.*)
#
# Python: XLME_PYTHON, default the one the build was configured with (XLME_PYTHON in its
# CMakeCache.txt: .venv/bin/python3, which scripts/setup.sh makes); its torch must be the one xlme
# was built against. Exit status: 0 every run gave a figure; 1 a run failed (its cell says why,
# its log is in --out); 2 a bad command line, or no build or Python.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "compare_peer.sh: $*" >&2; exit 2; }
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

rounds=3
build=$root/build
device=cpu
steps=""
shapes=""
precisions=""
threads=""
out=""
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds | --build | --device | --steps | --shapes | --precisions | --threads | --set | --out)
      [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;;&
    --rounds) rounds=$2; shift ;;
    --build) build=$(absolute "$2"); shift ;;
    --device) device=$2; shift ;;
    --steps) steps=$2; shift ;;
    --shapes) shapes=$2; shift ;;
    --precisions) precisions=$2; shift ;;
    --threads) threads=$2; shift ;;
    --set) sets+=("$2"); shift ;;
    --out) out=$(absolute "$2"); shift ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, not '$rounds'"
[[ -z $steps || $steps =~ ^[1-9][0-9]*$ ]] || die "--steps must be a positive integer, not '$steps'"
[[ -z $threads || $threads =~ ^[1-9][0-9]*$ ]] ||
  die "--threads must be a positive integer, not '$threads'"
case "$device" in
  cpu) shapes=${shapes:-tiny,small}; precisions=${precisions:-fp32,bf16} ;;
  cuda) shapes=${shapes:-base}; precisions=${precisions:-bf16} ;;
  *) die "--device must be cpu or cuda, not '$device'" ;;
esac
IFS=, read -r -a shape_list <<<"$shapes"
IFS=, read -r -a precision_list <<<"$precisions"
for p in "${precision_list[@]}"; do
  case "$p" in fp32 | bf16) ;; *) die "unknown precision '$p': fp32 or bf16" ;; esac
done

# The benchmark shapes: config, xlme overrides, timed steps, the peer's warm-up micro-batches.
shape_config() {  # shape_config SHAPE: sets config, shape_sets, shape_steps, warmup
  case "$1" in
    tiny) config=configs/pretrain/benchmark/cpu_tiny.yaml shape_sets=() shape_steps=40 warmup=2 ;;
    small) config=configs/pretrain/benchmark/cpu_small.yaml shape_sets=() shape_steps=8 warmup=2 ;;
    base)
      # As scripts/gpu_check.sh's bench_base_sdpa: 4 micro-batches of 32 x 512 per task and step.
      config=configs/pretrain/base.yaml shape_steps=10 warmup=3
      shape_sets=(model.attention=sdpa train.tokens_per_task=65536) ;;
    *) die "unknown shape '$1': tiny, small (CPU) or base (GPU)" ;;
  esac
}
for s in "${shape_list[@]}"; do shape_config "$s"; done

xlme=$build/xlme-pretrain
[ -x "$xlme" ] || die "$xlme not found: build xlme first (scripts/setup.sh), or pass --build DIR"
# The Python xlme was built with (its XLME_PYTHON), unless the environment names one.
built_with=$(sed -n 's/^XLME_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
python=${XLME_PYTHON:-${built_with:-$root/.venv/bin/python3}}
if [[ $python != */* ]]; then
  python=$(command -v "$python") || die "XLME_PYTHON=$python: no such command"
fi
[ -x "$python" ] || die "no Python at $python: run scripts/setup.sh (it makes .venv from" \
  "requirements.txt), or set XLME_PYTHON to a Python with torch and transformers"
torch_cmake=$("$python" -c 'import torch, transformers, yaml
print(torch.utils.cmake_prefix_path)') ||
  die "$python cannot import torch, transformers and yaml: run scripts/setup.sh (requirements.txt)"
# The same torch on both sides: the Torch_DIR xlme was configured with lies in this Python's torch.
torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
if [ -n "$torch_dir" ] &&
  [ "$(realpath -m "$torch_dir")" != "$(realpath -m "$torch_cmake/Torch")" ]; then
  die "xlme in $build was built against $torch_dir, but $python's torch is $torch_cmake/Torch:" \
    "unset XLME_PYTHON, or rebuild xlme with -DXLME_PYTHON=$python"
fi

if [ -n "$out" ]; then mkdir -p "$out"; else out=$(mktemp -d /tmp/xlme-compare-peer.XXXXXX); fi
runs=$out/runs.jsonl
: >"$runs"
: >"$out/notes.txt"
helper=$out/compare_peer_helper.py
cat >"$helper" <<'PY'
"""compare_peer.sh's bookkeeping: peer-args CONFIG_YAML NOTES, record ..., table RUNS NOTES."""
import json, math, re, statistics, sys


def peer_args(config_path, notes_path):
    """The peer's shape options for xlme's resolved config; what it cannot mirror, into NOTES."""
    import yaml
    with open(config_path) as f:
        c = yaml.safe_load(f)
    m, g, t, o = c["model"], c["model"]["generator"], c["train"], c["objectives"]
    seq = c["data"]["mono"]["max_len"]
    args = {"--hidden": m["hidden_size"], "--disc-layers": m["layers"], "--heads": m["heads"],
            "--ffn": m["ffn_size"], "--gen-layers": g["layers"], "--gen-hidden": g["hidden_size"],
            "--gen-heads": g["heads"], "--gen-ffn": g["ffn_size"],
            "--embedding-size": m["embedding_size"], "--vocab": m["vocab_size"], "--seq": seq,
            "--max-position": max(m["max_positions"], seq),
            "--batch": t["micro_batch_tokens"] // seq, "--mask-prob": o["mask_ratio"],
            "--lambda": o["rtd_weight"], "--dropout": m["dropout"],
            "--attention-dropout": m["attention_dropout"], "--clip": t["clip_norm"]}
    notes = []
    bias = m["relative_position"]
    if bias["enabled"]:
        notes.append(f"xlme's attention adds the {'gated ' if bias['gated'] else ''}relative "
                     "position bias (model.relative_position), which HuggingFace's ELECTRA does "
                     "not have")
    if o["set"] == "xlme":
        notes.append("xlme's base step runs MRTD and TRTD (objectives.set=xlme), the peer MRTD's "
                     "work only; both count tokens/s over every micro-batch")
    elif o["set"] != "xlme-mono":
        sys.exit(f"objectives.set={o['set']}: the peer is ELECTRA's MLM + RTD step only")
    for key, plain in (("norm", "post"), ("share_layers", "none"), ("embedding_sharing", "full"),
                       ("absolute_positions", True), ("cross_attention", False)):
        if m[key] != plain:
            notes.append(f"model.{key}={m[key]} is xlme's only (the peer: {plain})")
    with open(notes_path) as f:
        known = f.read().splitlines()
    with open(notes_path, "a") as f:
        f.writelines(n + "\n" for n in notes if n not in known)
    print(" ".join(f"{k} {v}" for k, v in args.items()))


def steal_fraction(before, after):
    a, b = ([int(x) for x in s.split()[1:9]] for s in (before, after))
    total = sum(b) - sum(a)
    return (b[7] - a[7]) / total if total > 0 and len(a) > 7 else None


def record(runs, round_, shape, precision, side, rc, stdout, stderr, stat_before, stat_after):
    """Appends one run's line to RUNS: tokens/s, or null and why it failed."""
    rc = int(rc)
    result, reason = None, None
    for line in reversed(open(stdout, errors="replace").read().splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except ValueError:
                pass
            break
    tokens = result.get("tokens_per_s") if isinstance(result, dict) else None
    ran = str(result.get("precision", "")) if isinstance(result, dict) else ""
    if rc != 0:
        lines = [l for l in open(stderr, errors="replace").read().splitlines() if l.strip()]
        # The last line, without colours and xlme's "[hh:mm:ss] " prefix.
        last = re.sub(r"\x1b\[[0-9;]*m|^\[[0-9:]+\] ", "", lines[-1]) if lines else "no output"
        reason = f"exit {rc}: {last}"
    elif not isinstance(tokens, (int, float)) or not math.isfinite(tokens) or tokens <= 0:
        reason = "no tokens_per_s in a JSON line on stdout"
    elif not ran.startswith(precision):
        reason = f"ran {ran}, not {precision}"
    line = {"round": int(round_), "shape": shape, "precision": precision, "side": side,
            "tokens_per_s": None if reason else tokens, "failed": reason,
            "steal_frac": steal_fraction(stat_before, stat_after), "stdout": stdout,
            "stderr": stderr, "result": result}
    with open(runs, "a") as f:
        f.write(json.dumps(line) + "\n")
    steal = line["steal_frac"]
    print(f"round {round_} {shape} {precision} {side}: "
          + (f"(failed: {reason})" if reason else f"{tokens:,.0f} tokens/s")
          + (f", steal {steal:.3f}" if steal is not None else ""), file=sys.stderr)


def table(runs_path, notes_path):
    rows = [json.loads(l) for l in open(runs_path) if l.strip()]
    keys = list(dict.fromkeys((r["shape"], r["precision"]) for r in rows))
    peer = next((r["result"] for r in rows if r["side"] == "peer" and r["tokens_per_s"]), None)
    rounds = max(r["round"] for r in rows)
    if peer:
        machine = peer["cpu_model"] if peer.get("device") == "cpu" else peer.get("device")
        print(f"{machine}, torch {peer.get('torch')}, "
              f"transformers {peer.get('transformers')}, threads {peer.get('threads')}, "
              f"{rounds} round(s); tokens/s, medians over the rounds:\n")
    print("| shape | precision | xlme tok/s | peer tok/s | xlme / peer | per round (xlme / peer) "
          "| max steal |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    failed = False
    for shape, precision in keys:
        group = [r for r in rows if (r["shape"], r["precision"]) == (shape, precision)]
        cells, medians = [], []
        for side in ("xlme", "peer"):
            mine = [r for r in group if r["side"] == side]
            good = [r["tokens_per_s"] for r in mine if r["tokens_per_s"]]
            bad = [r["failed"] for r in mine if r["failed"]]
            failed = failed or bool(bad)
            median = statistics.median(good) if good else None
            medians.append(median)
            reason = bad[0].replace("|", "/")[:160] if bad else ""
            if not good:
                cells.append(f"(failed: {reason})")
            elif bad:
                cells.append(f"{median:,.0f} ({len(bad)} of {len(mine)} failed: {reason})")
            else:
                cells.append(f"{median:,.0f}")
        x, p = medians
        ratio = f"{x / p:.2f}×" if x and p else "—"
        per_round = []
        for n in range(1, rounds + 1):
            pair = {r["side"]: r["tokens_per_s"] for r in group if r["round"] == n}
            if pair.get("xlme") and pair.get("peer"):
                per_round.append(f"{pair['xlme'] / pair['peer']:.2f}×")
        steals = [r["steal_frac"] for r in group if r["steal_frac"] is not None]
        steal = f"{max(steals):.3f}" if steals else "—"
        name = f"cpu_{shape}" if shape in ("tiny", "small") else shape
        print(f"| `{name}` | {precision} | {cells[0]} | {cells[1]} | {ratio} | "
              f"{', '.join(per_round) or '—'} | {steal} |")
    notes = open(notes_path).read().split("\n")
    for note in filter(None, notes):
        print(f"\n- {note}", end="")
    print()
    return 1 if failed else 0


if __name__ == "__main__":
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "peer-args":
        peer_args(*rest)
    elif command == "record":
        record(*rest)
    else:
        sys.exit(table(*rest))
PY

# The peer's shape options per shape, from xlme's resolved config.
declare -A peer_shape
for s in "${shape_list[@]}"; do
  shape_config "$s"
  all_sets=(--set "run.device=$device")
  for kv in "${shape_sets[@]}" "${sets[@]}"; do all_sets+=(--set "$kv"); done
  "$xlme" --config "$root/$config" "${all_sets[@]}" --print-config >"$out/$s.config.yaml" \
    2>"$out/$s.config.err" || die "$xlme --config $config --print-config failed:" \
    "$(tail -3 "$out/$s.config.err")"
  peer_shape[$s]=$("$python" "$helper" peer-args "$out/$s.config.yaml" "$out/notes.txt") ||
    die "no peer shapes for $s (above)"
done

run_side() {  # run_side ROUND SHAPE PRECISION SIDE
  local round=$1 shape=$2 precision=$3 side=$4 command=() rc=0 before after
  local log=$out/r$1-$2-$3-$4
  shape_config "$shape"
  if [ "$side" = xlme ]; then
    command=("$xlme" --config "$root/$config" --benchmark "${steps:-$shape_steps}"
      --set "train.precision=$precision" --set "run.device=$device"
      --set "run.out_dir=$out/xlme-run")
    for kv in "${shape_sets[@]}" "${sets[@]}"; do command+=(--set "$kv"); done
  else
    # shellcheck disable=SC2206  # the shape options are words without spaces
    command=("$python" "$root/scripts/peer_hf_electra.py" --device "$device" ${peer_shape[$shape]}
      --steps "${steps:-$shape_steps}" --warmup-steps "$warmup" --xlme-masking)
    if [ "$precision" = fp32 ]; then command+=(--fp32); fi
  fi
  if [ -n "$threads" ]; then command+=(--threads "$threads"); fi
  printf '%q ' "${command[@]}" >"$log.cmd"
  before=$(head -1 /proc/stat)
  (cd "$root" && "${command[@]}") >"$log.out" 2>"$log.err" || rc=$?
  after=$(head -1 /proc/stat)
  "$python" "$helper" record "$runs" "$round" "$shape" "$precision" "$side" "$rc" "$log.out" \
    "$log.err" "$before" "$after"
}

echo "compare_peer.sh: $rounds round(s) on $device, logs in $out" >&2
for ((round = 1; round <= rounds; round++)); do
  for s in "${shape_list[@]}"; do
    for p in "${precision_list[@]}"; do
      if ((round % 2)); then order=(xlme peer); else order=(peer xlme); fi
      for side in "${order[@]}"; do run_side "$round" "$s" "$p" "$side"; done
    done
  done
done
status=0
"$python" "$helper" table "$runs" "$out/notes.txt" || status=$?
echo "runs: $runs" >&2
exit "$status"
