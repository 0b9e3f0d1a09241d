"""
tensors: torch tensors over a runtime's views, zero-copy.

CPU backends (local, mpi): torch.frombuffer over the runtime's host memory.
GPU backends (nccl, cuda_local): torch.as_tensor over an object exposing
__cuda_array_interface__ (bf16 travels as int16 bits and is viewed back).
The tensors borrow the runtime's memory: valid until Runtime.close().
tensors_in walks a module's nested output for its tensors (hooks.py, spec.py);
leaves_in, which it filters, every leaf of nested lists, tuples and dicts
(init.py).
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Iterator

import torch

if TYPE_CHECKING:
    from ..runtime import Runtime, View

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {t: n for n, t in TORCH_DTYPES.items()}   # torch dtype -> mfsdp dtype name
_TYPESTR = {"fp32": "<f4", "bf16": "<i2", "fp16": "<f2"}


class _CudaArray:
    def __init__(self, ptr, n, dtype):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": _TYPESTR[dtype],
                                         "data": (ptr, False), "version": 2, "strides": None}


def tensor(runtime: Runtime, view: View, role: str) -> torch.Tensor:
    """A torch tensor over `role` of `view` (a mfsdp.View) with its shape."""
    dtype = view.dtype[role]
    shape = view.role_shape(role)
    n = 1
    for d in shape:
        n *= d
    tdt = TORCH_DTYPES[dtype]
    ptr = view.ptr[role]
    gpu = runtime.backend in ("nccl", "cuda_local")
    if gpu and role in ("main_weight", "grad"):
        from .offload import host_resident
        gpu = not host_resident(runtime)   # CPU offload: pinned host memory
    if not ptr or n == 0:
        dev = "cuda:%d" % runtime.cuda_device() if gpu else "cpu"
        return torch.zeros(shape, dtype=tdt, device=dev)
    if gpu:
        t = torch.as_tensor(_CudaArray(ptr, n, dtype), device="cuda:%d" % runtime.cuda_device())
        if dtype == "bf16":
            t = t.view(torch.bfloat16)
        return t.view(shape)
    buf = (ctypes.c_char * (n * (4 if dtype == "fp32" else 2))).from_address(ptr)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "non-writable buffer" does not apply: ctypes memory is
        t = torch.frombuffer(buf, dtype=tdt, count=n)
    return t.view(shape)


def leaves_in(obj: Any) -> Iterator[Any]:
    """The leaves of lists, tuples and dicts, nested, in order (init.py)."""
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from leaves_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from leaves_in(o)
    else:
        yield obj


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in a module's output or arguments: a tensor, or lists,
    tuples and dicts of them, nested (other values skipped)."""
    return (o for o in leaves_in(obj) if isinstance(o, torch.Tensor))
