#!/usr/bin/env bash
# The one command a session with a lent GPU runs (docs/gpu.md#checking-on-a-gpu): builds xlme
# against the CUDA LibTorch of PyTorch's wheel, runs the CUDA tests and the benchmarks, and writes
# OUT_DIR/gpu_check.json plus the logs (7 files: the device tool brings back at most 8).
#
#   scripts/gpu_check.sh --prepare   here (Debian 12, root, apt): fills .gpudeps/ with what the
#                                    build needs beyond the wheel, as unpacked Debian packages
#                                    plus the Debian sources of the compiled libraries
#   scripts/gpu_check.sh [--plan P] OUT_DIR
#                                    on the GPU machine, in the repository root: carry .gpubundle
#                                    (scripts/gpu_bundle.sh: no build there) or .gpudeps (a build)
#   scripts/gpu_check.sh --plan P --list   the steps plan P runs, with their limits
#
# Plans: a lent GPU gives 15 minutes of device time, at most 10 a command, so the window is two
# commands back to back (docs/gpu.md#the-window-two-commands):
#   bringup  (budget 400 s) every CUDA test, the three trainer-level ones again outside ctest and
#            with every fused op, the attention tests with the fused kernel, xlme-bench-ops and
#            xlme-bench-attn: is each path correct on this GPU
#   speed    (budget 300 s) the Base step with each fused op alone against the reference step,
#            all of them, CUDA graphs, the reference twice (the spread), the device-time profile
#            and the HuggingFace peer (eager, fused AdamW, compiled when time is left)
#   confirm  (budget 400 s) after changing `auto`: every CUDA test under the new defaults, the
#            trainer's tests with every fused op, the reference step and the new default step
#            interleaved twice, with weight_grad, with CUDA graphs, Base's profile, the attention
#            without dropout and under Nsight Compute, the compiled peer
#   all      (budget 560 s, the default) bringup and speed, in one command
#
# Steps (each time-limited, each failure recorded in the JSON; independent steps still run):
#   env        nvidia-smi, the wheel's torch (version, CUDA, cmake prefix), nvcc, cmake, compiler
#   bundle     where .gpubundle/xlme-gpu.tar.xz was built from this checkout's sources against this
#              machine's torch (scripts/gpu_bundle.sh --install): unpacked, and deps, configure and
#              build are skipped; otherwise recorded as not used, and the steps below build
#   deps       whether the carried prebuilt libraries link and run here (glibc, libstdc++); the
#              ones that do not are built from the carried Debian sources into the build folder
#   configure  cmake (once; later calls reuse the build folder .gpubuild/ and only rebuild)
#   build      ninja -j$(nproc): the binaries, both test executables and the two benchmarks
#   flags      XLME_WITH_CUDA and USE_C10D_NCCL in the build; where gloo/ and fmt/ headers came from
#   cuda_tests ctest -R 'Cuda' (tests/integration/cuda_test.cpp and the unit tests with Cuda in
#              their names, e.g. MultiTensorAdamW.CudaStepsEqualTheCpuSteps), one process per test
#   cuda_tests_fused_attention  the attention's CUDA tests again with XLME_OPS=attention=fused
#   bench_*    xlme-pretrain --benchmark: base (configs/pretrain/base.yaml, bf16) and small
#              (configs/pretrain/demo_small_gpu.yaml), each with model.attention=sdpa and =math;
#              base with micro-batches twice as large
#   ops_bench  tests/xlme-bench-ops: each fused op against its reference at Base's shapes
#   attn_bench tests/xlme-bench-attn: the attention's paths, the fused kernel, cuDNN's SDPA and the
#              flash kernel without bias (the ceiling), Base's shapes, TFLOP/s forward and backward
#   bench_base_fused  the Base benchmark with XLME_OPS=fused (every Triton kernel on)
#   bench_base_graphs the Base benchmark with train.cuda_graphs=on (against bench_base_sdpa)
#   bench_base_weight_grad  the Base benchmark with XLME_OPS=weight_grad=fused (the products add
#                     into the fp32 gradient buffers; against bench_base_sdpa)
#   profile_base  --benchmark 2 --profile: Base's device time per operator, into bench.log
#   peer_base_*   scripts/peer_hf_electra.py (HuggingFace ELECTRA, Base shapes), plain and with
#              the fused AdamW
#
# Environment: XLME_GPU_CHECK_BUDGET_S (default: the plan's budget, under the tool's 600 s),
# XLME_GPU_BUNDLE (default .gpubundle/xlme-gpu.tar.xz; XLME_GPU_BUNDLE=none: always build),
# XLME_GPU_DEPS (default .gpudeps), XLME_GPU_BUILD (default .gpubuild), XLME_GPU_DEPS_FROM_SOURCE=1
# (build the compiled libraries from source even where the prebuilt ones work),
# XLME_GPU_CHECK_DEPS_S / _BUILD_S (default 240 / 330: those steps' limits),
# XLME_GPU_CHECK_BUILD_ONLY=1 (env, deps, configure and the four binaries only: no tests, no
# benchmarks; scripts/gpu_demo.sh),
# XLME_GPU_CHECK_ALLOW_CPU=1 (no GPU: CPU benchmark shapes; CUDA tests skip; for checking this
# script on a CPU machine).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=${XLME_GPU_DEPS:-$root/.gpudeps}
work=${XLME_GPU_BUILD:-$root/.gpubuild}
arch=x86_64-linux-gnu

# Debian 12 (bookworm) packages: header-only ones, the compiled ones, and the tools the tests call.
deb_packages=(
  libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9 libspdlog-dev libspdlog1.10
  libcli11-dev nlohmann-json3-dev libsentencepiece-dev libsentencepiece0 sentencepiece
  libgtest-dev googletest libgloo-dev zlib1g-dev zlib1g liblzma-dev liblzma5
  pkgconf pkgconf-bin libpkgconf3
)
# Their sources, built on the device when the prebuilt libraries do not load there.
# (GoogleTest's sources are the googletest package's /usr/src/googletest.)
source_packages=(yaml-cpp fmtlib spdlog sentencepiece)

