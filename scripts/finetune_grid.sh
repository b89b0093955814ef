#!/usr/bin/env bash
# Runs a fine-tuning config's hyper-parameter grid and keeps the best dev score.
#
#   scripts/finetune_grid.sh CONFIG OUT_DIR [xlme-finetune arguments, e.g. --set finetune.init=runs/base]
#
# Every line of CONFIG that starts with `# grid:` is one point: space-separated key=value overrides
# (e.g. `# grid: finetune.lr=6.0e-6 finetune.epochs=5`). Point N runs
#   xlme-finetune --config CONFIG [arguments] --set <the point's overrides> --set run.out_dir=OUT_DIR/pointN
# and its score is the train-language dev score its results.json records (`selection[].dev`, the
# mean over finetune.seeds). OUT_DIR/grid.json lists every point with its score and folder, and
# names the best (the first of equal scores); the best point's folder holds its predictions.
# XLME_FINETUNE names the binary (default: build/xlme-finetune beside this script's checkout).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
config=$1
out=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
finetune=${XLME_FINETUNE:-$root/build/xlme-finetune}
python=${PYTHON:-python3}

[[ -f $config ]] || { echo "finetune_grid: config $config not found" >&2; exit 1; }
[[ -x $finetune ]] || {
  echo "finetune_grid: $finetune is not an executable; build xlme-finetune or set XLME_FINETUNE" >&2
  exit 1
}
mapfile -t points < <(sed -n 's/^# grid:[[:space:]]*//p' "$config")
if [[ ${#points[@]} -eq 0 ]]; then
  echo "finetune_grid: $config has no '# grid:' lines; add one per point, e.g." \
    "'# grid: finetune.lr=5.0e-6'" >&2
  exit 1
fi

mkdir -p "$out"
for i in "${!points[@]}"; do
  n=$((i + 1))
  sets=()
  read -ra overrides <<<"${points[$i]}"  # split on spaces, no glob expansion ([1,2] stays)
  for override in "${overrides[@]}"; do
    [[ $override == *=* ]] || {
      echo "finetune_grid: $config: grid point $n '${points[$i]}': '$override' is not key=value" >&2
      exit 1
    }
    sets+=(--set "$override")
  done
  echo "finetune_grid: point $n/${#points[@]}: ${points[$i]} -> $out/point$n" >&2
  if ! "$finetune" --config "$config" "$@" "${sets[@]}" --set "run.out_dir=$out/point$n"; then
    echo "finetune_grid: point $n (${points[$i]}) failed; see its output above" >&2
    exit 1
  fi
done

"$python" - "$config" "$out" "${points[@]}" <<'EOF'
import json, math, os, sys

config, out, points = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
for n, point in enumerate(points, 1):
    folder = os.path.join(out, f"point{n}")
    path = os.path.join(folder, "results.json")
    with open(path) as f:
        results = json.load(f)
    language = results.get("train_language", "en")
    devs = [s.get("dev") for s in results.get("selection", [])]
    scored = language in results.get("dev", {}).get("languages", {})
    if not scored or not devs or any(d is None or not math.isfinite(d) for d in devs):
        sys.exit(f"finetune_grid: {path} records no {language} dev score for "
                 f"{results.get('task')}; the grid selects on it: add that dev set under "
                 "finetune.data_dir")
    rows.append({"point": point, "dir": folder, "dev": sum(devs) / len(devs),
                 "test_average": results.get("test", {}).get("average", {}).get("mean")})
best = max(rows, key=lambda r: r["dev"])  # max keeps the first of equal scores
summary = {"config": config, "task": results.get("task"), "dev_metric": results.get("dev", {}).get("main"),
           "points": rows, "best": best}
with open(os.path.join(out, "grid.json"), "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
for r in rows:
    mark = "*" if r is best else " "
    print(f"{mark} dev {r['dev']:.4f}  {r['point']}  ({r['dir']})")
print(f"best: {best['point']} (dev {best['dev']:.4f}); {os.path.join(out, 'grid.json')}")
EOF
