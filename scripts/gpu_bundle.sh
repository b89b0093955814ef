#!/usr/bin/env bash
# The GPU bundle: xlme's binaries and test executables, built here (a CPU machine) against the
# same LibTorch the GPU machines run (torch 2.11.0+cu130: every build compiles CUDA and NCCL in),
# packed with the libraries and tools the GPU machine lacks, so that a lent GPU runs the tests and
# benchmarks without building (docs/gpu.md#the-gpu-bundle).
#
#   scripts/gpu_bundle.sh [OUT]        here: build what is missing (scripts/setup.sh), then pack
#                                      OUT (default .gpubundle/xlme-gpu.tar.xz; git-ignored)
#   scripts/gpu_bundle.sh --source-hash     prints the hash of the sources a build depends on
#   scripts/gpu_bundle.sh --install BUNDLE  on the GPU machine (scripts/gpu_check.sh calls it):
#                                      checks that the bundle was built from these sources and
#                                      that python3's torch is the bundle's, unpacks it and makes
#                                      the paths compiled into it resolve; prints the build folder
#                                      on its last line. Exit 3: not usable here (build instead).
#
# The bundle holds the build folder's binaries, the SentencePiece plug-in, both test executables
# with their CTest files, the shared libraries they load from outside LibTorch's wheel and the
# C library (yaml-cpp, fmt, spdlog, SentencePiece, tcmalloc, ...), the programs the tests call
# (spm_train, spm_encode, msgfmt) with theirs, and MANIFEST (source hash, torch version, paths).
# Compiled-in absolute paths (the source and build folders, .venv's python3, LibTorch's RUNPATH
# into .venv's site-packages) are made to resolve on the GPU machine by links: the checkout at the
# source folder's path, .venv/bin/python3 to its python3, .venv's site-packages to its own.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
limit_mib=60  # the device tool carries 64 MiB with the working tree

# The files a build depends on (not configs or docs), hashed by content under their relative
# names: the same on the device's copy of the working tree, which holds no ignored files.
source_hash() {
  (cd "$root" && find CMakeLists.txt src include tests scripts/hf scripts/xlme_reference.py \
    -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -c1-16)
}

# install BUNDLE: the device side. Prints the build folder last; exit 3 when the bundle does not
# fit this checkout or this torch.
install() {
  local bundle=$1
  [ -f "$bundle" ] || { echo "gpu_bundle.sh: no bundle $bundle" >&2; exit 3; }
  local tmp
  tmp=$(mktemp -d /tmp/xlme-bundle.XXXXXX)
  tar -xJf "$bundle" -C "$tmp" MANIFEST
  local want_hash want_torch source_dir build_dir have_hash have_torch
  want_hash=$(sed -n 's/^source_hash=//p' "$tmp/MANIFEST")
  want_torch=$(sed -n 's/^torch=//p' "$tmp/MANIFEST")
  source_dir=$(sed -n 's/^source_dir=//p' "$tmp/MANIFEST")
  build_dir=$(sed -n 's/^build_dir=//p' "$tmp/MANIFEST")
  have_hash=$(source_hash)
  have_torch=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
  if [ "$want_hash" != "$have_hash" ]; then
    echo "gpu_bundle.sh: the bundle was built from other sources (hash $want_hash, this checkout $have_hash): build instead" >&2
    exit 3
  fi
  if [ "$want_torch" != "$have_torch" ]; then
    echo "gpu_bundle.sh: the bundle needs torch $want_torch, python3 has $have_torch: build instead" >&2
    exit 3
  fi
  # The source folder's path leads to this checkout (a link where it is elsewhere).
  if [ "$(readlink -f "$source_dir" 2>/dev/null)" != "$root" ]; then
    if [ -e "$source_dir" ] || [ -L "$source_dir" ]; then
      echo "gpu_bundle.sh: $source_dir exists and is not this checkout: cannot place the bundle" >&2
      exit 3
    fi
    mkdir -p "$(dirname "$source_dir")"
    ln -s "$root" "$source_dir"
  fi
  # .venv/bin/python3 and .venv's site-packages: this machine's python3 and its packages.
  local venv=$root/.venv site py_version
  site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  py_version=$(sed -n 's/^venv_site=//p' "$tmp/MANIFEST")
  if [ ! -x "$venv/bin/python3" ] || [ -L "$venv/bin/python3" ]; then
    mkdir -p "$venv/bin" "$venv/$(dirname "$py_version")"
    ln -sfn "$(command -v python3)" "$venv/bin/python3"
    ln -sfn "$site" "$venv/$py_version"
  fi
  # The build folder: the bundle's files (a fresh folder; a build there would be overwritten).
  local target=$build_dir
  rm -rf "$target"
  mkdir -p "$target"
  tar -xJf "$bundle" -C "$target" --strip-components=1 build
  rm -rf "$target/.bundle"
  mkdir -p "$target/.bundle"
  tar -xJf "$bundle" -C "$target/.bundle" lib bin MANIFEST
  # The tests preload tcmalloc from Debian's path (tests/CMakeLists.txt); put it there if absent.
  local tc
  tc=$(sed -n 's/^tcmalloc=//p' "$tmp/MANIFEST")
  if [ -n "$tc" ] && [ ! -e "$tc" ]; then
    mkdir -p "$(dirname "$tc")"
    cp "$target/.bundle/lib/$(basename "$tc")" "$tc"
  fi
  rm -rf "$tmp"
  echo "$target"
}

