#!/usr/bin/env bash
# Makes the project's virtual environment (.venv in the checkout, git-ignored; XLME_VENV names
# another) and installs requirements.txt into it: torch==2.11.0 (PyPI's CUDA 13.0 build, whose
# LibTorch xlme builds against) and the Python side's packages, every version pinned. Skipped when
# the environment already holds exactly this requirements.txt (a stamp file records it). Prints
# how long it took. Used by setup.sh.
#
# The installer is uv (PyPI's `uv`, pinned below, put into the environment by its own pip): the
# same pinned set as pip installs, downloaded in parallel and unpacked once into uv's cache
# (~/.cache/uv, 4.7 GB), from which a new checkout's environment is linked in seconds. pip does it
# alone where uv cannot be installed or fails, or with XLME_INSTALLER=pip.
#
#   scripts/install_python.sh
#
# Environment: XLME_VENV (default: .venv), XLME_BASE_PYTHON (the Python that makes the
# environment; default python3, 3.10 or later), XLME_INSTALLER (uv or pip; default uv), PIP_*
# (pip's own settings; PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS and PIP_CERT are passed
# on to uv unless its own UV_* or SSL_CERT_FILE are set), UV_* (uv's own settings).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${XLME_VENV:-$root/.venv}
base=${XLME_BASE_PYTHON:-python3}
requirements=$root/requirements.txt
stamp=$venv/.xlme-requirements
installer=${XLME_INSTALLER:-uv}
case "$installer" in uv|pip) ;; *)
  echo "install_python.sh: XLME_INSTALLER='$installer'; use uv or pip" >&2; exit 2 ;;
esac

if [ -x "$venv/bin/python3" ] && [ -f "$stamp" ] && cmp -s "$requirements" "$stamp"; then
  echo "==> Python packages: $venv holds requirements.txt ($("$venv/bin/python3" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
command -v "$base" >/dev/null ||
  { echo "install_python.sh: no '$base' on PATH to make $venv (set XLME_BASE_PYTHON)" >&2; exit 1; }
"$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  { echo "install_python.sh: $base is $("$base" --version 2>&1); torch 2.11 needs Python 3.10 or later (set XLME_BASE_PYTHON)" >&2; exit 1; }
if [ ! -x "$venv/bin/python3" ]; then
  echo "==> making the virtual environment $venv ($("$base" --version 2>&1))"
  "$base" -m venv "$venv" || {
    echo "install_python.sh: '$base -m venv $venv' failed; on Debian install python3-venv" >&2
    exit 1
  }
fi
echo "==> installing requirements.txt into $venv with $installer (torch 2.11.0 with its CUDA libraries: a 2.7 GB download, 5 GB installed, the first time)"
start=$(date +%s)
pip_install() {
  "$venv/bin/python3" -m pip install --disable-pip-version-check -q --no-input "$@"
}
uv_version=0.13.9
if [ "$installer" = uv ] && [ "$("$venv/bin/uv" --version 2>/dev/null)" != "uv $uv_version" ]; then
  pip_install "uv==$uv_version" || {
    echo "install_python.sh: could not install uv $uv_version with pip (above); installing with pip" >&2
    installer=pip
  }
fi
if [ "$installer" = uv ]; then
  # pip's settings for where packages come from, for uv, which reads only its own.
  [ -n "${PIP_INDEX_URL:-}" ] && [ -z "${UV_INDEX_URL:-}${UV_DEFAULT_INDEX:-}" ] &&
    export UV_INDEX_URL=$PIP_INDEX_URL
  [ -n "${PIP_EXTRA_INDEX_URL:-}" ] && [ -z "${UV_EXTRA_INDEX_URL:-}${UV_INDEX:-}" ] &&
    export UV_EXTRA_INDEX_URL=$PIP_EXTRA_INDEX_URL
  [ -n "${PIP_FIND_LINKS:-}" ] && [ -z "${UV_FIND_LINKS:-}" ] && export UV_FIND_LINKS=$PIP_FIND_LINKS
  [ -n "${PIP_CERT:-}" ] && [ -z "${SSL_CERT_FILE:-}" ] && export SSL_CERT_FILE=$PIP_CERT
  "$venv/bin/uv" pip install --python "$venv/bin/python3" -q -r "$requirements" || {
    echo "install_python.sh: uv could not install requirements.txt (above); trying pip" >&2
    installer=pip
  }
fi
if [ "$installer" = pip ]; then
  pip_install -r "$requirements" || {
    echo "install_python.sh: pip could not install requirements.txt into $venv (above): check the network, or PIP_INDEX_URL for a mirror" >&2
    exit 1
  }
fi
"$venv/bin/python3" -c 'import torch, numpy, sentencepiece, safetensors, transformers, matplotlib' || {
  echo "install_python.sh: the packages installed but do not import (above); remove $venv and run again" >&2
  exit 1
}
cp "$requirements" "$stamp"
echo "==> Python packages installed with $installer in $(( $(date +%s) - start )) s"
