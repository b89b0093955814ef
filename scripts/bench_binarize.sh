#!/usr/bin/env bash
# Binarization throughput next to the spm_encode command-line tool on the same input:
#   scripts/bench_binarize.sh CORPUS_DIR MODEL [THREADS]
# CORPUS_DIR/mono/*.txt are concatenated into one input file; spm_encode (single-threaded) and
# `xlme-data binarize` with 1 and THREADS threads (default: all cores) encode it. Prints MB/s
# and the ratio to the target 0.8 x spm_encode x threads.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
corpus=${1:?usage: bench_binarize.sh CORPUS_DIR MODEL [THREADS]}
model=${2:?usage: bench_binarize.sh CORPUS_DIR MODEL [THREADS]}
threads=${3:-$(nproc)}
build_dir=${XLME_BUILD_DIR:-$root/build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/raw/mono"
cat "$corpus"/mono/*.txt > "$work/raw/mono/all.txt"
bytes=$(stat -c %s "$work/raw/mono/all.txt")
mb=$(echo "scale=2; $bytes / 1000000" | bc)

seconds() { local s=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc; }

spm=$(seconds sh -c "spm_encode --model='$model' --output_format=id < '$work/raw/mono/all.txt' > '$work/ids.txt'")
echo "input: $mb MB; spm_encode (1 thread): $(echo "scale=2; $mb / $spm" | bc) MB/s ($spm s)"
for t in 1 "$threads"; do
  rm -rf "$work/shards"
  s=$(seconds "$build_dir/xlme-data" binarize --input "$work/raw" --out "$work/shards" \
      --set data.tokenizer="$model" --threads "$t")
  rate=$(echo "scale=2; $mb / $s" | bc)
  target=$(echo "scale=2; 0.8 * $mb / $spm * $t" | bc)
  echo "xlme-data binarize ($t threads): $rate MB/s ($s s); target 0.8 x spm_encode x $t = $target MB/s"
done