prepare() {
  [ "$(id -u)" -eq 0 ] || { echo "gpu_check.sh --prepare: needs root (apt-get)" >&2; exit 1; }
  local tmp
  tmp=$(mktemp -d /tmp/xlme-gpudeps.XXXXXX)
  rm -rf "$deps"
  mkdir -p "$deps/root" "$deps/src"
  echo "==> downloading ${#deb_packages[@]} Debian packages"
  (cd "$tmp" && apt-get download "${deb_packages[@]}") >"$tmp/download.log" 2>&1 || {
    cat "$tmp/download.log" >&2; exit 1; }
  : >"$deps/MANIFEST"
  for f in "$tmp"/*.deb; do
    dpkg -x "$f" "$deps/root"
    echo "deb $(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version)" >>"$deps/MANIFEST"
  done
  # Sources through a private deb-src list: the system's apt configuration stays untouched.
  echo "==> downloading the sources of ${source_packages[*]}"
  mkdir -p "$tmp/lists/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian bookworm main" >"$tmp/src.list"
  local apt_src=(-o "Dir::Etc::SourceList=$tmp/src.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$tmp/lists" -o "Acquire::Check-Valid-Until=false")
  apt-get "${apt_src[@]}" update >"$tmp/src-update.log" 2>&1 || { cat "$tmp/src-update.log" >&2; exit 1; }
  (cd "$tmp" && apt-get "${apt_src[@]}" source --download-only "${source_packages[@]}") \
    >"$tmp/source.log" 2>&1 || { cat "$tmp/source.log" >&2; exit 1; }
  for p in "${source_packages[@]}"; do
    local orig
    orig=$(ls "$tmp"/"${p}"_*.orig.tar.* | head -1)
    cp "$orig" "$deps/src/"
    echo "src $p $(basename "$orig")" >>"$deps/MANIFEST"
  done
  # Small: no documentation, no static archives the build does not link (GoogleTest's are built
  # from its sources when they fail), no Gloo libraries (only its headers are used).
  rm -rf "$deps/root/usr/share/doc" "$deps/root/usr/share/man" "$deps/root/usr/share/lintian" \
    "$deps/root/usr/share/locale" "$deps/root/usr/share/info"
  rm -f "$deps/root/usr/lib/$arch"/libgloo* "$deps/root/usr/lib/$arch"/libsentencepiece*.a
  # What each prebuilt library needs of the C library (the device's must be at least as new).
  for lib in "$deps/root/usr/lib/$arch"/lib{yaml-cpp,fmt,spdlog,sentencepiece,sentencepiece_train,pkgconf}.so.*; do
    [ -L "$lib" ] && continue
    echo "glibc $(basename "$lib") $(objdump -T "$lib" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)" \
      >>"$deps/MANIFEST"
  done
  rm -rf "$tmp"
  echo "==> $deps: $(du -sh "$deps" | cut -f1) ($(find "$deps" -type f | wc -l) files); manifest:"
  cat "$deps/MANIFEST"
}

plan=all
list_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) prepare; exit 0 ;;
    -h | --help) sed -n '2,50p' "$0"; exit 0 ;;
    --plan) plan=${2:-}; shift 2 ;;
    --list) list_only=1; shift ;;
    -*) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
case "$plan" in
  bringup | confirm) default_budget=400 ;;
  speed) default_budget=300 ;;
  all) default_budget=560 ;;
  *) echo "gpu_check.sh: --plan takes bringup, speed, confirm or all, not '$plan'" >&2; exit 2 ;;
esac
# The steps after the build that each plan runs (they run in the script's order).
plan_steps() {
  case "$1" in
    bringup) echo "cuda_tests cuda_tests_fused_attention crash_rerun cuda_trainer_fused ops_bench
      attn_bench" ;;
    speed) echo "bench_base_sdpa bench_base_fused bench_base_attention bench_base_masked_lm
      bench_base_residual_layernorm bench_base_feed_forward bench_base_weight_grad bench_base_graphs
      peer_base_default profile_base_fused bench_base_sdpa_again peer_base_fused-adam profile_base
      bench_base_math bench_small_sdpa bench_base_sdpa_mb64 peer_base_compiled" ;;
    confirm) echo "cuda_tests cuda_trainer_fused attn_bench_no_dropout ncu_attention
      bench_base_sdpa bench_base_auto bench_base_sdpa_again bench_base_auto_again
      bench_base_auto_weight_grad bench_base_auto_graphs profile_base bench_base_auto_mb64
      bench_small_sdpa peer_base_compiled" ;;
    all) echo "$(plan_steps bringup) $(plan_steps speed)" ;;
  esac
}
# A step's time limit in seconds (shortened to what is left of the budget when it starts).
limit_of() {
  case "$1" in
    cuda_tests) echo 200 ;;
    cuda_tests_fused_attention | crash_rerun | cuda_trainer_fused | bench_* | profile_*) echo 90 ;;
    ops_bench) echo 100 ;;
    attn_bench) echo 80 ;;
    attn_bench_no_dropout | ncu_attention) echo 60 ;;
    peer_*) echo 120 ;;
    *) echo 60 ;;
  esac
}
in_plan() {
  case " $(echo $(plan_steps "$plan")) " in
    *" $1 "*) return 0 ;;
    *) return 1 ;;
  esac
}
if [ "$list_only" = 1 ]; then
  echo "plan $plan, budget ${XLME_GPU_CHECK_BUDGET_S:-$default_budget} s:"
  echo "  env (60 s), bundle (~15 s; without one: deps, configure and build, ~6 min), flags"
  total=0
  for step in $(plan_steps "$plan"); do
    printf '  %-30s limit %3d s\n' "$step" "$(limit_of "$step")"
    total=$((total + $(limit_of "$step")))
  done
  echo "sum of the limits: $total s; a step that would start with less than 25 s of the budget left"
  echo "is skipped and recorded, so the plan ends within its budget (the steps typically take a"
  echo "fifth to a half of their limits: docs/gpu.md#the-window-two-commands)"
  exit 0
fi
[ $# -ge 1 ] || { sed -n '2,50p' "$0"; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu_check.sh: cannot create $1" >&2; exit 2; }

# --- bookkeeping: one line per step in steps.tsv, turned into JSON at the end ---------------------
start_all=$(date +%s)
budget=${XLME_GPU_CHECK_BUDGET_S:-$default_budget}
mkdir -p "$work"
state="$work/state"
rm -rf "$state"
mkdir -p "$state"
: >"$state/steps.tsv"
for f in env deps build tests bench; do : >"$out/$f.log"; done
: >"$out/steps.tsv"
left() { echo $((budget - ($(date +%s) - start_all))); }
# Each step's verdict goes to OUT_DIR/steps.tsv as it ends too, so that a command cut at the
# device tool's limit still brings back every finished step's.
record() {  # record STEP STATUS SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(echo "$4" | tr '\t\n' '  ' | cut -c1-2000)" |
    tee -a "$out/steps.tsv" >>"$state/steps.tsv"
  echo "==> $1: $2 (${3} s) $(echo "$4" | head -c 300)"
}
# run_step NAME LIMIT_S LOG -- COMMAND...: runs COMMAND under `timeout`, shortened to what is left
# of the budget (less a reserve for the summary); records ok / failed (rc) / timeout / skipped.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 4
  local avail=$(($(left) - 15))
  if [ "$avail" -lt 10 ]; then
    record "$name" skipped 0 "no time left in the ${budget} s budget"
    return 1
  fi
  [ "$limit" -gt "$avail" ] && limit=$avail
  echo "=== step $name (limit ${limit} s): $(echo "$*" | head -c 300)" >>"$log"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ]; then
    record "$name" ok "$dt" ""
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record "$name" timeout "$dt" "stopped after ${limit} s; last lines: $(tail -5 "$log")"
  else
    record "$name" failed "$dt" "exit $rc; last lines: $(grep -iE 'error|fail' "$log" | tail -8)"
  fi
  return "$rc"
}

cpu_mode=${XLME_GPU_CHECK_ALLOW_CPU:-0}
nproc=$(nproc)
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}

# --- env ------------------------------------------------------------------------------------------
env_probe() {
  echo "--- uname: $(uname -a)"
  echo "--- glibc: $(getconf GNU_LIBC_VERSION 2>&1)"
  [ -r /etc/os-release ] && grep PRETTY_NAME /etc/os-release
  echo "--- nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "--- python3 torch"
  python3 - <<'EOF' 2>&1
import torch, os
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("cmake_prefix_path", torch.utils.cmake_prefix_path)
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
inc = os.path.join(os.path.dirname(torch.__file__), "include")
print("wheel include has gloo/:", os.path.isdir(os.path.join(inc, "gloo")), "fmt/:", os.path.isdir(os.path.join(inc, "fmt")))
EOF
  echo "--- nvcc: $(command -v nvcc) $(nvcc --version 2>&1 | tail -2 | tr '\n' ' ')"
  echo "--- cmake: $(cmake --version | head -1); ninja $(ninja --version); c++: $(c++ --version | head -1)"
  echo "--- pkg-config: $(command -v pkg-config || echo none)"
  echo "--- cores: $nproc; memory: $(free -g | awk '/Mem/ {print $2}') GiB"
}
run_step env 60 "$out/env.log" -- bash -c "$(declare -f env_probe); nproc=$nproc; env_probe"

torch_prefix=""
cuda_root=""
if [ "$cpu_mode" != 1 ]; then
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  if [ -z "$torch_prefix" ]; then
    record torch failed 0 "python3 cannot import torch: no LibTorch to build against"
  fi
  nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
  [ -n "$nvcc_path" ] && cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")
  [ -n "$cuda_root" ] || record cuda_toolkit failed 0 "no nvcc on PATH or in /usr/local/cuda"
fi

# --- bundle: the binaries built on a CPU machine, when they fit this checkout and this torch -----
bundle=${XLME_GPU_BUNDLE:-$root/.gpubundle/xlme-gpu.tar.xz}
bundled=0
if [ "$bundle" != none ] && [ -f "$bundle" ]; then
  t0=$(date +%s)
  "$root/scripts/gpu_bundle.sh" --install "$bundle" >"$state/bundle.out" 2>"$state/bundle.err"
  rc=$?
  cat "$state/bundle.out" "$state/bundle.err" >>"$out/build.log"
  if [ "$rc" -eq 0 ]; then
    bundled=1
    build=$(tail -1 "$state/bundle.out")
    record bundle ok $(($(date +%s) - t0)) "installed into $build"
    export LD_LIBRARY_PATH="$build/.bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$build/.bundle/bin:$PATH"
  elif [ "$rc" -eq 3 ]; then  # does not fit this checkout or this torch: build instead
    record bundle unbundled $(($(date +%s) - t0)) "$(tail -1 "$state/bundle.err")"
  else
    record bundle failed $(($(date +%s) - t0)) "exit $rc: $(tail -3 "$state/bundle.err")"
  fi
else
  record bundle unbundled 0 "no bundle at $bundle (scripts/gpu_bundle.sh makes one): building"
fi

# --- deps: the carried libraries, prebuilt or built here ------------------------------------------
if [ "$bundled" = 0 ]; then
R="$deps/root"
L="$R/usr/lib/$arch"
built="$work/deps-built"  # libraries built from the carried sources, when needed
# The prebuilt libraries at run time, without zlib/liblzma (the system's own serve at run time).
runtime="$work/deps-runtime"
deps_step() {
  set -e
  [ -d "$L" ] || { echo "no $L: run scripts/gpu_check.sh --prepare and carry .gpudeps"; exit 1; }
  rm -rf "$runtime"
  mkdir -p "$runtime"
  for lib in "$L"/lib{yaml-cpp,fmt,spdlog,sentencepiece,sentencepiece_train,pkgconf}.so*; do
    ln -sf "$lib" "$runtime/"
  done
  local probe="$work/deps-probe"
  mkdir -p "$probe"
  # One program per compiled library: it must link and run against the prebuilt one.
  cat >"$probe/yaml.cpp" <<'EOF'
#include <yaml-cpp/yaml.h>
int main() { return YAML::Load("a: 1")["a"].as<int>() == 1 ? 0 : 1; }
EOF
  cat >"$probe/spdlog.cpp" <<'EOF'
#include <spdlog/spdlog.h>
#include <fmt/format.h>
int main() { spdlog::info("{}", fmt::format("{}", 42)); return 0; }
EOF
  cat >"$probe/spm.cpp" <<'EOF'
#include <sentencepiece_processor.h>
int main() { sentencepiece::SentencePieceProcessor p; return p.status().ok() ? 0 : 0; }
EOF
  cat >"$probe/gtest.cpp" <<'EOF'
#include <gtest/gtest.h>
TEST(Probe, Runs) { EXPECT_EQ(1, 1); }
EOF
  local flags=(-std=c++17 -I"$R/usr/include" -L"$L")
  local rebuild=()
  try() {  # try NAME SOURCE LIBS...
    local name=$1 src=$2
    shift 2
    if [ "${XLME_GPU_DEPS_FROM_SOURCE:-0}" != 1 ] &&
      c++ "${flags[@]}" "$probe/$src" -o "$probe/$name" "$@" -pthread 2>"$probe/$name.err" &&
      LD_LIBRARY_PATH="$runtime" "$probe/$name" >/dev/null 2>>"$probe/$name.err"; then
      echo "prebuilt $name: ok"
    else
      echo "prebuilt $name: does not link or run here: $(tail -3 "$probe/$name.err" 2>/dev/null)"
      rebuild+=("$name")
    fi
  }
  try yaml-cpp yaml.cpp -lyaml-cpp
  try spdlog spdlog.cpp -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -lspdlog -lfmt
  try sentencepiece spm.cpp -lsentencepiece
  try gtest gtest.cpp "$L/libgtest.a" "$L/libgtest_main.a"
  LD_LIBRARY_PATH="$runtime" "$R/usr/bin/spm_train" --help >/dev/null 2>&1 &&
    echo "prebuilt spm_train: ok" || { echo "prebuilt spm_train: does not run"; rebuild+=(sentencepiece); }
  [ ${#rebuild[@]} -eq 0 ] && { rm -rf "$built"; return 0; }
  # Build from source into $built (cmake install), which comes first on every search path.
  local stamp="$built/.done-$(printf '%s-' "${rebuild[@]}")"
  [ -e "$stamp" ] && { echo "built earlier: ${rebuild[*]}"; return 0; }
  rm -rf "$built"
  mkdir -p "$built/src"
  for name in $(printf '%s\n' "${rebuild[@]}" | sort -u); do
    local src_dir cmake_args=()
    case "$name" in
      gtest)
        src_dir="$R/usr/src/googletest"
        cmake_args=(-DBUILD_GMOCK=ON -DINSTALL_GTEST=ON) ;;
      spdlog)  # spdlog needs fmt: both
        for p in fmtlib spdlog; do
          mkdir -p "$built/src/$p"
          tar -xf "$deps"/src/${p}_*.orig.tar.* -C "$built/src/$p"
          local d
          d=$(ls -d "$built/src/$p"/*/ | head -1)
          local extra=(-DFMT_DOC=OFF -DFMT_TEST=OFF -DBUILD_SHARED_LIBS=ON)
          [ "$p" = spdlog ] && extra=(-DSPDLOG_FMT_EXTERNAL=ON -DSPDLOG_BUILD_SHARED=ON
            -DSPDLOG_BUILD_EXAMPLE=OFF -DSPDLOG_BUILD_TESTS=OFF)
          cmake -S "$d" -B "$built/build-$p" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
            -DCMAKE_INSTALL_PREFIX="$built" -DCMAKE_PREFIX_PATH="$built" -DCMAKE_INSTALL_LIBDIR=lib \
            "${extra[@]}"
          cmake --build "$built/build-$p" -j"$nproc" --target install
        done
        continue ;;
      yaml-cpp)
        tar -xf "$deps"/src/yaml-cpp_*.orig.tar.* -C "$built/src"
        src_dir=$(ls -d "$built"/src/yaml-cpp*/ | head -1)
        cmake_args=(-DYAML_BUILD_SHARED_LIBS=ON -DYAML_CPP_BUILD_TESTS=OFF -DYAML_CPP_BUILD_TOOLS=OFF) ;;
      sentencepiece)
        tar -xf "$deps"/src/sentencepiece_*.orig.tar.* -C "$built/src"
        src_dir=$(ls -d "$built"/src/sentencepiece*/ | head -1)
        cmake_args=(-DSPM_ENABLE_SHARED=ON) ;;
    esac
    # CMake 4 refuses projects that ask for less than 3.5 unless told otherwise.
    cmake -S "$src_dir" -B "$built/build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_INSTALL_PREFIX="$built" -DCMAKE_INSTALL_LIBDIR=lib "${cmake_args[@]}"
    cmake --build "$built/build-$name" -j"$nproc" --target install
  done
  rm -rf "$built/src" "$built"/build-*
  touch "$stamp"
  echo "built from source: ${rebuild[*]}"
}
run_step deps "${XLME_GPU_CHECK_DEPS_S:-240}" "$out/deps.log" -- bash -c "$(declare -f deps_step); deps=$deps R=$R L=$L \
  work=$work built=$built runtime=$runtime nproc=$nproc deps_step"

