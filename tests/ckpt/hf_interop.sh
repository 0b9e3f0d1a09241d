#!/usr/bin/env bash
# hf_interop.sh PYTHON ARGS...: runs hf_interop.py with PYTHON, the virtual
# environment of .ci/install-python (build/venv), which has the reference
# `safetensors` package. Without it the test fails with a hint: it is only
# registered when that environment exists, so a missing package is an error,
# never a silent skip.
py=$1
shift
"$py" -c "import safetensors.numpy, numpy" || {
  echo "hf_interop.sh: $py cannot import safetensors and numpy: run .ci/install-python" >&2
  exit 1
}
exec "$py" "$(dirname "$0")/hf_interop.py" "$@"
