#!/usr/bin/env bash
# The paper's ablation directions (XLM-E Table 2, ../shared/PAPER.md) at CPU scale: pre-trains
# xlme (MLM+TLM+MRTD+TRTD), xlme-mono (MLM+MRTD, no TRTD), mlm+tlm (XLM) and mlm (XLM-R-style) on
# the demo corpus at equal tokens, for several seeds, then for each model
#   - held-out retrieval on the demo's test pairs at every layer (configs/finetune/demo_retrieval.yaml),
#   - the silver English POS task (configs/finetune/demo_silver_udpos.yaml, one fine-tuning seed
#     per pre-training seed),
# and writes OUT/table.md (means and spreads over seeds, FLOPs of each set, the untrained floor)
# and OUT/ablation.png (validation curves against tokens, retrieval per layer, POS) through
# scripts/ablation_table.py.
#
#   scripts/ablation_cpu.sh [--steps N] [--seeds "1 2 3"] [--sets "xlme xlme-mono mlm+tlm mlm"]
#                           [--out runs/ablation] [--config configs/pretrain/demo.yaml]
#                           [--set KEY=VALUE]...
#
# Equal tokens: the sets that read translation pairs take train.tokens_per_task of each task a
# step; the monolingual-only sets (xlme-mono, mlm) take twice train.tokens_per_task of MRTD, so
# that every set reads the same tokens a step for the same steps and schedule. Needs the demo
# data (scripts/quickstart.sh makes data/demo) and the silver task (scripts/silver_udpos.sh).
# A second run reuses every finished model, export and evaluation.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${XLME_BUILD_DIR:-$root/build}
python=${XLME_VENV:-$root/.venv}/bin/python3
steps=2000
seeds="1 2 3"
sets="xlme xlme-mono mlm+tlm mlm"
out=runs/ablation
config=configs/pretrain/demo.yaml
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift ;;
    --seeds) seeds=$2; shift ;;
    --sets) sets=$2; shift ;;
    --out) out=$2; shift ;;
    --config) config=$2; shift ;;
    --set) extra+=(--set "$2"); shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "ablation_cpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
cd "$root"
for need in data/demo/spm.model data/silver_udpos/download/udpos/train-en.tsv; do
  [ -e "$need" ] || { echo "ablation_cpu.sh: $need is missing: run scripts/quickstart.sh and scripts/silver_udpos.sh first" >&2; exit 1; }
done
tokens=$("$build/xlme-pretrain" --config "$config" "${extra[@]}" --print-config |
         sed -n 's/^  tokens_per_task: \([0-9]*\).*/\1/p' | head -1)
[ -n "$tokens" ] || { echo "ablation_cpu.sh: cannot read train.tokens_per_task of $config" >&2; exit 1; }
mkdir -p "$out"
start=$SECONDS
for set in $sets; do
  per_task=$tokens
  case "$set" in xlme-mono|mlm) per_task=$((2 * tokens)) ;; esac
  for seed in $seeds; do
    run=$out/$set/seed$seed
    mkdir -p "$out/$set"
    echo "==> $set, seed $seed: pre-training $steps steps ($per_task MRTD tokens a step$([ "$per_task" = "$tokens" ] && echo " + $tokens TRTD"))"
    "$build/xlme-pretrain" --config "$config" "${extra[@]}" --set objectives.set="$set" \
      --set run.seed="$seed" --set run.out_dir="$run" --set train.steps="$steps" \
      --set train.tokens_per_task="$per_task" --set train.save_every="$steps" --set train.keep_last=1 \
      >"$run.pretrain.log" 2>&1 || { tail -20 "$run.pretrain.log" >&2; exit 1; }
    if [ ! -f "$run/export/config.json" ] || [ "$run/checkpoints" -nt "$run/export/config.json" ]; then
      "$build/xlme-export" --checkpoint "$run" --out "$run/export" --force >"$run.export.log" 2>&1 ||
        { tail -20 "$run.export.log" >&2; exit 1; }
    fi
    if [ ! -f "$run/retrieval/results.json" ]; then
      "$build/xlme-finetune" --config configs/finetune/demo_retrieval.yaml \
        --set finetune.init="$run/export" --set run.out_dir="$run/retrieval" \
        --set finetune.compare_untrained=false >"$run.retrieval.log" 2>&1 ||
        { tail -20 "$run.retrieval.log" >&2; exit 1; }
    fi
    if [ ! -f "$run/pos/results.json" ]; then
      "$build/xlme-finetune" --config configs/finetune/demo_silver_udpos.yaml \
        --set finetune.init="$run/export" --set run.out_dir="$run/pos" \
        --set "finetune.seeds=[$seed]" >"$run.pos.log" 2>&1 ||
        { tail -20 "$run.pos.log" >&2; exit 1; }
    fi
  done
done
# The untrained floor, once: the same architecture with random weights.
first=$(echo "$sets" | cut -d' ' -f1)
first_seed=$(echo "$seeds" | cut -d' ' -f1)
floor=$out/untrained
if [ ! -f "$floor/retrieval/results.json" ]; then
  "$build/xlme-finetune" --config configs/finetune/demo_retrieval.yaml \
    --set finetune.init="$out/$first/seed$first_seed/export" --set finetune.untrained=true \
    --set finetune.compare_untrained=false --set run.out_dir="$floor/retrieval" \
    >"$floor.retrieval.log" 2>&1 || { tail -20 "$floor.retrieval.log" >&2; exit 1; }
fi
if [ ! -f "$floor/pos/results.json" ]; then
  "$build/xlme-finetune" --config configs/finetune/demo_silver_udpos.yaml \
    --set finetune.init="$out/$first/seed$first_seed/export" --set finetune.untrained=true \
    --set "finetune.seeds=[$(echo "$seeds" | tr ' ' ',')]" --set run.out_dir="$floor/pos" \
    >"$floor.pos.log" 2>&1 || { tail -20 "$floor.pos.log" >&2; exit 1; }
fi
"$python" scripts/ablation_table.py "$out" --sets $sets --seeds $seeds
echo "==> ablation done in $(( SECONDS - start )) s: $out/table.md, $out/ablation.png"