# Search paths: libraries built here first, then the carried ones.
prefixes="$built;$R/usr"
export PATH="$built/bin:$R/usr/bin:$PATH"
export LD_LIBRARY_PATH="$built/lib:$runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$built/lib/pkgconfig"
export PKG_CONFIG_LIBDIR="$L/pkgconfig:$R/usr/share/pkgconfig"
pc_exe=$(command -v pkg-config || echo "$R/usr/bin/pkgconf")
# Debian's .pc files say prefix=/usr: pkgconf rewrites -I/-L into the folder. A wrapper, so that
# the libraries built here (real prefix) keep theirs.
mkdir -p "$work"
cat >"$work/pkg-config" <<EOF
#!/bin/sh
if [ -d "$built/lib/pkgconfig" ] &&
  PKG_CONFIG_LIBDIR="$built/lib/pkgconfig" "$pc_exe" --exists "\$@" >/dev/null 2>&1; then
  exec env PKG_CONFIG_LIBDIR="$built/lib/pkgconfig" "$pc_exe" "\$@"
fi
exec env PKG_CONFIG_SYSROOT_DIR="$R" "$pc_exe" "\$@"
EOF
chmod +x "$work/pkg-config"

# --- configure and build --------------------------------------------------------------------------
build="$work/build"
# Debian's development links are absolute (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13): on
# another system they dangle, and FindLibLZMA's symbol checks fail. Link the carried files.
carried() {  # carried LINK: the carried file a development link names
  local target
  target=$(readlink "$1") || { echo "$1"; return; }
  case "$target" in
    /*) echo "$R$target" ;;
    *) echo "$(dirname "$1")/$target" ;;
  esac
}
cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXLME_BUILD_TESTS=ON
  "-DCMAKE_PREFIX_PATH=${torch_prefix:+$torch_prefix;}$prefixes"
  "-DPKG_CONFIG_EXECUTABLE=$work/pkg-config"
  "-DZLIB_INCLUDE_DIR=$R/usr/include" "-DZLIB_LIBRARY=$(carried "$L/libz.so")"
  "-DLIBLZMA_INCLUDE_DIR=$R/usr/include" "-DLIBLZMA_LIBRARY=$(carried "$L/liblzma.so")"
  # Test discovery at test time: a binary that cannot start shows up as a failed test.
  -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST
  # The machine's python3 (its torch is the wheel's), or .venv's where it exists (CPU mode here).
  "-DXLME_PYTHON=$([ -x "$root/.venv/bin/python3" ] && echo "$root/.venv/bin/python3" || command -v python3)")
for pkg in yaml-cpp fmt spdlog CLI11 nlohmann_json GTest; do
  for dir in "$built/lib/cmake/$pkg" "$built/share/cmake/$pkg" "$L/cmake/$pkg" "$R/usr/share/cmake/$pkg" "$R/usr/lib/cmake/$pkg"; do
    [ -d "$dir" ] && { cmake_args+=("-D${pkg}_DIR=$dir"); break; }
  done
done
if [ -n "$cuda_root" ]; then
  cmake_args+=("-DCUDAToolkit_ROOT=$cuda_root" "-DCMAKE_CUDA_COMPILER=$cuda_root/bin/nvcc"
    -DTORCH_CUDA_ARCH_LIST=9.0)
fi
# The wheel's include folder may hold its own fmt/ (LibTorch's): xlme's fmt and spdlog must be the
# carried ones, which a -I (searched before every -isystem) guarantees.
fmt_first="$work/fmt-first"
rm -rf "$fmt_first"
mkdir -p "$fmt_first"
for d in fmt spdlog; do
  if [ -d "$built/include/$d" ]; then ln -s "$built/include/$d" "$fmt_first/$d"
  else ln -s "$R/usr/include/$d" "$fmt_first/$d"; fi
done
cmake_args+=("-DCMAKE_CXX_FLAGS=-I$fmt_first")

configure() {
  # Reconfigure only when the arguments changed (a warm machine keeps .gpubuild).
  if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/.gpu_check_args" 2>/dev/null)" = "${cmake_args[*]}" ]; then
    echo "configured earlier with the same arguments: reused"
    return 0
  fi
  rm -rf "$build"
  cmake "${cmake_args[@]}" && echo "${cmake_args[*]}" >"$build/.gpu_check_args"
}
run_step configure 150 "$out/build.log" -- bash -c "$(declare -f configure); build=$build; \
  cmake_args=($(printf '%q ' "${cmake_args[@]}")); configure"
built_ok=0
build_only=${XLME_GPU_CHECK_BUILD_ONLY:-0}
targets="xlme-pretrain xlme-export xlme-data xlme-finetune"
[ "$build_only" = 1 ] ||
  targets="$targets xlme_unit_tests xlme_integration_tests xlme-bench-ops xlme-bench-attn"
if [ -f "$build/build.ninja" ]; then
  run_step build "${XLME_GPU_CHECK_BUILD_S:-330}" "$out/build.log" -- \
    ninja -C "$build" -j"$nproc" $targets &&
    built_ok=1
else
  record build skipped 0 "not configured"
fi

else
  built_ok=1
  build_only=${XLME_GPU_CHECK_BUILD_ONLY:-0}
  record deps bundled 0 "the bundle carries the libraries"
  record build bundled 0 "the bundle's binaries (built from the same sources on a CPU machine)"
fi

# The build folder this check used (scripts/gpu_demo.sh reads it).
echo "$build" >"$work/build_dir"

# --- flags and header origins ---------------------------------------------------------------------
if [ -f "$build/build.ninja" ]; then
  flags_json="$state/flags.json"
  {
    for flag in XLME_WITH_CUDA USE_C10D_NCCL; do
      if grep -q -- "-D$flag" "$build/build.ninja"; then echo "$flag=1"; else echo "$flag=0"; fi
    done
    echo "GLOO_INCLUDE_DIR=$(grep -m1 '^GLOO_INCLUDE_DIR' "$build/CMakeCache.txt" | cut -d= -f2-)"
    echo "Torch_DIR=$(grep -m1 '^Torch_DIR' "$build/CMakeCache.txt" | cut -d= -f2-)"
    # The headers the compiler actually read (ninja's dependency log of the built objects).
    deps_log=$(ninja -C "$build" -t deps 2>/dev/null)
    for header in gloo/algorithm.h fmt/core.h spdlog/spdlog.h yaml-cpp/yaml.h zlib.h; do
      echo "header $header=$(echo "$deps_log" | grep -m1 "/$header\$" | sed 's/^ *//')"
    done
  } >"$flags_json"
  cat "$flags_json" >>"$out/build.log"
  missing=$(grep -E '^(XLME_WITH_CUDA|USE_C10D_NCCL)=0' "$flags_json" | cut -d= -f1 | tr '\n' ' ')
  if [ -n "$missing" ] && [ "$cpu_mode" != 1 ]; then
    record flags failed 0 "not in the build: $missing"
  else
    record flags ok 0 "$(tr '\n' ' ' <"$flags_json")"
  fi
