#!/usr/bin/env bash
# Measures a small Transformer training step on the CPU under the thread settings that matter on
# few cores: LibTorch's OpenMP threads spinning or sleeping while OpenBLAS's threads run matmuls.
#   scripts/bench_threads.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
bench="$build/tests/xlme-bench-threads"
[ -x "$bench" ] || { echo "error: $bench not found; build first (scripts/setup.sh)" >&2; exit 1; }
cores=$(nproc)
env -u OMP_WAIT_POLICY "$bench" --threads "$cores"
OMP_WAIT_POLICY=PASSIVE "$bench" --threads "$cores"
OMP_WAIT_POLICY=PASSIVE "$bench" --threads 1
