"""
schedule: mfsdp.Schedule, a loaded compiled schedule (mfsdp_schedule) and its
facts (mesh, units, tensors), read through the public C API only.

A Schedule owns its C handle; runtimes created from it keep a reference to it,
so Python never frees a schedule that a runtime still borrows.
"""
from __future__ import annotations

import ctypes
import os
from typing import List, Optional, Tuple, Union

from . import _lib
from ._lib import MfsdpError


class ClosedWhenCollected:
    """The owner of a C handle: close() runs when it is garbage-collected too,
    errors ignored (the library may be gone at interpreter exit)."""

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class TensorHead:
    """What a schedule's tensor (mfsdp_tensor_info) and a runtime's view of it
    (mfsdp_tensor_view) both say first: its index, full name, unit, shape and
    element count."""
    __slots__ = ("index", "name", "unit", "shape", "numel")
    index: int
    name: str                 # unit name + "." + tensor name
    unit: int                 # the unit whose hooks bracket its compute
    shape: Tuple[int, ...]
    numel: int                # elements of the whole tensor

    def __init__(self, index: int, c: Union[_lib.TensorInfo, _lib.TensorView]) -> None:
        self.index = index
        self.name = c.name.decode("utf-8")
        self.unit = c.unit
        self.shape = tuple(c.dims[i] for i in range(c.ndims))
        self.numel = c.numel


class TensorFacts(TensorHead):
    """One tensor of a schedule (mfsdp_tensor_info), and which of its roles
    are `Whole` (mfsdp_schedule_tensor_whole: the tensor entire on its owner
    ranks, absent elsewhere; docs/semantics.md §1)."""
    __slots__ = ("weight_dtype", "grad_dtype", "main_weight_dtype", "whole")
    weight_dtype: str         # "fp32", "bf16", "fp16"
    grad_dtype: str
    main_weight_dtype: str
    whole: int                # _lib.WHOLE_GRAD | _lib.WHOLE_MAIN_WEIGHT, 0 for neither

    def __init__(self, index: int, info: _lib.TensorInfo, whole: int = 0) -> None:
        super().__init__(index, info)
        self.whole = int(whole)
        self.weight_dtype = _lib.DTYPE_NAMES.get(info.weight_dtype, str(info.weight_dtype))
        self.grad_dtype = _lib.DTYPE_NAMES.get(info.grad_dtype, str(info.grad_dtype))
        self.main_weight_dtype = _lib.DTYPE_NAMES.get(info.main_weight_dtype,
                                                      str(info.main_weight_dtype))

    @property
    def whole_main_weight(self) -> bool:
        """main_weight is Whole: an owner's master shard is the whole tensor."""
        return bool(self.whole & _lib.WHOLE_MAIN_WEIGHT)

    @property
    def whole_grad(self) -> bool:
        return bool(self.whole & _lib.WHOLE_GRAD)

    def __repr__(self):
        return "TensorFacts(%r, unit=%d, shape=%r, weight=%s%s)" % (
            self.name, self.unit, self.shape, self.weight_dtype,
            ", whole=%d" % self.whole if self.whole else "")


class Schedule(ClosedWhenCollected):
    """A compiled schedule. Build one with Schedule.load(path),
    Schedule.from_text(yaml_text) or Schedule.compile(spec_text)."""

    def __init__(self, handle: ctypes.c_void_p, name: str, text: Optional[bytes] = None) -> None:
        self._h: Optional[ctypes.c_void_p] = handle
        self._users = 0          # live runtimes borrowing the C schedule
        self._close_pending = False
        self.name = name
        self.text = text   # the YAML, when known (compile/from_text), for reruns
        lib = _lib.load()
        self.world_size = int(lib.mfsdp_schedule_world_size(handle))
        self.mesh = {}
        for a in range(lib.mfsdp_schedule_num_axes(handle)):
            self.mesh[lib.mfsdp_schedule_axis_name(handle, a).decode("utf-8")] = int(
                lib.mfsdp_schedule_axis_size(handle, a))
        self.microbatches = int(lib.mfsdp_schedule_microbatches(handle))
        self.units = [lib.mfsdp_schedule_unit_name(handle, u).decode("utf-8")
                      for u in range(lib.mfsdp_schedule_num_units(handle))]
        self.reduce = "avg" if lib.mfsdp_schedule_reduce_is_avg(handle) else "sum"
        self.tensors = []
        info = _lib.TensorInfo()
        for i in range(lib.mfsdp_schedule_num_tensors(handle)):
            _lib.check(lib.mfsdp_schedule_tensor_info(handle, i, ctypes.byref(info)),
                       call="mfsdp_schedule_tensor_info")
            self.tensors.append(TensorFacts(i, info, lib.mfsdp_schedule_tensor_whole(handle, i)))
        self._by_name = {t.name: t for t in self.tensors}

    # ---- construction ----
    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"]) -> Schedule:
        """Loads a compiled schedule file (the YAML of `mfsdpc compile`)."""
        lib = _lib.load()
        h = ctypes.c_void_p()
        _lib.check(lib.mfsdp_schedule_load(os.fsencode(path), ctypes.byref(h)),
                   call="mfsdp_schedule_load")
        return cls(h, str(path))

    @classmethod
    def from_text(cls, text: Union[str, bytes], name: str = "<text>") -> Schedule:
        """Loads a compiled schedule from its YAML text (str or bytes)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        lib = _lib.load()
        h = ctypes.c_void_p()
        _lib.check(lib.mfsdp_schedule_load_buffer(name.encode("utf-8"), data, len(data),
                                                  ctypes.byref(h)),
                   call="mfsdp_schedule_load_buffer")
        return cls(h, name, data)

    @classmethod
    def compile(cls, spec: str, name: str = "<spec>") -> Schedule:
        """Compiles .mfsdp spec text through mfsdpc and loads the result.
        A spec error raises CompileError with mfsdpc's located diagnostics."""
        from .compile import compile_text
        return cls.from_text(compile_text(spec, name=name), name=name + ".yaml")

    # ---- facts ----
    @property
    def handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise MfsdpError(1, "schedule %s was closed" % self.name)
        return self._h

    def tensor(self, name: str) -> TensorFacts:
        """The TensorFacts of a full tensor name; KeyError when absent."""
        return self._by_name[name]

    def unit_find(self, name: str) -> int:
        """The index of the unit with this name, or -1 (mfsdp_schedule_unit_find)."""
        return int(_lib.load().mfsdp_schedule_unit_find(self.handle, name.encode("utf-8")))

    def unit_index(self, name: str) -> int:
        """The index of a unit by name; KeyError when absent."""
        u = self.unit_find(name)
        if u < 0:
            raise KeyError(name)
        return u

    def unit_tensors(self, unit: int) -> List[TensorFacts]:
        return [t for t in self.tensors if t.unit == unit]

    def hash(self) -> str:
        out = ctypes.create_string_buffer(32)
        _lib.load().mfsdp_schedule_hash(self.handle, out)
        return out.raw.hex()

    def close(self) -> None:
        """Frees the C schedule; while runtimes created from it are open, the
        free waits until the last of them is closed (runtimes borrow it)."""
        if self._users:
            self._close_pending = True
            return
        if self._h:
            _lib.load().mfsdp_schedule_free(self._h)
            self._h = None

    def _release(self):
        self._users -= 1
        if self._users == 0 and self._close_pending:
            self.close()

    def __repr__(self):
        return "Schedule(%r, mesh=%r, units=%d, tensors=%d, microbatches=%d)" % (
            self.name, self.mesh, len(self.units), len(self.tensors), self.microbatches)
