"""
_arrays: NumPy arrays over runtime memory (zero-copy), imported only when
Runtime.array() is called, so `import mfsdp` needs neither NumPy nor torch.
"""
import ctypes


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


def numpy_view(view, role):
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
