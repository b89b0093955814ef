#!/usr/bin/env bash
# Runs every test: installs and builds what is missing (scripts/setup.sh, with warnings as
# errors; after scripts/quickstart.sh only the tests remain to build), then the whole suite
# through CTest. Exits non-zero on any failure.
#
#   scripts/test.sh [CTEST ARGS...]      e.g. scripts/test.sh -R Config
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${XLME_BUILD_DIR:-build}
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
export XLME_BUILD_DIR="$build_dir"

"$root/scripts/setup.sh"
echo "==> running the tests"
start=$(date +%s)
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
echo "==> tests passed in $(( $(date +%s) - start )) s"