fi

# --- CUDA tests -----------------------------------------------------------------------------------
# Processes run 4 at a time: one GPU holds them easily, and no CUDA test asserts a time.
if [ "$build_only" = 1 ]; then
  :  # the binaries only (scripts/gpu_demo.sh)
elif [ "$built_ok" = 1 ]; then
  export XLME_REFERENCE_PYTHON=${XLME_REFERENCE_PYTHON:-$(command -v python3)}
  in_plan cuda_tests && run_step cuda_tests "$(limit_of cuda_tests)" "$out/tests.log" -- \
    ctest --test-dir "$build" -R 'Cuda' -j4 -V --timeout 150 --output-junit "$out/tests.xml"
  # The attention tests again with the fused kernel wherever model::attention runs: CudaAttention.*
  # then compare it with float64 too.
  in_plan cuda_tests_fused_attention && XLME_OPS=attention=fused run_step \
    cuda_tests_fused_attention "$(limit_of cuda_tests_fused_attention)" "$out/tests.log" -- \
    ctest --test-dir "$build" -R 'CudaAttention|CudaOps\.FusedAttention' -j4 -V --timeout 60
  # The trainer-level tests that crashed at their end on the first GPU run, again outside ctest:
  # without the preloaded tcmalloc (ctest's environment), so that one run tells the allocator
  # apart from the rest; a crash prints its stack (tests/crash_stack.cpp).
  if in_plan crash_rerun; then
    echo "### crash_rerun: without LD_PRELOAD" >>"$out/tests.log"
    run_step crash_rerun "$(limit_of crash_rerun)" "$out/tests.log" -- env -u LD_PRELOAD OMP_WAIT_POLICY=PASSIVE \
      "$build/tests/xlme_integration_tests" --gtest_filter='CudaTrainer.ResumedRun*:CudaDist.TwoGloo*:CudaExport.*'
  fi
  # The trainer's tests with every fused op: a resumed run equals the uninterrupted one only if
  # the fused kernels are deterministic and draw from the saved generator state.
  in_plan cuda_trainer_fused && XLME_OPS=fused run_step cuda_trainer_fused "$(limit_of cuda_trainer_fused)" "$out/tests.log" -- \
    ctest --test-dir "$build" -R 'CudaTrainer|CudaDist|CudaExport' -j4 -V --timeout 80
