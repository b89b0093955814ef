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
# names the best (the first of equal scores); the best point's folder holds its predictions. A task
# without a train-language dev set (TyDiQA-GoldP in XTREME) is run as XTREME's scripts run it: every
# point keeps its final weights, grid.json lists each point's test average, and none is selected
# ("best": null). Each point's test average is shown with the languages it covers ("over 2 of 33
# languages"; grid.json: test_covers, test_lacks). Scores of sets cut by finetune.max_eval_examples
# are flagged ("subset" in grid.json, "[subset]" on the console); points scored on subsets and on
# full sets are not compared: that is an error.
# XLME_FINETUNE names the binary (default: build/xlme-finetune beside this script's checkout).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
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
    dev = None
    if scored and devs and all(d is not None and math.isfinite(d) for d in devs):
        dev = sum(devs) / len(devs)
    average = results.get("test", {}).get("average", {})
    # The sets finetune.max_eval_examples cut, per split: "dev en 300 of 2077 sentences".
    cuts = [f"{split} {lang} {c['scored']} of {c['of']} {c['unit']}s"
            for split in ("dev", "test")
            for lang, c in results.get(split, {}).get("subset", {}).get("languages", {}).items()]
    rows.append({"point": point, "dir": folder, "dev": dev, "path": path,
                 "test_average": average.get("mean"),
                 "test_covers": average.get("covers"), "test_lacks": average.get("lacks"),
                 "test_of": average.get("of"), "subset": cuts or None})
task = results.get("task")
cut = [r for r in rows if r["subset"]]
if cut and len(cut) < len(rows):
    whole = next(r for r in rows if not r["subset"])
    sys.exit(f"finetune_grid: {cut[0]['path']} scores subsets (finetune.max_eval_examples: "
             f"{'; '.join(cut[0]['subset'])}) but {whole['path']} full sets; their scores are "
             "not comparable: run every point with the same finetune.max_eval_examples")
without = [r for r in rows if r["dev"] is None]
if without and len(without) < len(rows):
    sys.exit(f"finetune_grid: {without[0]['path']} records no {language} dev score for {task} "
             "while other points do; the grid selects on it: add that dev set under "
             "finetune.data_dir")
summary = {"config": config, "task": task, "dev_metric": results.get("dev", {}).get("main"),
           "points": [{k: v for k, v in r.items() if k != "path"} for r in rows]}
if without:
    # XTREME's way for a task without a dev set (TyDiQA-GoldP): every point keeps its final
    # weights and none is selected; picking one by its test scores would select on test.
    summary["best"] = None
    summary["selection"] = (f"none: {task} has no {language} dev set; as XTREME's scripts, each "
                            "point keeps its final weights and no point is selected")
else:
    best = max(rows, key=lambda r: r["dev"])  # max keeps the first of equal scores
    summary["best"] = summary["points"][rows.index(best)]
with open(os.path.join(out, "grid.json"), "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
def coverage(r):
    if r["test_average"] is None:
        return "no test score"
    over = f"test average {r['test_average']:.4f}"
    if r["test_covers"] is not None and r["test_of"] is not None:
        over += f" over {len(r['test_covers'])} of {r['test_of']} languages"
    return over + (" [subset]" if r["subset"] else "")
for r in rows:
    if without:
        print(f"  {coverage(r)}  {r['point']}  ({r['dir']})")
    else:
        mark = "*" if r is best else " "
        print(f"{mark} dev {r['dev']:.4f}{' [subset]' if r['subset'] else ''}  {r['point']}  "
              f"({r['dir']}; {coverage(r)})")
if cut:
    print("finetune_grid: every score is on subsets (finetune.max_eval_examples: "
          f"{'; '.join(cut[0]['subset'])}), not comparable to full-set scores")
if without:
    print(f"no point selected: {summary['selection']}; {os.path.join(out, 'grid.json')}")
else:
    print(f"best: {best['point']} (dev {best['dev']:.4f}); {os.path.join(out, 'grid.json')}")
EOF
