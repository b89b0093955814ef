#!/usr/bin/env bash
# Makes the project's virtual environment (.venv in the checkout, git-ignored; XLME_VENV names
# another) and installs requirements.txt into it with pip: torch==2.11.0 (PyPI's CUDA 13.0 build,
# whose LibTorch xlme builds against) and the Python side's packages, every version pinned. Skipped
# when the environment already holds exactly this requirements.txt (a stamp file records it).
# Prints what it downloaded and how long it took. Used by setup.sh.
#
#   scripts/install_python.sh
#
# Environment: XLME_VENV (default: .venv), XLME_BASE_PYTHON (the Python that makes the
# environment; default python3, 3.10 or later), PIP_* (pip's own settings, e.g. PIP_INDEX_URL).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${XLME_VENV:-$root/.venv}
base=${XLME_BASE_PYTHON:-python3}
requirements=$root/requirements.txt
stamp=$venv/.xlme-requirements

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
echo "==> installing requirements.txt into $venv (torch 2.11.0 with its CUDA libraries: a 2.7 GB download, 5 GB installed, the first time)"
start=$(date +%s)
before=$(du -sm "$venv" | cut -f1)
"$venv/bin/python3" -m pip install --disable-pip-version-check -q --no-input -r "$requirements"
"$venv/bin/python3" -c 'import torch, numpy, sentencepiece, safetensors, transformers, matplotlib' || {
  echo "install_python.sh: the packages installed but do not import (above); remove $venv and run again" >&2
  exit 1
}
cp "$requirements" "$stamp"
echo "==> Python packages installed in $(( $(date +%s) - start )) s ($(( $(du -sm "$venv" | cut -f1) - before )) MB added to $venv)"
