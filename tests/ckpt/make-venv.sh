#!/usr/bin/env bash
# make-venv.sh DIR: a Python virtual environment in DIR with the reference
# `safetensors` reader/writer and numpy from PyPI, for the Hugging Face
# interop tests (tests/ckpt/hf_interop.sh). Idempotent: an existing DIR whose
# python imports both is kept. Exit 0 when ready; 77 (skip) when no Python
# venv or no package index can be reached.
set -u
dir=$1
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import safetensors.numpy, numpy" 2>/dev/null; then
  exit 0
fi
py=$(command -v python3) || { echo "make-venv.sh: no python3" >&2; exit 77; }
rm -rf "$dir"
"$py" -m venv "$dir" || { echo "make-venv.sh: python3 -m venv failed (python3-venv missing?)" >&2; exit 77; }
if ! "$dir/bin/python" -m pip install -q --disable-pip-version-check "safetensors>=0.4,<1" "numpy>=1.23"; then
  echo "make-venv.sh: pip could not install safetensors and numpy (no package index?)" >&2
  rm -rf "$dir"
  exit 77
fi
"$dir/bin/python" -c "import safetensors.numpy, numpy" || exit 1
