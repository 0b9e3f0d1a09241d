"""
_lib: the ctypes binding of libmfsdp's public C API (the headers of runtime/include/mfsdp/:
mfsdp.h, mfsdp_ckpt.h and mfsdp_nccl.h).

Nothing here is hand-written behaviour: each C function is declared with its
argument and result types, and every call that returns an mfsdp_result goes
through check(), which raises MfsdpError with mfsdp_last_error()'s message and
the result code. The declarations are checked against the headers in full
(every exported function's types, every constant, every struct's fields,
offsets and size) by tests/python/abi_check.py in the default test run: a
constant MFSDP_X of the headers is X here, a struct is bound in STRUCTS.
The library is found, in order, from $MFSDP_LIBRARY, next to
this package (lib/libmfsdp.so, as `pip install .` lays it out), or the system
loader path.

Why ctypes and not a C extension or cffi: see docs/pytorch.md ("Why ctypes").
"""
import ctypes
import ctypes.util
import os
import threading
from typing import Any, Dict, List, Optional, Tuple, Type

# ---- versions (mfsdp.h) ----
VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = 0, 1, 0
VERSION_CODE = VERSION_MAJOR * 10000 + VERSION_MINOR * 100 + VERSION_PATCH
ABI_VERSION = 1                              # MFSDP_ABI_VERSION: the config structs' `version`

# ---- results (mfsdp_result) ----
OK = 0
ERR_INVALID_ARGUMENT, ERR_INVALID_USAGE, ERR_LOAD, ERR_MISMATCH, ERR_TIMEOUT = 1, 2, 3, 4, 5
ERR_OUT_OF_MEMORY, ERR_BACKEND, ERR_UNSUPPORTED, ERR_ABORTED, ERR_INTERNAL = 6, 7, 8, 9, 10
RESULT_COUNT = 11
# {code: "MFSDP_ERR_TIMEOUT", ...}, from the constants above
RESULT_NAMES: Dict[int, str] = {v: "MFSDP_" + k for k, v in list(globals().items())
                                if k == "OK" or k.startswith("ERR_")}

# ---- dtypes (mfsdp_dtype) ----
FP32, BF16, FP16 = 0, 1, 2
DTYPE_NAMES = {FP32: "fp32", BF16: "bf16", FP16: "fp16"}
DTYPE_SIZES = {FP32: 4, BF16: 2, FP16: 2}

# ---- backends (mfsdp_backend) ----
BACKEND_LOCAL, BACKEND_MPI, BACKEND_NCCL, BACKEND_CUDA_LOCAL = 1, 2, 3, 4

MAX_DIMS = 8
MAX_AXES = 4
STREAM_COMPUTE, STREAM_INNER, STREAM_OUTER, NUM_STREAMS = 0, 1, 2, 3
FLAG_SYNCHRONOUS, FLAG_CHECK, FLAG_OFFLOAD_MAIN = 1, 2, 4   # MFSDP_FLAG_*
WHOLE_GRAD, WHOLE_MAIN_WEIGHT = 1, 2         # MFSDP_WHOLE_*: mfsdp_schedule_tensor_whole's bits

# ---- helpers (docs/runtime.md §12) ----
ALL_RANKS = -1                               # MFSDP_ALL_RANKS, a gather's root
REDUCE_SUM, REDUCE_MAX, REDUCE_MIN = 0, 1, 2  # mfsdp_reduce_op
REDUCE_OPS = {"sum": REDUCE_SUM, "max": REDUCE_MAX, "min": REDUCE_MIN}


class MfsdpError(RuntimeError):
    """A libmfsdp call returned something other than MFSDP_OK.

    `code` is the mfsdp_result (an int), `code_name` its enum name and
    `message` mfsdp_last_error()'s text."""

    def __init__(self, code: int, message: str, call: Optional[str] = None) -> None:
        self.code = int(code)
        self.code_name = RESULT_NAMES.get(self.code, "MFSDP_RESULT_%d" % self.code)
        self.message = message
        self.call = call
        where = "%s: " % call if call else ""
        super().__init__("%s%s (%s)" % (where, message, self.code_name))

    def __reduce__(self):
        # Rebuilt from its parts, not from the formatted text (which already
        # carries the code name): copy and pickle keep one suffix.
        return (_rebuild_error, (type(self), self.code, self.message, self.call))


