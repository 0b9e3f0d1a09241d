"""
compile: reaching mfsdpc from Python.

`python -m mfsdp.compile ARGS...` (and the `mfsdpc` console script the package
installs) runs the mfsdpc binary shipped inside the package with ARGS;
compile_text() compiles spec text to schedule YAML in memory (through a
temporary directory, removed afterwards) and raises CompileError carrying
mfsdpc's located diagnostics when the spec is invalid.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import List, Optional

from ._lib import CompileError


def mfsdpc_path() -> str:
    """The mfsdpc binary: $MFSDPC, the one inside this package (bin/mfsdpc),
    else the first on PATH that is not this package's console script."""
    env = os.environ.get("MFSDPC")
    if env:
        return os.path.abspath(env)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "mfsdpc")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mfsdpc")
    if found and not is_script(found):
        return found
    raise FileNotFoundError("mfsdpc not found: install the package with `pip install .` "
                            "or set MFSDPC to the path of the mfsdpc binary")


def is_script(path: str) -> bool:
    """Whether the file at path starts with #! (a wrapper script, not the binary)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def compile_text(spec: str, name: str = "spec") -> bytes:
    """Compiles spec text (str) to compiled-schedule YAML (bytes)."""
    exe = mfsdpc_path()
    base = os.path.basename(name) or "spec"
    if not base.endswith(".mfsdp"):
        base += ".mfsdp"
    with tempfile.TemporaryDirectory(prefix="mfsdp-") as tmp:
        src = os.path.join(tmp, base)
        out = os.path.join(tmp, "out.yaml")
        with open(src, "w", encoding="utf-8") as f:
            f.write(spec)
        proc = subprocess.run([exe, "compile", src, "-o", out], capture_output=True,
                              text=True, cwd=tmp)
        if proc.returncode != 0:
            raise CompileError(proc.stderr, proc.returncode)
        with open(out, "rb") as f:
            return f.read()


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        exe = mfsdpc_path()
    except FileNotFoundError as e:
        print("mfsdpc: %s" % e, file=sys.stderr)
        return 2
    return subprocess.call([exe] + list(argv))


if __name__ == "__main__":
    sys.exit(main())
