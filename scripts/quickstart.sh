#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install and build, build the offline demo corpus
# from Debian's translation catalogs, train a SentencePiece model, binarize, pre-train the tiny
# XLM-E of configs/pretrain/demo.yaml on the CPU, and plot its curves (about 12 minutes on 2
# cores). A second run reuses every finished stage. Export and the retrieval evaluation of the
# trained vs the untrained model are not built yet (README.md, "Status").
#
#   scripts/quickstart.sh
#
# Environment: XLME_BUILD_DIR (default: build). Outputs: data/demo/ (corpus, tokenizer, shards),
# runs/demo/ (logs, metrics.jsonl, checkpoints, plots/), runs/quickstart/*.log (one per stage).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${XLME_BUILD_DIR:-build}
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
export XLME_BUILD_DIR="$build_dir"
cd "$root"

config=configs/pretrain/demo.yaml
data=data/demo
logs=runs/quickstart
mkdir -p "$logs"

# stage NAME LOG COMMAND...: runs COMMAND with its output in LOG (and on the screen); on failure
# names the stage and the log.
stage() {
  local name=$1 log=$2
  shift 2
  echo "==> $name"
  local start=$SECONDS
  if ! "$@" 2>&1 | tee "$log"; then
    echo "quickstart: stage '$name' failed; its output is in $log" >&2
    exit 1
  fi
  echo "    ($name: $((SECONDS - start)) s)"
}

stage "1/6 install and build" "$logs/1-setup.log" scripts/setup.sh

if [ -f "$data/counts.tsv" ]; then
  echo "==> 2/6 demo corpus: $data exists, reused"
else
  stage "2/6 demo corpus (Debian's translation catalogs and man pages)" "$logs/2-corpus.log" \
    scripts/prepare_demo_corpus.sh "$data"
fi

if [ -f "$data/spm.model" ]; then
  echo "==> 3/6 tokenizer: $data/spm.model exists, reused"
else
  stage "3/6 SentencePiece tokenizer" "$logs/3-tokenizer.log" \
    "$build_dir/xlme-data" train-spm --config "$config" --input "$data" --out "$data/spm.model"
fi

# binarize itself skips shards that are up to date and resumes interrupted ones.
stage "4/6 binarize into memory-mapped shards" "$logs/4-binarize.log" \
  "$build_dir/xlme-data" binarize --config "$config" --input "$data"

# --resume auto (the default) continues an interrupted run and finishes at once a finished one.
stage "5/6 pre-train (MRTD + TRTD, tiny model, CPU)" "$logs/5-pretrain.log" \
  "$build_dir/xlme-pretrain" --config "$config"

stage "6/6 loss curves" "$logs/6-plots.log" /usr/bin/python3 scripts/plot_metrics.py runs/demo

first=$(head -n 1 runs/demo/metrics.jsonl)
last=$(tail -n 1 runs/demo/metrics.jsonl)
/usr/bin/python3 - "$first" "$last" "$data" <<'PY'
import json, sys, os
first, last, data = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
shards = os.path.join(data, "shards")
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(shards) for f in fs)
print()
print(f"data: {data} ({size / 1e6:.0f} MB of shards)")
print(f"steps: {last['step']}, tokens seen: {last.get('tokens_seen', 0):,}, "
      f"last tokens/s: {last.get('tokens_per_s', 0):,.0f}")
print(f"{'':18}{'step ' + str(first['step']):>12}{'step ' + str(last['step']):>12}")
for key in ("loss/mlm", "loss/tlm", "loss/mrtd", "loss/trtd", "accuracy/mlm", "accuracy/tlm",
            "f1/mrtd", "f1/trtd"):
    if key in first and key in last:
        print(f"{key:18}{first[key]:12.4f}{last[key]:12.4f}")
print()
print("curves: runs/demo/plots/*.png; checkpoints: runs/demo/checkpoints/")
print("These are training-batch figures of a ~10M-token CPU run: far too few tokens for")
print("cross-lingual transfer to appear (README.md, \"Pre-training\").")
PY
