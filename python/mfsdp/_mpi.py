"""
_mpi: the MPI communicator handle the MPI backend needs, without mpi4py.

mfsdp_config.mpi_comm is a pointer to an MPI_Comm. With mpi4py, pass its
communicator and its handle's address is used (MPI._addressof). Without it,
MPI is initialised here (MPI_Init_thread with MPI_THREAD_MULTIPLE, through the
libmpi that libmfsdp links) and MPI_COMM_WORLD is built from the MPI ABI of
that library: Open MPI's handle is the address of ompi_mpi_comm_world, MPICH's
the integer 0x44000000. MPI_Finalize runs at exit, after every runtime is
destroyed.
"""
from __future__ import annotations

import atexit
import ctypes
import weakref
from typing import Any, Dict, Tuple

from . import _lib
from ._lib import MfsdpError

MPI_THREAD_MULTIPLE = 3     # the same value in Open MPI and MPICH
_MPICH_COMM_WORLD = 0x44000000

_runtimes: "weakref.WeakSet[Any]" = weakref.WeakSet()   # destroyed before MPI_Finalize
_state: Dict[str, Any] = {"inited_here": False, "world": None}


def _fn(name):
    lib = _lib.load()
    fn = getattr(lib, name, None)
    if fn is None:
        raise MfsdpError(8, "libmfsdp was built without MPI (no %s): the mpi backend "
                            "is not available" % name)
    return fn


def init() -> None:
    """Initialises MPI once with MPI_THREAD_MULTIPLE (unless already
    initialised, e.g. by mpi4py); raises when the thread level is lower."""
    flag = ctypes.c_int(0)
    _fn("MPI_Initialized")(ctypes.byref(flag))
    provided = ctypes.c_int(0)
    if not flag.value:
        rc = _fn("MPI_Init_thread")(None, None, MPI_THREAD_MULTIPLE, ctypes.byref(provided))
        if rc != 0:
            raise MfsdpError(7, "MPI_Init_thread failed (error %d)" % rc)
        _state["inited_here"] = True
        atexit.register(_finalize)
    else:
        _fn("MPI_Query_thread")(ctypes.byref(provided))
    if provided.value < MPI_THREAD_MULTIPLE:
        raise MfsdpError(2, "MPI provides thread level %d, the mpi backend needs "
                            "MPI_THREAD_MULTIPLE (initialise MPI with it, e.g. mpi4py's "
                            "default)" % provided.value)


def world_comm_pointer() -> ctypes.c_void_p:
    """A ctypes pointer to an MPI_Comm holding MPI_COMM_WORLD (kept alive here)."""
    if _state["world"] is None:
        lib = _lib.load()
        try:
            sym = ctypes.c_char.in_dll(lib, "ompi_mpi_comm_world")
            handle: Any = ctypes.c_void_p(ctypes.addressof(sym))
        except ValueError:
            handle = ctypes.c_int(_MPICH_COMM_WORLD)
        _state["world"] = handle
    return ctypes.cast(ctypes.pointer(_state["world"]), ctypes.c_void_p)


def comm_pointer(comm: Any) -> ctypes.c_void_p:
    """The MPI_Comm* for `comm`: None (MPI_COMM_WORLD), an mpi4py communicator,
    or an int already holding the address of an MPI_Comm."""
    if comm is None:
        init()
        return world_comm_pointer()
    if isinstance(comm, int):
        return ctypes.c_void_p(comm)
    try:
        from mpi4py import MPI
    except ImportError:
        raise MfsdpError(1, "comm must be None, an int address of an MPI_Comm or an "
                            "mpi4py communicator") from None
    init()
    return ctypes.c_void_p(MPI._addressof(comm))


def world_rank_size() -> Tuple[int, int]:
    """(rank, size) in MPI_COMM_WORLD (MPI initialised here if needed)."""
    init()
    rank, size = ctypes.c_int(), ctypes.c_int()
    comm = world_comm_pointer()
    handle: Any = ctypes.cast(comm, ctypes.POINTER(ctypes.c_void_p)).contents
    if isinstance(_state["world"], ctypes.c_int):
        handle = _state["world"]
    _fn("MPI_Comm_rank")(handle, ctypes.byref(rank))
    _fn("MPI_Comm_size")(handle, ctypes.byref(size))
    return rank.value, size.value


def barrier() -> None:
    """MPI_Barrier on MPI_COMM_WORLD (MPI initialised here if needed)."""
    init()
    world_comm_pointer()
    rc = _fn("MPI_Barrier")(_state["world"])
    if rc != 0:
        raise MfsdpError(7, "MPI_Barrier failed (error %d)" % rc)


def track(runtime: Any) -> None:
    _runtimes.add(runtime)


def _finalize():
    for rt in list(_runtimes):
        try:
            rt.close()
        except Exception:
            pass
    flag = ctypes.c_int(0)
    _fn("MPI_Finalized")(ctypes.byref(flag))
    if not flag.value:
        _fn("MPI_Finalize")()