else
  record cuda_tests skipped 0 "the build failed"
fi

# --- benchmarks -----------------------------------------------------------------------------------
bench() {  # bench NAME STEPS CONFIG SETTINGS... [-- MORE ARGUMENTS]
  local name=$1 steps=$2 config=$3
  shift 3
  in_plan "$name" || return 0
  local args=(--config "$config" --benchmark "$steps" --log-level warn --set "run.out_dir=$work/bench-run")
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=(--set "$1"); shift; done
  [ "${1:-}" = -- ] && { shift; args+=("$@"); }
  echo "### $name" >>"$out/bench.log"
  run_step "$name" "$(limit_of "$name")" "$out/bench.log" -- "$build/xlme-pretrain" "${args[@]}"
}
peer() {  # peer NAME ARGUMENTS...: scripts/peer_hf_electra.py with the Base shapes
  local name=$1
  shift
  in_plan "$name" || return 0
  [ "$cpu_mode" = 1 ] && return 0
  echo "### $name" >>"$out/bench.log"
  run_step "$name" "$(limit_of "$name")" "$out/bench.log" -- python3 "$root/scripts/peer_hf_electra.py" "$@"
}
if [ "$build_only" = 1 ]; then
  :
elif [ "$built_ok" = 1 ]; then
  if [ "$cpu_mode" = 1 ]; then
    # CPU stand-ins for checking the script: the benchmark shapes of the CPU reference.
    base=(configs/pretrain/benchmark/cpu_tiny.yaml model.vocab_size=500 train.precision=bf16)
    small=(configs/pretrain/benchmark/cpu_tiny.yaml model.vocab_size=500 model.layers=1)
    steps=1
    ops_steps=2
  else
    # base.yaml's 1M tokens per task and step would be 64 micro-batches per task on one GPU: 4
    # are enough for the figures (tokens/s, MFU and the phase split are per micro-batch).
    base=(configs/pretrain/base.yaml train.precision=bf16 train.tokens_per_task=65536)
    small=(configs/pretrain/demo_small_gpu.yaml model.vocab_size=8000 train.precision=bf16)
    steps=8
    ops_steps=10
  fi
  # Each fused op against its reference (docs/ops.md), alone, then the attention alone: math, SDPA
  # (today's path), the fused kernel, cuDNN's SDPA with the same mask and the flash kernel without
  # bias (the ceiling), at Base's shapes.
  if in_plan ops_bench; then
    echo "### ops_bench" >>"$out/bench.log"
    run_step ops_bench "$(limit_of ops_bench)" "$out/bench.log" -- "$build/tests/xlme-bench-ops" --steps "$ops_steps"
  fi
  if in_plan attn_bench; then
    echo "### attn_bench" >>"$out/bench.log"
    run_step attn_bench "$(limit_of attn_bench)" "$out/bench.log" -- "$build/tests/xlme-bench-attn" --steps "$ops_steps"
  fi
  # Without dropout: what the Philox draws cost each kernel.
  if in_plan attn_bench_no_dropout; then
    echo "### attn_bench_no_dropout" >>"$out/bench.log"
    run_step attn_bench_no_dropout "$(limit_of attn_bench_no_dropout)" "$out/bench.log" -- "$build/tests/xlme-bench-attn" \
      --steps "$ops_steps" --dropout 0
  fi
  # The Base step: the reference step (SDPA, no Triton kernel; the one-hot table gradient), the
  # default (`auto`), every fused op, each alone (the A/B that decides `auto`), CUDA graphs, both
  # again (the spread between two runs of the same thing).
  reference_ops=reference,toeplitz_bias=fused
  XLME_OPS=$reference_ops bench bench_base_sdpa "$steps" "${base[0]}" "${base[@]:1}" \
    model.attention=sdpa
  XLME_OPS= bench bench_base_auto "$steps" "${base[0]}" "${base[@]:1}" model.attention=sdpa
  XLME_OPS=fused bench bench_base_fused "$steps" "${base[0]}" "${base[@]:1}" model.attention=sdpa
  for op in attention masked_lm residual_layernorm feed_forward weight_grad; do
    XLME_OPS=$reference_ops,$op=fused bench "bench_base_$op" "$steps" "${base[0]}" "${base[@]:1}" \
      model.attention=sdpa
  done
  XLME_OPS=$reference_ops bench bench_base_graphs "$steps" "${base[0]}" "${base[@]:1}" \
    model.attention=sdpa train.cuda_graphs=on
  peer peer_base_default
  # Where a Base step's device time goes (CUDA-event times per operator), into bench.log.
  profile() {  # profile NAME OPS
    in_plan "$1" || return 0
    rm -f "$work/profile.txt"
    XLME_OPS=$2 bench "$1" 2 "${base[0]}" "${base[@]:1}" model.attention=auto -- --profile \
      "$work/profile.txt"
    [ -f "$work/profile.txt" ] && { echo "### $1 table"; head -c 40000 "$work/profile.txt"; } \
      >>"$out/bench.log"
  }
  profile profile_base_fused fused
  XLME_OPS=$reference_ops bench bench_base_sdpa_again "$steps" "${base[0]}" "${base[@]:1}" \
    model.attention=sdpa
  XLME_OPS= bench bench_base_auto_again "$steps" "${base[0]}" "${base[@]:1}" model.attention=sdpa
  XLME_OPS=weight_grad=fused bench bench_base_auto_weight_grad "$steps" "${base[0]}" \
    "${base[@]:1}" model.attention=sdpa
  # CUDA graphs with the default ops: the random ones give way to their references (GraphSafeOps).
  XLME_OPS= bench bench_base_auto_graphs "$steps" "${base[0]}" "${base[@]:1}" model.attention=sdpa \
    train.cuda_graphs=on
  peer peer_base_fused-adam --fused-adam
  profile profile_base ""
  bench bench_base_math "$steps" "${base[0]}" "${base[@]:1}" model.attention=math
  bench bench_small_sdpa "$steps" "${small[0]}" "${small[@]:1}" model.attention=sdpa
  # Micro-batches of 64 sequences (fit in 80 GB: 38 GiB on an H200).
  [ "$cpu_mode" != 1 ] && bench bench_base_sdpa_mb64 "$steps" "${base[0]}" "${base[@]:1}" \
    model.attention=sdpa train.micro_batch_tokens=32768
  [ "$cpu_mode" != 1 ] && XLME_OPS= bench bench_base_auto_mb64 "$steps" "${base[0]}" \
    "${base[@]:1}" model.attention=sdpa train.micro_batch_tokens=32768
  # The fused attention's three kernels under Nsight Compute (one launch each): throughput,
  # occupancy, launch statistics, warp stalls.
  if in_plan ncu_attention && [ "$cpu_mode" != 1 ]; then
    echo "### ncu_attention" >>"$out/bench.log"
    if command -v ncu >/dev/null; then
      # The benchmark times the forwards before the backwards: one invocation for each.
      ncu_attention() {
        local sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
          --section WarpStateStats)
        ncu --target-processes all -k regex:attention_forward --launch-count 1 "${sections[@]}" \
          "$1" --steps 1 &&
          ncu --target-processes all -k regex:attention_backward --launch-count 2 \
            "${sections[@]}" "$1" --steps 1
      }
      run_step ncu_attention "$(limit_of ncu_attention)" "$out/bench.log" -- bash -c "$(declare -f ncu_attention); \
        ncu_attention $build/tests/xlme-bench-attn"
    else
      record ncu_attention skipped 0 "no ncu on this machine"
    fi
  fi
  peer peer_base_compiled --compile --warmup-steps 4
