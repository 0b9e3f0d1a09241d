#!/usr/bin/env bash
# hf_interop.sh VENV ARGS...: runs hf_interop.py with the virtual
# environment that make-venv.sh made (the ckpt_venv test); skips (77) when
# that environment could not be made (no package index).
venv=$1
shift
[ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import safetensors" 2>/dev/null || {
  echo "hf_interop.sh: no $venv with safetensors (see the ckpt_venv test): skipped" >&2
  exit 77
}
exec "$venv/bin/python" "$(dirname "$0")/hf_interop.py" "$@"