class UsageError(MfsdpError):
    """A misuse detected in Python before any C call (MFSDP_ERR_INVALID_USAGE)."""

    def __init__(self, message: str) -> None:
        super().__init__(ERR_INVALID_USAGE, message)


def _rebuild_error(cls: type, code: int, message: str, call: Optional[str]) -> "MfsdpError":
    err = MfsdpError.__new__(cls)
    MfsdpError.__init__(err, code, message, call)
    return err


class CompileError(ValueError):
    """mfsdpc rejected a spec; `diagnostics` is its stderr, `returncode` its exit status."""

    def __init__(self, diagnostics: str, returncode: int) -> None:
        self.diagnostics = diagnostics
        self.returncode = returncode
        super().__init__("mfsdpc failed (exit %d):\n%s" % (returncode, diagnostics.rstrip()))


class _Sized(ctypes.Structure):
    """A configuration struct: it begins with `size` and `version`, which a new
    one gets as the C initializers (MFSDP_CONFIG_INIT, ...) set them; the
    library refuses a struct without them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.size = ctypes.sizeof(self)
        self.version = ABI_VERSION


_SIZED: List[Tuple[str, Any]] = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("unit", ctypes.c_int), ("ndims", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_DIMS), ("numel", ctypes.c_int64),
                ("weight_dtype", ctypes.c_int), ("grad_dtype", ctypes.c_int),
                ("main_weight_dtype", ctypes.c_int)]


class TensorView(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("unit", ctypes.c_int), ("ndims", ctypes.c_int),
                ("dims", ctypes.c_int64 * MAX_DIMS), ("numel", ctypes.c_int64),
                ("weight", ctypes.c_void_p), ("weight_dtype", ctypes.c_int),
                ("grad_local", ctypes.c_void_p), ("grad_local_dtype", ctypes.c_int),
                ("main_weight", ctypes.c_void_p), ("main_weight_dtype", ctypes.c_int),
                ("grad", ctypes.c_void_p), ("grad_dtype", ctypes.c_int),
                ("shard_offset", ctypes.c_int64), ("shard_count", ctypes.c_int64)]


class Config(_Sized):
    _fields_ = _SIZED + [("backend", ctypes.c_int), ("rank", ctypes.c_int64),
                         ("timeout_ms", ctypes.c_int64), ("flags", ctypes.c_uint32),
                         ("local_group", ctypes.c_void_p), ("mpi_comm", ctypes.c_void_p),
                         ("backend_config", ctypes.c_void_p)]


class NcclConfig(_Sized):
    """mfsdp_nccl_config (mfsdp_nccl.h); ncclUniqueId is 128 bytes."""
    _fields_ = _SIZED + [("world_comm", ctypes.c_void_p), ("unique_id", ctypes.c_char * 128),
                         ("has_unique_id", ctypes.c_int), ("device", ctypes.c_int),
                         ("compute_stream", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                         ("watchdog_poll_ms", ctypes.c_int64)]


NCCL_NONBLOCKING, NCCL_MEM_ALLOC, NCCL_GRAPHS, NCCL_HOST_COMPUTE = 1, 2, 4, 8
NCCL_NO_IMPLICIT_ORDER, NCCL_TIMELINE = 16, 32


class NcclOpTime(ctypes.Structure):
    """mfsdp_nccl_op_time (mfsdp_nccl.h): one op's device time."""
    _fields_ = [("op", ctypes.c_int), ("nops", ctypes.c_int), ("stream", ctypes.c_int),
                ("microbatch", ctypes.c_int64), ("start_us", ctypes.c_double),
                ("end_us", ctypes.c_double), ("name", ctypes.c_char * 64)]