else
  record benchmarks skipped 0 "the build failed"
fi

# --- summary --------------------------------------------------------------------------------------
python3 - "$state/steps.tsv" "$out" "${flags_json:-}" "$cpu_mode" "$(( $(date +%s) - start_all ))" <<'EOF'
import json, os, re, sys, xml.etree.ElementTree as ET
steps_tsv, out, flags_file, cpu_mode, total = sys.argv[1:6]
steps = {}
for line in open(steps_tsv):
    name, status, seconds, detail = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
    steps[name] = {"status": status, "seconds": int(seconds), "detail": detail}
summary = {"ok": all(s["status"] in ("ok", "bundled", "unbundled") for s in steps.values()),
           "cpu_mode": cpu_mode == "1",
           "total_seconds": int(total), "steps": steps}
env = open(os.path.join(out, "env.log")).read()
summary["env"] = {}
for line in env.splitlines():
    m = re.match(r"^--- ([\w -]+): (.*)$", line) or re.match(r"^(torch|device|cmake_prefix_path|wheel include has) (.*)$", line)
    if m:
        summary["env"][m.group(1)] = m.group(2).strip()
if flags_file and os.path.exists(flags_file):
    flags = {}
    for line in open(flags_file):
        key, _, value = line.rstrip("\n").partition("=")
        flags[key] = value
    summary["build"] = flags
