"""
_arrays: NumPy arrays over runtime memory (zero-copy), imported only when
Runtime.array() is called, so `import mfsdp` needs neither NumPy nor torch.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Tuple

if TYPE_CHECKING:
    from .runtime import View


def _numpy_dtype(name):
    import numpy as np
    if name == "fp32":
        return np.float32
    if name == "fp16":
        return np.float16
    try:
        import ml_dtypes
        return ml_dtypes.bfloat16
    except ImportError:
        return np.uint16   # the raw bf16 bits


def numpy_view(view: View, role: str) -> Any:
    import numpy as np
    ptr = view.ptr[role]
    shape = view.role_shape(role)
    dt = np.dtype(_numpy_dtype(view.dtype[role]))
    n = 1
    for d in shape:
        n *= d
    if not ptr or n == 0:
        return np.zeros(shape, dtype=dt)
    buf = (ctypes.c_char * (n * dt.itemsize)).from_address(ptr)
    return np.frombuffer(buf, dtype=dt, count=n).reshape(shape)


# ---- host buffers for the helpers (scatter's input, gather's output) ----
_TORCH_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _torch_tensor(x):
    """True for a torch tensor (without importing torch when it is not loaded)."""
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _numpy_name(dt):
    import numpy as np
    if dt == np.float32:
        return "fp32"
    if dt == np.float16:
        return "fp16"
    if dt.name == "bfloat16":
        return "bf16"
    return None


def host_input(x: Any, numel: int, what: str) -> Tuple[int, str, Any]:
    """(pointer, dtype name, keep-alive) of the whole tensor `x` in host memory:
    a torch CPU tensor or NumPy array of fp32/bf16/fp16 (another float dtype,
    a list: converted to fp32), numel elements in any shape. Copies only when
    `x` is not contiguous or needs the conversion."""
    from ._lib import UsageError
    if _torch_tensor(x):
        if x.device.type != "cpu":
            raise UsageError("%s: a %s tensor; the helpers work on host memory (a CPU tensor)"
                             % (what, x.device.type))
        t = x.detach()
        name = _TORCH_NAMES.get(str(t.dtype).replace("torch.", ""))
        if name is None:
            import torch
            t, name = t.to(torch.float32), "fp32"
        t = t.contiguous()
        n, ptr = t.numel(), t.data_ptr()
    else:
        import numpy as np
        a = np.asarray(x)
        name = _numpy_name(a.dtype)
        if name is None:
            a, name = a.astype(np.float32), "fp32"
        t = a = np.ascontiguousarray(a)
        n, ptr = a.size, a.ctypes.data
    if n != numel:
        raise UsageError("%s: %d elements given, the tensor has %d" % (what, n, numel))
    return ptr, name, t


def host_output(out: Any, numel: int, dtype: str, shape: Tuple[int, ...],
                what: str) -> Tuple[int, Any]:
    """(pointer, array) for a gather of numel elements of `dtype` (a name):
    `out` when given (a contiguous, writable torch CPU tensor or NumPy array
    of that dtype and size), else a new NumPy array of `shape`."""
    from ._lib import UsageError
    if out is None:
        import numpy as np
        out = np.empty(shape, dtype=_numpy_dtype(dtype))
    if _torch_tensor(out):
        name = _TORCH_NAMES.get(str(out.dtype).replace("torch.", ""))
        ok = out.device.type == "cpu" and out.is_contiguous()
        n, ptr = out.numel(), out.data_ptr()
    else:
        import numpy as np
        name = "bf16" if out.dtype == np.uint16 and dtype == "bf16" else _numpy_name(out.dtype)
        ok = out.flags.c_contiguous and out.flags.writeable
        n, ptr = out.size, out.ctypes.data
    if not ok or name != dtype or n != numel:
        raise UsageError("%s: out= must be a contiguous writable host array of %d %s elements"
                         % (what, numel, dtype))
    return ptr, out