class Stats(ctypes.Structure):
    _fields_ = [("steps", ctypes.c_int64), ("ops", ctypes.c_int64),
                ("collectives", ctypes.c_int64 * MAX_AXES), ("bytes", ctypes.c_int64 * MAX_AXES),
                ("busy_ns", ctypes.c_int64 * NUM_STREAMS), ("wait_ns", ctypes.c_int64 * NUM_STREAMS)]


# ---- checkpoints (mfsdp_ckpt.h) ----
CKPT_VERIFY_FILES = 1                        # MFSDP_CKPT_VERIFY_FILES


class CkptState(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("shards", ctypes.POINTER(ctypes.c_void_p))]


class CkptSaveOptions(_Sized):
    _fields_ = _SIZED + [("step", ctypes.c_int64), ("nstates", ctypes.c_int),
                         ("states", ctypes.POINTER(CkptState)), ("user_blob", ctypes.c_void_p),
                         ("user_blob_bytes", ctypes.c_size_t)]


class CkptLoadOptions(_Sized):
    _fields_ = _SIZED + [("flags", ctypes.c_uint32), ("nstates", ctypes.c_int),
                         ("states", ctypes.POINTER(CkptState)), ("user_blob_rank", ctypes.c_int64),
                         ("user_blob", ctypes.c_void_p), ("user_blob_capacity", ctypes.c_size_t),
                         ("user_blob_bytes", ctypes.c_size_t), ("step", ctypes.c_int64),
                         ("bytes_read", ctypes.c_uint64)]


class HfOptions(_Sized):
    _fields_ = _SIZED + [("nmaps", ctypes.c_int), ("maps", ctypes.POINTER(ctypes.c_char_p)),
                         ("nties", ctypes.c_int), ("ties", ctypes.POINTER(ctypes.c_char_p))]


