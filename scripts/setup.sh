#!/usr/bin/env bash
# Installs the Debian packages xlme needs (skipped when all are present), then configures and
# builds xlme. Safe to run again: it only does what is missing or out of date. quickstart.sh and
# test.sh configure the same build (warnings as errors, tests on), so the second reuses the first.
# --binaries builds only the four binaries (quickstart.sh); --print-packages prints the Debian
# packages and exits (scripts/check_torch2.sh uses it).
#
#   scripts/setup.sh [--no-build] [--binaries] [--print-packages] [-- EXTRA CMAKE ARGS]
#
# Environment:
#   XLME_BUILD_DIR     build folder (default: build)
#   XLME_TORCH_PREFIX  a CUDA LibTorch 2.x, e.g. $(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)');
#                      default: Debian's libtorch-dev (1.13, CPU)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${XLME_BUILD_DIR:-build}
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
build=1
binaries_only=0
print_packages=0
cmake_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --binaries) binaries_only=1 ;;
    --print-packages) print_packages=1 ;;
    --) shift; cmake_args=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# libopenblas0-pthread: without it LibTorch falls back to the reference BLAS (~15x slower matmuls).
# libtcmalloc-minimal4: the allocator the binaries preload (src/common/runtime.h; peak RSS of the
# demo run less than half of glibc malloc's).
# python3-torch, python3-numpy: the PyTorch reference loader and its parity test;
# python3-matplotlib: scripts/plot_metrics.py; python3-sentencepiece and the modules that
# transformers imports (yaml ... typing-extensions): the transformers export test (docs/testing.md#the-transformers-export-test).
# zlib1g-dev, liblzma-dev: .gz/.xz corpora (and checkpoint CRC32s); gettext: msgfmt for the
# .mo tests; nlohmann-json3-dev: reading JSON (XTREME's SQuAD files, safetensors headers,
# export config.json); sentencepiece: spm_encode/spm_train, the references of the tokenizer
# tests and benchmark.
packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread libtcmalloc-minimal4
  libsentencepiece-dev sentencepiece
  zlib1g-dev liblzma-dev gettext
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev nlohmann-json3-dev
  python3-torch python3-numpy python3-matplotlib python3-sentencepiece
  python3-yaml python3-regex python3-requests python3-tqdm python3-filelock python3-packaging
  python3-fsspec python3-typing-extensions
)

if [ "$print_packages" -eq 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
"$root/scripts/install_packages.sh" "${packages[@]}"

[ "$build" -eq 1 ] || exit 0

cmake_args=(-DXLME_WERROR=ON -DXLME_BUILD_TESTS=ON "${cmake_args[@]}")
if [ -n "${XLME_TORCH_PREFIX:-}" ]; then
  cmake_args+=("-DCMAKE_PREFIX_PATH=$XLME_TORCH_PREFIX")
fi
targets=()
if [ "$binaries_only" -eq 1 ]; then
  targets=(--target xlme-data xlme-pretrain xlme-finetune xlme-export)
fi
echo "==> configuring $build_dir"
cmake -S "$root" -B "$build_dir" -G Ninja "${cmake_args[@]}" >"$build_dir.configure.log" 2>&1 || {
  cat "$build_dir.configure.log" >&2
  echo "setup.sh: cmake configuration failed (log above: $build_dir.configure.log)" >&2
  exit 1
}
echo "==> building (this takes a few minutes on 2 cores the first time)"
start=$(date +%s)
cmake --build "$build_dir" "${targets[@]}"
echo "==> built in $(( $(date +%s) - start )) s: $build_dir/xlme-{data,pretrain,finetune,export}"
