#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install and build, build the offline demo corpus
# from Debian's translation catalogs, train a SentencePiece model, binarize, pre-train the tiny
# XLM-E of configs/pretrain/demo.yaml on the CPU, export it, evaluate retrieval on the held-out
# test pairs and fine-tune a silver English POS task for the trained and the untrained model, and
# plot the curves (about 15 minutes on 2 cores after the build). A second run reuses every
# finished stage.
#
#   scripts/quickstart.sh
#
# Environment: XLME_BUILD_DIR (default: build). Outputs: data/demo/ (corpus, tokenizer, shards),
# runs/demo/ (logs, metrics.jsonl, checkpoints, plots/), runs/demo/export/ (the portable model),
# runs/demo/retrieval/results.json, runs/demo/pos*/results.json, data/silver_udpos/,
# runs/quickstart/*.log (one per stage).
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

stage "1/10 install and build" "$logs/1-setup.log" scripts/setup.sh --binaries
python=${XLME_VENV:-$root/.venv}/bin/python3  # made by setup.sh: matplotlib for the curves

if [ -f "$data/counts.tsv" ]; then
  echo "==> 2/10 demo corpus: $data exists, reused"
else
  stage "2/10 demo corpus (Debian's translation catalogs and man pages)" "$logs/2-corpus.log" \
    scripts/prepare_demo_corpus.sh "$data"
fi

if [ -f "$data/spm.model" ]; then
  echo "==> 3/10 tokenizer: $data/spm.model exists, reused"
else
  stage "3/10 SentencePiece tokenizer" "$logs/3-tokenizer.log" \
    "$build_dir/xlme-data" train-spm --config "$config" --input "$data" --out "$data/spm.model"
fi

# binarize itself skips shards that are up to date and resumes interrupted ones.
stage "4/10 binarize into memory-mapped shards" "$logs/4-binarize.log" \
  "$build_dir/xlme-data" binarize --config "$config" --input "$data"

# --resume auto (the default) continues an interrupted run and finishes at once a finished one.
stage "5/10 pre-train (MRTD + TRTD, tiny model, CPU)" "$logs/5-pretrain.log" \
  "$build_dir/xlme-pretrain" --config "$config"

# The run's newest valid checkpoint (xlme-export picks it from the run folder, as finetune.init
# does), exported unless the export is newer than every checkpoint.
if [ ! -d runs/demo/checkpoints ]; then
  echo "quickstart: pre-training left no checkpoint in runs/demo/checkpoints; see $logs/5-pretrain.log" >&2
  exit 1
fi
if [ runs/demo/export/config.json -nt runs/demo/checkpoints ]; then
  echo "==> 6/10 export: runs/demo/export is newer than the run's checkpoints, reused"
else
  stage "6/10 export the newest valid checkpoint (safetensors + config + tokenizer)" \
    "$logs/6-export.log" "$build_dir/xlme-export" --checkpoint runs/demo --out runs/demo/export --force
fi

if [ runs/demo/retrieval/results.json -nt runs/demo/export/config.json ]; then
  echo "==> 7/10 retrieval: runs/demo/retrieval/results.json is newer than the export, reused"
else
  stage "7/10 retrieval on held-out test pairs, trained vs untrained" "$logs/7-retrieval.log" \
    "$build_dir/xlme-finetune" --config configs/finetune/demo_retrieval.yaml \
    --set finetune.init=runs/demo/export --set run.out_dir=runs/demo/retrieval
fi

if [ -f data/silver_udpos/download/udpos/test-en.tsv ]; then
  echo "==> 8/10 silver POS task: data/silver_udpos exists, reused"
else
  stage "8/10 silver English POS task from the demo corpus (a tagger's tags)" "$logs/8-silver-pos.log" \
    scripts/silver_udpos.sh "$data" data/silver_udpos
fi

# Fine-tuning on the silver POS task, 3 seeds, the pre-trained model and the same architecture with
# random weights side by side (one thread each): where pre-training helps even at this size.
pos() {
  "$build_dir/xlme-finetune" --config configs/finetune/demo_silver_udpos.yaml --set run.threads=1 \
    --set finetune.init=runs/demo/export "$@"
}
pos_both() {
  pos --set run.out_dir=runs/demo/pos >"$logs/9-pos-trained.log" 2>&1 &
  local trained=$! failed=""
  pos --set run.out_dir=runs/demo/pos-untrained --set finetune.untrained=true \
    >"$logs/9-pos-untrained.log" 2>&1 || failed="$logs/9-pos-untrained.log"
  wait "$trained" || failed="$logs/9-pos-trained.log $failed"
  if [ -n "$failed" ]; then
    echo "fine-tuning failed; see $failed" >&2
    return 1
  fi
  grep -h -A2 "^test f1" "$logs/9-pos-trained.log" "$logs/9-pos-untrained.log"
}
if [ runs/demo/pos/results.json -nt runs/demo/export/config.json ] &&
  [ runs/demo/pos-untrained/results.json -nt runs/demo/export/config.json ]; then
  echo "==> 9/10 silver POS: runs/demo/pos*/results.json are newer than the export, reused"
else
  stage "9/10 silver POS fine-tuning, trained vs untrained, 3 seeds each" "$logs/9-pos.log" pos_both
fi

stage "10/10 loss curves" "$logs/10-plots.log" "$python" scripts/plot_metrics.py runs/demo

"$python" scripts/demo_summary.py runs/demo "$data"
