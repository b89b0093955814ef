#!/usr/bin/env bash
# Installs what xlme needs and builds it. Safe to run again: it only does what is missing or out of
# date. quickstart.sh and test.sh configure the same build (warnings as errors, tests on), so the
# second reuses the first.
#   1. Debian's packages (apt; skipped when all are present): the compiler and build tools and the
#      C++ libraries xlme links (yaml-cpp, spdlog, fmt, CLI11, SentencePiece, GoogleTest, Gloo's
#      headers, zlib, liblzma, nlohmann-json).
#   2. The Python side in a virtual environment in the checkout (.venv, git-ignored): the pinned
#      packages of requirements.txt (uv, or pip with XLME_INSTALLER=pip: install_python.sh; skipped
#      when .venv already holds exactly that file's set), torch==2.11.0 first of all, whose
#      LibTorch (CUDA 13.0 build, NCCL, cuDNN) xlme compiles against.
#   3. CMake configure and build in XLME_BUILD_DIR (CUDA compiled in; the CUDA toolkit's nvcc and
#      headers in /usr/local/cuda or on PATH are needed to configure: see docs/gpu.md); a new
#      build folder compiles the library and the tests in unity batches.
# --binaries builds only the four binaries (quickstart.sh); --print-packages prints the Debian
# packages and exits.
#
#   scripts/setup.sh [--no-build] [--binaries] [--print-packages] [-- EXTRA CMAKE ARGS]
#
# Environment:
#   XLME_BUILD_DIR      build folder (default: build)
#   XLME_VENV           the virtual environment (default: .venv in the checkout)
#   XLME_BASE_PYTHON    the Python that makes it (default: python3; 3.10 or later)
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
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# libtcmalloc-minimal4: the allocator the binaries preload (src/common/runtime.h; peak RSS of the
# demo run less than half of glibc malloc's). libgloo-dev: c10d's ProcessGroupGloo.hpp includes
# Gloo's headers, which the torch wheel does not ship. zlib1g-dev, liblzma-dev: .gz/.xz corpora
# (and checkpoint CRC32s); gettext: msgfmt for the .mo tests; nlohmann-json3-dev: reading JSON
# (XTREME's SQuAD files, safetensors headers, export config.json); sentencepiece: spm_encode/
# spm_train, the references of the tokenizer tests and benchmark. python3-venv: Debian's python3
# makes virtual environments only with it. iproute2 (ip netns, veth) and util-linux (unshare): the
# two-host test in network namespaces (tests/integration/dist_netns_test.cpp); procps (ps):
# scripts/xlme-torchrun.
packages=(
  build-essential cmake ninja-build pkg-config ccache mold
  libgloo-dev libtcmalloc-minimal4
  libsentencepiece-dev sentencepiece
  zlib1g-dev liblzma-dev gettext
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev nlohmann-json3-dev
  python3-venv iproute2 util-linux procps
)

if [ "$print_packages" -eq 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
"$root/scripts/install_packages.sh" "${packages[@]}"
"$root/scripts/install_python.sh"
venv=${XLME_VENV:-$root/.venv}

[ "$build" -eq 1 ] || exit 0

cmake_args=(-DXLME_WERROR=ON -DXLME_BUILD_TESTS=ON "-DXLME_PYTHON=$venv/bin/python3"
            "${cmake_args[@]}")
# A new build folder compiles the library and the tests in unity batches (XLME_UNITY_BUILD):
# half the time of a clean build. A folder configured before keeps its setting; one you edit in
# every day builds faster per change without (-- -DXLME_UNITY_BUILD=OFF), and is the build that
# finds a missing #include.
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake_args=(-DXLME_UNITY_BUILD=ON "${cmake_args[@]}")
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
