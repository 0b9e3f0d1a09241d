"""
mfsdp: Python bindings of libmfsdp (the replay runtime) and mfsdpc (the
compiler) for sharded data-parallel training.

    import mfsdp
    sched = mfsdp.Schedule.compile(open("model.mfsdp").read())   # or Schedule.load("m.yaml")
    rt = mfsdp.Runtime(sched, backend="mpi")

Importing mfsdp needs neither torch nor NumPy; `mfsdp.torch` (the torch
integration) needs torch. See docs/pytorch.md.
"""
from ._lib import ALL_RANKS, CompileError, MfsdpError, UsageError
from .checkpoint import Loaded, read_manifest
from .checkpoint import verify as verify_checkpoint
from .convert import convert
from .runtime import LocalGroup, Runtime, Stats, View, backend_available
from .schedule import Schedule, TensorFacts

__all__ = ["MfsdpError", "UsageError", "CompileError", "Schedule", "TensorFacts", "Runtime",
           "LocalGroup", "View", "Stats", "backend_available", "version",
           "convert", "ALL_RANKS", "Loaded", "read_manifest", "verify_checkpoint"]


def version() -> str:
    """The loaded libmfsdp's version string."""
    from . import _lib
    return _lib.load().mfsdp_version().decode()
