"""
convert: the runtime's own fp32 <-> bf16 / fp16 conversions (round to nearest
even, NaN stays NaN, overflow gives infinity; docs/runtime.md §12), for
preparing or checking data exactly as the runtime's casts do.
"""
from __future__ import annotations

from typing import Any

from . import _lib
from ._lib import UsageError

_CODES = {name: code for code, name in _lib.DTYPE_NAMES.items()}


def convert(x: Any, dtype: str) -> Any:
    """A new NumPy array of `x` (a host torch tensor or NumPy array of fp32,
    bf16 or fp16; other float dtypes are taken as fp32) converted to `dtype`
    ("fp32", "bf16", "fp16") by mfsdp_convert, in x's shape. bf16 is
    ml_dtypes.bfloat16 when installed, else the raw uint16 bits."""
    from ._arrays import host_input, host_output
    if dtype not in _CODES:
        raise UsageError("convert: dtype %r (one of fp32, bf16, fp16)" % (dtype,))
    shape = tuple(x.shape) if hasattr(x, "shape") else (len(x),)
    n = 1
    for d in shape:
        n *= d
    src, sdt, keep = host_input(x, n, "convert")
    dst, out = host_output(None, n, dtype, shape, "convert")
    _lib.check(_lib.load().mfsdp_convert(dst, _CODES[dtype], src, _CODES[sdt], n),
               call="mfsdp_convert")
    del keep
    return out
