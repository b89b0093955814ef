#!/usr/bin/env bash
# A GPU pre-training run in one device call (docs/gpu.md#the-demo-on-a-gpu): the `small`
# model pre-trained on the demo corpus on one GPU with XLM-E's objectives and, at the same time on
# the same GPU, with MLM alone (XLM-R's objective, the baseline of the paper's Table 2) for the
# same steps and tokens per step; each exported and evaluated on the held-out test pairs'
# retrieval at every layer, trained against untrained.
#
#   scripts/gpu_demo.sh --prepare [DATA]   here, after the quickstart's corpus (DATA, default
#                                          data/demo): packs what the runs read (tokenizer,
#                                          shards, held-out pairs) into the git-ignored .gpudemo/
#   scripts/gpu_demo.sh OUT_DIR            on the GPU machine, carrying .gpudemo and
#                                          .gpubundle (scripts/gpu_bundle.sh; else .gpudeps/root
#                                          and .gpudeps/MANIFEST, and it builds): the binaries
#                                          through scripts/gpu_check.sh,
#                                          trains both until the budget's end, exports, evaluates;
#                                          OUT_DIR/gpu_demo.json and 4 logs
#
# A later call on the same (warm) machine resumes both runs (--resume auto) and evaluates again,
# so that calls can be chained towards XLME_GPU_DEMO_STEPS.
#
# Environment: XLME_GPU_DEMO_BUDGET_S (default 560: the whole call), XLME_GPU_DEMO_EVAL_S (default
# 100: kept for export and evaluation), XLME_GPU_DEMO_STEPS (default 30000: the target both runs
# train towards, as configs/pretrain/demo_small_gpu.yaml), XLME_GPU_DEMO_BUILD (a build folder
# whose binaries to use instead of building), XLME_GPU_CHECK_ALLOW_CPU=1 (no GPU: the tiny model
# for a few steps on the CPU, for checking this script).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
demo=$root/.gpudemo

prepare() {
  local data=${1:-$root/data/demo}
  for f in spm.model shards/mono shards/para heldout/test heldout/dev; do
    [ -e "$data/$f" ] || { echo "gpu_demo.sh --prepare: no $data/$f: run scripts/quickstart.sh first" >&2; exit 1; }
  done
  rm -rf "$demo"
  mkdir -p "$demo"
  cp "$data/spm.model" "$demo/"
  # xz: 159 MB of shards become 36, under the device tool's 64 MiB with .gpudeps/root.
  tar -C "$data" -cf - shards heldout | xz -6 -T0 >"$demo/data.tar.xz"
  echo "==> $demo: $(du -sh "$demo" | cut -f1); carry .gpudeps/root, .gpudeps/MANIFEST and .gpudemo"
}

case "${1:-}" in
  --prepare) prepare "${2:-}"; exit 0 ;;
  -h | --help | "") sed -n '2,24p' "$0"; exit 0 ;;
esac
out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu_demo.sh: cannot create $1" >&2; exit 2; }
[ -f "$demo/data.tar.xz" ] || { echo "gpu_demo.sh: no $demo: run --prepare here and carry .gpudemo" >&2; exit 2; }
if [ ! -d "$demo/shards" ]; then
  tar -C "$demo" -xJf "$demo/data.tar.xz" || { echo "gpu_demo.sh: cannot unpack $demo/data.tar.xz" >&2; exit 2; }
fi

start=$(date +%s)
budget=${XLME_GPU_DEMO_BUDGET_S:-560}
eval_s=${XLME_GPU_DEMO_EVAL_S:-100}
cpu_mode=${XLME_GPU_CHECK_ALLOW_CPU:-0}
left() { echo $((budget - ($(date +%s) - start))); }

# 1. The binaries, through gpu_check.sh (its logs into a scratch folder: 8 files come back), or
# those of XLME_GPU_DEMO_BUILD (a build folder made otherwise).
if [ -n "${XLME_GPU_DEMO_BUILD:-}" ]; then
  build=$XLME_GPU_DEMO_BUILD
  echo "binaries of $build" >"$out/build.log"
else
  XLME_GPU_CHECK_BUILD_ONLY=1 XLME_GPU_CHECK_BUDGET_S=$(($(left) - eval_s - 60)) \
    bash "$root/scripts/gpu_check.sh" "$out/.check" >"$out/build.log" 2>&1
  build=$(cat "${XLME_GPU_BUILD:-$root/.gpubuild}/build_dir" 2>/dev/null)
  cp "$out/.check/gpu_check.json" "$out/build.json" 2>/dev/null
  cat "$out/.check/build.log" >>"$out/build.log" 2>/dev/null
  rm -rf "$out/.check"
