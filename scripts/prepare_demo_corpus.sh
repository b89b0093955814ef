#!/usr/bin/env bash
# Builds the offline demo corpus (docs/data.md#the-offline-demo-corpus) from Debian packages: installs a fixed list of
# packages that carry gettext catalogs and translated man pages, then runs
# `xlme-data demo-corpus`. Needs no network beyond Debian's package mirror.
#
#   scripts/prepare_demo_corpus.sh [OUT_DIR]     (default: data/demo)
#
# Environment: XLME_BUILD_DIR (default: build) holds xlme-data.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-data/demo}
build_dir=${XLME_BUILD_DIR:-build}
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac

# Catalogs (/usr/share/locale/<lang>/LC_MESSAGES/*.mo) and man pages (/usr/share/man/<lang>/).
packages=(
  iso-codes coreutils libc-l10n libglib2.0-data libgtk-3-common dpkg apt git gnupg-l10n
  binutils-common tar bash wget xkb-data gsettings-desktop-schemas gcc-12-locales
  util-linux-locales findutils diffutils sed grep e2fsprogs
  manpages-de manpages-fr manpages-es manpages-ru manpages-ja manpages-pl manpages-it
  manpages-nl manpages-pt-br manpages-uk
)

"$root/scripts/install_packages.sh" "${packages[@]}"
if grep -rqs "path-exclude.*/usr/share/\(locale\|man\)" /etc/dpkg/dpkg.cfg.d/; then
  echo "prepare_demo_corpus.sh: dpkg is configured to drop /usr/share/locale or /usr/share/man" >&2
  echo "  (a 'minimized' image: see /etc/dpkg/dpkg.cfg.d/); remove those path-exclude lines and" >&2
  echo "  reinstall the packages above" >&2
  exit 1
fi

[ -x "$build_dir/xlme-data" ] || { echo "prepare_demo_corpus.sh: $build_dir/xlme-data not built; run scripts/setup.sh" >&2; exit 1; }
"$build_dir/xlme-data" demo-corpus --out "$out"