# The C struct each class binds (every public struct of the headers).
STRUCTS: Dict[str, Type[ctypes.Structure]] = {
    "mfsdp_tensor_info": TensorInfo, "mfsdp_tensor_view": TensorView, "mfsdp_config": Config,
    "mfsdp_stats": Stats, "mfsdp_nccl_config": NcclConfig, "mfsdp_nccl_op_time": NcclOpTime,
    "mfsdp_ckpt_state": CkptState, "mfsdp_ckpt_save_options": CkptSaveOptions,
    "mfsdp_ckpt_load_options": CkptLoadOptions, "mfsdp_hf_options": HfOptions,
}


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_RES = ctypes.c_int
# name: (restype, argtypes)
_PROTOTYPES: Dict[str, Tuple[Any, List[Any]]] = {
    "mfsdp_result_string": (ctypes.c_char_p, [_INT]),
    "mfsdp_version": (ctypes.c_char_p, []),
    "mfsdp_version_code": (_INT, []),
    "mfsdp_dtype_size": (ctypes.c_size_t, [_INT]),
    "mfsdp_dtype_name": (ctypes.c_char_p, [_INT]),
    "mfsdp_schedule_load": (_RES, [ctypes.c_char_p, ctypes.POINTER(_P)]),
    "mfsdp_schedule_load_buffer": (_RES, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                          ctypes.POINTER(_P)]),
    "mfsdp_schedule_free": (None, [_P]),
    "mfsdp_schedule_world_size": (_I64, [_P]),
    "mfsdp_schedule_num_axes": (_INT, [_P]),
    "mfsdp_schedule_axis_name": (ctypes.c_char_p, [_P, _INT]),
    "mfsdp_schedule_axis_size": (_I64, [_P, _INT]),
    "mfsdp_schedule_microbatches": (_I64, [_P]),
    "mfsdp_schedule_num_units": (_INT, [_P]),
    "mfsdp_schedule_unit_name": (ctypes.c_char_p, [_P, _INT]),
    "mfsdp_schedule_reduce_is_avg": (_INT, [_P]),
    "mfsdp_schedule_hash": (None, [_P, ctypes.c_char_p]),
    "mfsdp_schedule_num_tensors": (_INT, [_P]),
    "mfsdp_schedule_tensor_info": (_RES, [_P, _INT, ctypes.POINTER(TensorInfo)]),
    "mfsdp_schedule_tensor_whole": (_INT, [_P, _INT]),
    "mfsdp_schedule_peak_bytes": (_I64, [_P]),
    "mfsdp_backend_available": (_INT, [_INT]),
    "mfsdp_local_group_create": (_RES, [_I64, ctypes.POINTER(_P)]),
    "mfsdp_local_group_destroy": (None, [_P]),
    "mfsdp_config_init": (None, [ctypes.POINTER(Config)]),
    "mfsdp_create": (_RES, [_P, ctypes.POINTER(Config), ctypes.POINTER(_P)]),
    "mfsdp_destroy": (None, [_P]),
    "mfsdp_last_error": (ctypes.c_char_p, [_P]),
    "mfsdp_allocated_bytes": (_I64, [_P]),
    "mfsdp_offload_active": (_INT, [_P]),
    "mfsdp_offload_status": (ctypes.c_char_p, [_P]),
    "mfsdp_offload_host_bytes": (_I64, [_P]),
    "mfsdp_schedule_offload_op": (_INT, [_P]),
    "mfsdp_rank": (_I64, [_P]),
    "mfsdp_world_size": (_I64, [_P]),
    "mfsdp_coord": (_I64, [_P, _INT]),
    "mfsdp_num_tensors": (_INT, [_P]),
    "mfsdp_tensor_view_get": (_RES, [_P, _INT, ctypes.POINTER(TensorView)]),
    "mfsdp_tensor_find": (_INT, [_P, ctypes.c_char_p]),
    "mfsdp_step_begin": (_RES, [_P]),
    "mfsdp_forward_pre": (_RES, [_P, _INT, _I64]),
    "mfsdp_forward_post": (_RES, [_P, _INT, _I64]),
    "mfsdp_backward_pre": (_RES, [_P, _INT, _I64]),
    "mfsdp_backward_post": (_RES, [_P, _INT, _I64]),
    "mfsdp_step_end": (_RES, [_P]),
    "mfsdp_synchronize": (_RES, [_P]),
    "mfsdp_get_stats": (_RES, [_P, ctypes.POINTER(Stats)]),
    # helpers (docs/runtime.md §12)
    "mfsdp_f32_to_bf16": (ctypes.c_uint16, [ctypes.c_float]),
    "mfsdp_bf16_to_f32": (ctypes.c_float, [ctypes.c_uint16]),
    "mfsdp_f32_to_fp16": (ctypes.c_uint16, [ctypes.c_float]),
    "mfsdp_fp16_to_f32": (ctypes.c_float, [ctypes.c_uint16]),
    "mfsdp_convert": (_RES, [_P, _INT, _P, _INT, _I64]),
    "mfsdp_unit_find": (_INT, [_P, ctypes.c_char_p]),
    "mfsdp_schedule_unit_find": (_INT, [_P, ctypes.c_char_p]),
    "mfsdp_main_weight_scatter": (_RES, [_P, _INT, _P, _INT]),
    "mfsdp_main_weight_gather": (_RES, [_P, _INT, _P, _INT, _I64]),
    "mfsdp_shard_gather": (_RES, [_P, _INT, _P, _INT, _P, _INT, _I64]),
    "mfsdp_allreduce": (_RES, [_P, ctypes.POINTER(ctypes.c_double), _INT, _INT]),
    "mfsdp_grad_norm": (_RES, [_P, ctypes.POINTER(ctypes.c_double)]),
    "mfsdp_grad_clip": (_RES, [_P, ctypes.c_double, ctypes.POINTER(ctypes.c_double)]),
    # evaluation passes (mfsdp.h; docs/runtime.md §4.3)
    "mfsdp_eval_forward_pre": (_RES, [_P, _INT]),
    "mfsdp_eval_forward_post": (_RES, [_P, _INT]),
    # checkpoints (mfsdp_ckpt.h)
    "mfsdp_ckpt_save_options_init": (None, [ctypes.POINTER(CkptSaveOptions)]),
    "mfsdp_ckpt_load_options_init": (None, [ctypes.POINTER(CkptLoadOptions)]),
    "mfsdp_hf_options_init": (None, [ctypes.POINTER(HfOptions)]),
    "mfsdp_ckpt_save": (_RES, [_P, ctypes.c_char_p, ctypes.POINTER(CkptSaveOptions)]),
    "mfsdp_ckpt_load": (_RES, [_P, ctypes.c_char_p, ctypes.POINTER(CkptLoadOptions)]),
    "mfsdp_ckpt_verify": (_RES, [ctypes.c_char_p]),
    "mfsdp_ckpt_import_hf": (_RES, [_P, ctypes.c_char_p, ctypes.POINTER(HfOptions)]),
    "mfsdp_ckpt_export_hf": (_RES, [_P, ctypes.c_char_p, _INT, ctypes.POINTER(HfOptions),
                                    ctypes.c_uint64]),
}
# Present only in a library built with the CUDA/NCCL backend (mfsdp_nccl.h).
_OPTIONAL: Dict[str, Tuple[Any, List[Any]]] = {
    "mfsdp_nccl_config_init": (None, [ctypes.POINTER(NcclConfig)]),
    "mfsdp_nccl_stream": (_P, [_P, _INT]),
    "mfsdp_nccl_device": (_INT, [_P]),
    "mfsdp_nccl_timeline": (_INT, [_P, _P, ctypes.POINTER(NcclOpTime), _INT]),
    "mfsdp_nccl_warning": (ctypes.c_char_p, [_P]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def library_path() -> Optional[str]:
    """The libmfsdp that load() opens (see the module comment), or None."""
    env = os.environ.get("MFSDP_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for sub in ("lib", "lib64"):
        d = os.path.join(here, sub)
        if os.path.isdir(d):
            names = sorted(n for n in os.listdir(d) if n.startswith("libmfsdp.so"))
            if names:
                return os.path.join(d, names[0])
    return ctypes.util.find_library("mfsdp")


def load() -> ctypes.CDLL:
    """Opens libmfsdp once and declares every prototype; returns the CDLL."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not path:
            raise ImportError("libmfsdp not found: install the package with `pip install .` "
                              "or set MFSDP_LIBRARY to the path of libmfsdp.so")
        # RTLD_GLOBAL: libmpi's plugins need its symbols visible (Open MPI dlopens
        # its components, which look up libmpi's symbols globally).
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        for name, (res, args) in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        for name, (res, args) in _OPTIONAL.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = res, args
        _lib = lib
        return lib


def nccl_unique_id() -> bytes:
    """A fresh ncclUniqueId (128 bytes) from the libnccl that libmfsdp links."""
    fn = getattr(load(), "ncclGetUniqueId", None)
    if fn is None:
        raise MfsdpError(ERR_UNSUPPORTED, "libmfsdp was built without NCCL")
    buf = ctypes.create_string_buffer(128)
    r = fn(buf)
    if r != 0:
        raise MfsdpError(ERR_BACKEND, "ncclGetUniqueId failed (ncclResult %d)" % r)
    return buf.raw


def last_error(handle: Any = None) -> str:
    msg = load().mfsdp_last_error(handle)
    return msg.decode("utf-8", "replace") if msg else ""


def check(result: int, handle: Any = None, call: Optional[str] = None) -> int:
    """Raises MfsdpError for any result but MFSDP_OK (message from the handle,
    or the calling thread's last handle-less error when handle is None)."""
    if result != OK:
        raise MfsdpError(result, last_error(handle), call)
    return result