pack() {
  local out=${1:-$root/.gpubundle/xlme-gpu.tar.xz}
  case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
  local build_dir=${XLME_BUILD_DIR:-build}
  case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
  export XLME_BUILD_DIR="$build_dir"
  local start
  start=$(date +%s)
  "$root/scripts/setup.sh"
  for flag in XLME_WITH_CUDA USE_C10D_NCCL; do
    grep -q -- "-D$flag" "$build_dir/build.ninja" || {
      echo "gpu_bundle.sh: $flag is not in the build ($build_dir): the bundle would not run CUDA" >&2
      exit 1
    }
  done
  local venv python torch site
  python=$(sed -n 's/^XLME_PYTHON:FILEPATH=//p' "$build_dir/CMakeCache.txt")
  venv=$(dirname "$(dirname "$python")")
  torch=$("$python" -c 'import torch; print(torch.__version__)')
  site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  local stage
  stage=$(mktemp -d /tmp/xlme-bundle-stage.XXXXXX)
  mkdir -p "$stage/build/tests" "$stage/lib" "$stage/bin"
  # The build folder's files that the tests and benchmarks use.
  (cd "$build_dir" && cp --parents xlme-data xlme-pretrain xlme-finetune xlme-export libxlme_spm.so \
    libexec/xlme-data libexec/xlme-pretrain libexec/xlme-finetune libexec/xlme-export \
    libexec/*.address-space \
    CTestTestfile.cmake tests/CTestTestfile.cmake tests/xlme_unit_tests tests/xlme_integration_tests \
    tests/xlme-bench-ops tests/xlme-bench-attn tests/*_tests.cmake tests/*_include.cmake \
    "$stage/build/")
  local elves=("$stage"/build/xlme-* "$stage"/build/libexec/xlme-{data,pretrain,finetune,export}
               "$stage/build/libxlme_spm.so"
               "$stage"/build/tests/xlme_*_tests
               "$stage/build/tests/xlme-bench-ops" "$stage/build/tests/xlme-bench-attn")
  strip "${elves[@]}"
  # The programs the tests call, and every library the bundle loads from outside the wheel's
  # site-packages and the C and C++ runtime every Linux has.
  local tools=()
  for t in spm_train spm_encode msgfmt; do
    tools+=("$(command -v "$t")") || { echo "gpu_bundle.sh: no $t (scripts/setup.sh installs it)" >&2; exit 1; }
  done
  cp "${tools[@]}" "$stage/bin/"
  local tc
  tc=$(sed -n 's/^XLME_TCMALLOC:FILEPATH=//p' "$build_dir/CMakeCache.txt")  # the tests preload it
  [ "$tc" = XLME_TCMALLOC-NOTFOUND ] && tc=""
  local lib
  for lib in $( (for f in "${elves[@]}" "${tools[@]}" ${tc:+"$tc"}; do
      LD_LIBRARY_PATH="$site/torch/lib" ldd "$f"; done) |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
    case "$lib" in
      "$site"/* | "$venv"/*) continue ;;  # LibTorch, CUDA's wheels: the GPU machine's own
      */libc.so.* | */libm.so.* | */libpthread.so.* | */libdl.so.* | */librt.so.* | */ld-linux* | \
        */libgcc_s.so.* | */libstdc++.so.* | */libz.so.* | */liblzma.so.* | */libcuda.so.*) continue ;;
    esac
    cp -L "$lib" "$stage/lib/"
  done
  [ -n "$tc" ] && cp -L "$tc" "$stage/lib/"
  {
    echo "source_hash=$(source_hash)"
    echo "torch=$torch"
    echo "source_dir=$root"
    echo "build_dir=$build_dir"
    echo "venv_site=${site#"$venv"/}"
    echo "tcmalloc=$tc"
    echo "git=$(cd "$root" && git rev-parse --short HEAD 2>/dev/null)$(cd "$root" && git diff --quiet HEAD 2>/dev/null || echo -dirty)"
    echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  } >"$stage/MANIFEST"
  mkdir -p "$(dirname "$out")"
  echo "==> packing $(du -sm "$stage" | cut -f1) MiB: $(ls "$stage/lib" | tr '\n' ' ')"
  tar -C "$stage" -cf - MANIFEST build lib bin | xz -T0 -6 >"$out.tmp"
  mv "$out.tmp" "$out"
  rm -rf "$stage"
  local size
  size=$(( $(stat -c %s "$out") / 1048576 ))
  if [ "$size" -gt "$limit_mib" ]; then
    echo "gpu_bundle.sh: $out is $size MiB, over the $limit_mib MiB the device tool carries" >&2
    exit 1
  fi
  echo "==> $out: $(du -h "$out" | cut -f1), source hash $(source_hash), torch $torch ($(( $(date +%s) - start )) s)"
}

case "${1:-}" in
  --source-hash) source_hash ;;
  --install) install "${2:?usage: gpu_bundle.sh --install BUNDLE}" ;;
  -h | --help) sed -n '2,22p' "$0" ;;
  *) pack "$@" ;;
esac
