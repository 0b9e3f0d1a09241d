"""
conftest: how the Python tests find the library, the compiler and mpirun.

They run against the build tree (MFSDP_LIBRARY, MFSDPC, PYTHONPATH set by
CTest, tests/python/CMakeLists.txt) or against an installed package (when
those are unset). Multi-process tests use mpirun --oversubscribe -np 4.
"""
import os
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def mpirun():
    exe = os.environ.get("MFSDP_MPIEXEC") or shutil.which("mpirun")
    if not exe:
        pytest.skip("mpirun not found")
    return [exe, "--oversubscribe", "-np", "4"]


def env():
    e = dict(os.environ)
    e.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    e["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in [e.get("PYTHONPATH")] if p])
    return e


def run_ranks(script, args, timeout):
    """Runs tests/python/SCRIPT on 4 MPI ranks; returns the CompletedProcess."""
    cmd = mpirun() + [sys.executable, os.path.join(HERE, script)] + list(args)
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (torch.distributed's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
