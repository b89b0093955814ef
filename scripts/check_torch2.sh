#!/usr/bin/env bash
# Builds and tests xlme against LibTorch 2.x on a machine without a GPU, inside a Debian chroot
# that it makes with debootstrap (needs root and Debian's package mirror). The working tree is
# bind-mounted read-write at /xlme/main; the build folder is /build inside the chroot.
#
#   scripts/check_torch2.sh [cpu|cuda|sid] [-- CTEST ARGS (cpu, sid)]
#
#   cpu  (default) Debian 13's libtorch-dev (2.6, CPU) and GCC 14: scripts/test.sh, the whole
#        suite with warnings as errors; AttentionKernel.SdpaMatchesMath runs (1.13 skips it).
#   cuda Debian 13's CUDA LibTorch (libtorch-cuda-dev 2.6, contrib) with CUDA 12.4 and NCCL
#        (non-free): compiles and links everything with -Werror, the CUDA-only code
#        (XLME_WITH_CUDA) and the NCCL process group included. Nothing runs: Debian's
#        nvidia-cudnn only downloads cuDNN from NVIDIA (out of reach here), and LibTorch's CUDA
#        library needs libcudnn.so.9 to load; the links ignore its missing symbols. Running
#        needs a GPU machine with PyTorch's wheel (docs/gpu.md#building-for-gpus).
#   sid  Debian unstable's libtorch-dev (the newest LibTorch Debian has), like cpu.
#
# Environment: XLME_CHROOT_DIR (default /var/tmp/xlme-chroot-MODE) is kept and reused by the
# next run. Downloads: about 1 GB for cpu, 4.5 GB for cuda.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-cpu}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
case "$mode" in
  cpu | cuda) suite=trixie ;;
  sid) suite=sid ;;
  -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
  *) echo "check_torch2.sh: unknown mode '$mode'; use cpu, cuda or sid (see --help)" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "check_torch2.sh: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
dir=${XLME_CHROOT_DIR:-/var/tmp/xlme-chroot-$mode}
mirror=http://deb.debian.org/debian

"$root/scripts/install_packages.sh" debootstrap
if [ ! -x "$dir/usr/bin/apt-get" ]; then
  echo "==> debootstrap $suite into $dir"
  debootstrap --variant=minbase "$suite" "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 || {
    tail -20 "$dir.debootstrap.log" >&2
    echo "check_torch2.sh: debootstrap failed (log: $dir.debootstrap.log)" >&2
    exit 1
  }
fi
echo "deb $mirror $suite main contrib non-free" >"$dir/etc/apt/sources.list"
cp /etc/resolv.conf "$dir/etc/resolv.conf"
# A mirror that serves a frozen copy of the archive (as here) has Release files past their
# Valid-Until date; apt would refuse them. This chroot is a throwaway build environment.
echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/99xlme-frozen-mirror"

# Mounts, undone in reverse order on any exit.
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" || true; done
}
trap cleanup EXIT
bind() {  # bind SOURCE TARGET-INSIDE-THE-CHROOT
  mkdir -p "$dir$2"
  mountpoint -q "$dir$2" || { mount --bind "$1" "$dir$2" && mounted+=("$dir$2"); }
}
for d in /proc /sys /dev /dev/pts; do bind "$d" "$d"; done
bind "$root" /xlme/main
[ -d "$root/../shared" ] && bind "$(cd "$root/../shared" && pwd)" /xlme/shared
in_chroot() { chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

if [ "$mode" != cuda ]; then
  # sid's sentencepiece headers include Abseil's without depending on libabsl-dev.
  [ "$mode" = sid ] && in_chroot env DEBIAN_FRONTEND=noninteractive apt-get install -y -q libabsl-dev >/dev/null
  in_chroot bash -c 'cd /xlme/main && XLME_BUILD_DIR=/build scripts/test.sh "$@"' _ "$@"
  exit
fi

# The CUDA LibTorch replaces the CPU one, Gloo and PyTorch.
packages=()
for p in $("$root/scripts/setup.sh" --print-packages); do
  case "$p" in
    libtorch-dev) packages+=(libtorch-cuda-dev nvidia-cuda-toolkit libnccl-dev) ;;
    libgloo-dev) packages+=(libgloo-cuda-dev) ;;
    python3-torch) packages+=(python3-torch-cuda) ;;
    *) packages+=("$p") ;;
  esac
done
echo "==> installing the CUDA LibTorch and the rest of xlme's packages into $dir"
in_chroot apt-get update -q >/dev/null
# nvidia-cudnn's set-up downloads cuDNN from NVIDIA, which is out of reach here; xlme needs no
# cuDNN (the build says "Compiling without cuDNN support"), so its set-up is skipped.
if ! in_chroot env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" \
  >"$dir.apt.log" 2>&1; then
  grep -q "nvidia-cudnn" "$dir.apt.log" || { tail -30 "$dir.apt.log" >&2; exit 1; }
  echo "exit 0" >"$dir/var/lib/dpkg/info/nvidia-cudnn.postinst"
  in_chroot dpkg --configure -a >>"$dir.apt.log" 2>&1
fi
in_chroot bash -c '
  set -e
  # Test discovery runs the test binaries, which cannot load here: deferred to ctest.
  cmake -S /xlme/main -B /build -G Ninja -DXLME_WERROR=ON -DXLME_BUILD_TESTS=ON \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--unresolved-symbols=ignore-in-shared-libs \
    >/build.configure.log 2>&1 || { cat /build.configure.log; exit 1; }
  grep "xlme: LibTorch" /build.configure.log
  for flag in XLME_WITH_CUDA USE_C10D_NCCL; do
    grep -q "$flag" /build/build.ninja || { echo "not a CUDA build: $flag is off" >&2; exit 1; }
  done
  echo "==> building with XLME_WITH_CUDA and USE_C10D_NCCL"
  cmake --build /build
  echo "==> the CUDA build compiles and links (nothing can run here: no cuDNN, no GPU)"
'