# Benchmarks: the JSON line each printed, in the order they ran.
bench = {}
name = None
for line in open(os.path.join(out, "bench.log")):
    if line.startswith("### "):
        name = line[4:].strip()
    elif line.startswith("{") and name:
        try:
            bench[name] = json.loads(line)
        except ValueError:
            pass
summary["benchmarks"] = bench
# The A/B of the Base step: each variant's tokens/s over the reference step's.
if bench.get("bench_base_sdpa", {}).get("tokens_per_s"):
    ref = bench["bench_base_sdpa"]["tokens_per_s"]
    summary["base_over_reference"] = {name: round(b["tokens_per_s"] / ref, 4)
                                      for name, b in bench.items()
                                      if name.startswith("bench_base_") and b.get("tokens_per_s")}
if "bench_base_sdpa" in bench and "bench_base_math" in bench:
    summary["sdpa_over_math_tokens_per_s"] = {
        size: bench[f"bench_{size}_sdpa"]["tokens_per_s"] / bench[f"bench_{size}_math"]["tokens_per_s"]
        for size in ("base", "small") if f"bench_{size}_sdpa" in bench and f"bench_{size}_math" in bench}
# CUDA tests: status per test, the skip reasons and the figures the tests print.
tests = {}
xml_path = os.path.join(out, "tests.xml")
if os.path.exists(xml_path):
    try:
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            status = case.get("status") or ("failed" if case.find("failure") is not None else "run")
            status = {"notrun": "skipped"}.get(status, status)
            tests[case.get("name")] = {"status": status, "seconds": case.get("time")}
    except ET.ParseError as e:
        tests["(tests.xml unreadable)"] = {"status": str(e)}