fi
[ -x "$build/xlme-pretrain" ] || { echo "gpu_demo.sh: the build failed (build.log)"; tail -30 "$out/build.log"; exit 1; }

# 2. Both runs at once, each its own process on the one GPU, until the budget keeps eval_s.
if [ "$cpu_mode" = 1 ]; then
  config=(--config configs/pretrain/demo.yaml --set train.steps=${XLME_GPU_DEMO_STEPS:-4}
    --set train.warmup_steps=1)
else
  config=(--config configs/pretrain/demo_small_gpu.yaml --set train.steps=${XLME_GPU_DEMO_STEPS:-30000})
fi
common=(--set data.tokenizer="$demo/spm.model" --set data.shards="$demo/shards"
  --set data.heldout.dir="$demo/heldout/dev" --set train.save_every=500 --set train.validate_every=500)
train_s=$(($(left) - eval_s))
echo "==> training xlme and mlm together for up to ${train_s} s"
# MLM reads only monolingual batches: twice the tokens per task keeps the tokens per step equal.
tokens_per_task=$("$build/xlme-pretrain" "${config[@]}" "${common[@]}" --print-config 2>&1 |
  grep -m1 'tokens_per_task:' | grep -o '[0-9][0-9]*')
[ -n "$tokens_per_task" ] || { echo "gpu_demo.sh: cannot read train.tokens_per_task"; exit 1; }
pids=()
for run in xlme mlm; do
  extra=(--set run.out_dir="$root/runs/gpu-demo-$run" --set objectives.set=$run)
  [ "$run" = mlm ] && extra+=(--set train.tokens_per_task=$((2 * tokens_per_task)))
  timeout -s TERM --kill-after=30 "$train_s" "$build/xlme-pretrain" "${config[@]}" "${common[@]}" \
    "${extra[@]}" >"$out/train-$run.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; echo "    exit $?"; done  # 75: stopped by the budget

# 3. Export each run's newest valid checkpoint (xlme-export picks it from the run folder) and
# evaluate retrieval at every layer, with the untrained model of the same shape beside it.
for run in xlme mlm; do
  dir=$root/runs/gpu-demo-$run
  [ -d "$dir/checkpoints" ] || { echo "no checkpoint of $run" >>"$out/eval.log"; continue; }
  {
    "$build/xlme-export" --checkpoint "$dir" --out "$dir/export" --force &&
      "$build/xlme-finetune" --config configs/finetune/demo_retrieval.yaml \
        --set finetune.init="$dir/export" --set finetune.data_dir="$demo/heldout/test" \
        --set run.out_dir="$dir/retrieval"
  } >>"$out/eval.log" 2>&1
done

# 4. One JSON: steps, tokens, losses and the retrieval means per layer, trained and untrained.
python3 - "$root" "$out" "$(($(date +%s) - start))" <<'EOF'
import json, os, sys
root, out, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
summary = {"seconds": seconds, "runs": {}}
for run in ("xlme", "mlm"):
    d = os.path.join(root, "runs", "gpu-demo-" + run)
    entry = {}
    try:
        records = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
        train = [r for r in records if r.get("kind", "train") == "train"]
        if train:
            last = train[-1]
            entry.update({k: last[k] for k in last if k.startswith(("loss/", "accuracy/", "f1/"))
                          or k in ("step", "tokens_seen", "tokens_per_s")})
    except OSError as e:
        entry["error"] = str(e)
    try:
        results = json.load(open(os.path.join(d, "retrieval", "results.json")))
        for side in ("trained", "untrained"):
            layers = results.get(side, {}).get("layers", {})
            # Mean accuracy@1 over the pairs (both directions) per layer.
            entry[side] = {name: layer.get("mean", {}).get("accuracy")
                           for name, layer in layers.items()}
        best = {side: max((v for v in entry.get(side, {}).values() if v is not None), default=None)
                for side in ("trained", "untrained")}
        entry["best_layer_mean"] = best
    except (OSError, ValueError) as e:
        entry["retrieval_error"] = str(e)
    summary["runs"][run] = entry
json.dump(summary, open(os.path.join(out, "gpu_demo.json"), "w"), indent=1)
print(json.dumps(summary, indent=1)[:6000])
EOF