log = open(os.path.join(out, "tests.log"), errors="replace").read()
# ctest -j -V prefixes each line with its test's number ("12: "); lines of tests run directly
# (crash_rerun) have none. Each prefix has its own current test.
# Each step's own outcome per test (ok, failed, crashed: a test that started and never ended).
current = {}
step = None
runs = {}
for line in log.splitlines():
    m = re.match(r"^=== step (\S+)", line)
    if m:
        step, current = m.group(1), {}
        continue
    m = re.match(r"^(\d+): (.*)$", line)
    prefix, text = (m.group(1), m.group(2)) if m else ("", line)
    m = re.search(r"\[ RUN      \] (\S+)", text)
    if m:
        current[prefix] = m.group(1)
        tests.setdefault(m.group(1), {})
        runs.setdefault(step, {})[m.group(1)] = "crashed or cut"
        continue
    name = current.get(prefix)
    if not name:
        continue
    m = re.search(r"\[ +(OK|FAILED|SKIPPED) +\] (\S+) \(", text)
    if m and m.group(2) in runs.get(step, {}):  # a worker process's own tests print lines too
        runs[step][m.group(2)] = m.group(1).lower()
    m = re.search(r"\[ (no CUDA|rel\.err\.|sdpa|sampler|parity)\s*\] (.*)", text)
    if m:
        tests[name].setdefault("notes", []).append(m.group(2))
    m = re.search(r"\[  FAILED  \] (\S+) \(", text)
    if m and m.group(1) == name:
        tests[name].setdefault("failed_in", []).append(line[:120])
    if "fatal signal" in text or re.search(r"^\S+\(\+0x|\[0x[0-9a-f]+\]$", text):
        tests[name].setdefault("crash", []).append(text[:200])
summary["cuda_tests"] = tests
summary["test_runs"] = runs
skipped = [name for name, t in tests.items() if t.get("status") == "skipped"]
if skipped and cpu_mode != "1":  # on a GPU machine nothing may skip
    summary["ok"] = False
    summary["cuda_tests_skipped_on_gpu_machine"] = skipped
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(summary, f, indent=1)
print("==> summary (%s/gpu_check.json): %s in %s s" % (out, "all ok" if summary["ok"] else "FAILURES", total))
for name, s in steps.items():
    print("  %-18s %-8s %4d s %s" % (name, s["status"], s["seconds"], s["detail"][:160]))
for name, b in bench.items():
    print("  %-30s %8.0f tokens/s  mfu %s  peak %s MiB  loss %s -> %s  skipped %s  %s" % (
          name, b.get("tokens_per_s", 0), b.get("mfu"), round(b.get("peak_memory_mib") or 0),
          b.get("loss_first"), b.get("loss_last"), b.get("skipped_steps"),
          {k[:-3]: round(v, 1) for k, v in b.items() if k.endswith("_ms")}))
for name, ratio in summary.get("base_over_reference", {}).items():
    print("  %-30s %.3f x the reference step" % (name, ratio))
# Last, as the device tool's reply shows the end of the output: tests, their notes and crashes.
for name, t in tests.items():
    notes = list(dict.fromkeys(t.get("notes", [])))
    print("  %-58s %-7s %s" % (name[:58], t.get("status"), "; ".join(notes)[:110]))
    for c in t.get("crash", [])[:12]:
        print("      crash: %s" % c[:160])
for step_name, results in runs.items():
    bad = {n: r for n, r in results.items() if r not in ("ok", "skipped")}
    print("  %s: %d tests, %d ok, %d skipped; neither: %s" % (step_name, len(results),
          sum(r == "ok" for r in results.values()), sum(r == "skipped" for r in results.values()),
          bad or "none"))
EOF
# Bounded logs: the device tool brings back 16 MiB per file.
for f in "$out"/*.log; do
  [ "$(stat -c %s "$f")" -gt 8000000 ] && { tail -c 8000000 "$f" >"$f.tail" && mv "$f.tail" "$f"; }
done
exit 0
