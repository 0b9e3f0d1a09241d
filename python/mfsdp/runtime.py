"""
runtime: mfsdp.Runtime, one rank's replay runtime (mfsdp_runtime), its hooks,
its zero-copy views and its statistics.

Views are plain descriptions (View: pointers, dtypes, shapes); array() turns
one role of a view into a NumPy array over the runtime's memory (no copy;
bf16 through ml_dtypes when installed, else as uint16 bits) and
mfsdp.torch.tensor() into a torch tensor (CPU: torch.frombuffer; CUDA:
__cuda_array_interface__). The arrays borrow the runtime's buffers: they are
valid until close(), and within the windows the schedule gives each role
(docs/runtime.md, "Views").
"""
from __future__ import annotations

import ctypes
import numbers
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib, _mpi
from ._lib import MfsdpError, UsageError
from .schedule import ClosedWhenCollected, TensorHead

if TYPE_CHECKING:
    from .checkpoint import Loaded, Rules, States
    from .schedule import Schedule

BACKENDS = {"local": _lib.BACKEND_LOCAL, "mpi": _lib.BACKEND_MPI, "nccl": _lib.BACKEND_NCCL,
            "cuda_local": _lib.BACKEND_CUDA_LOCAL}
ROLES = ("weight", "grad_local", "main_weight", "grad")
_DTYPE_CODES = {name: code for code, name in _lib.DTYPE_NAMES.items()}


def backend_available(name: str) -> bool:
    """True when libmfsdp was built with the backend ("local", "mpi", "nccl")."""
    return bool(_lib.load().mfsdp_backend_available(BACKENDS[name]))


class LocalGroup:
    """The shared group of the local backend's thread-ranks (one per world)."""

    def __init__(self, world: int) -> None:
        self._h: Optional[ctypes.c_void_p] = ctypes.c_void_p()
        _lib.check(_lib.load().mfsdp_local_group_create(int(world), ctypes.byref(self._h)),
                   call="mfsdp_local_group_create")

    def close(self) -> None:
        if self._h:
            _lib.load().mfsdp_local_group_destroy(self._h)
            self._h = None


class View(TensorHead):
    """Where one tensor's data lives for this rank (mfsdp_tensor_view)."""
    __slots__ = ("ptr", "dtype", "shard_offset", "shard_count")
    ptr: Dict[str, Optional[int]]   # by role: the address of its data, None for none
    dtype: Dict[str, str]           # by role: "fp32", "bf16", "fp16"
    shard_offset: int               # first tensor-local element of this rank's shard
    shard_count: int                # elements in this rank's shard

    def __init__(self, index: int, v: _lib.TensorView) -> None:
        super().__init__(index, v)
        self.ptr = {"weight": v.weight, "grad_local": v.grad_local,
                    "main_weight": v.main_weight, "grad": v.grad}
        self.dtype = {"weight": _lib.DTYPE_NAMES[v.weight_dtype],
                      "grad_local": _lib.DTYPE_NAMES[v.grad_local_dtype],
                      "main_weight": _lib.DTYPE_NAMES[v.main_weight_dtype],
                      "grad": _lib.DTYPE_NAMES[v.grad_dtype]}
        self.shard_offset = v.shard_offset
        self.shard_count = v.shard_count

    def role_shape(self, role: str) -> Tuple[int, ...]:
        """weight and grad_local hold the whole tensor, main_weight and grad the shard."""
        return self.shape if role in ("weight", "grad_local") else (self.shard_count,)

    def nbytes(self, role: str) -> int:
        n = self.numel if role in ("weight", "grad_local") else self.shard_count
        return n * (4 if self.dtype[role] == "fp32" else 2)

    def __repr__(self):
        return "View(%r, unit=%d, shape=%r, shard=[%d, +%d))" % (
            self.name, self.unit, self.shape, self.shard_offset, self.shard_count)


class Stats:
    """A snapshot of mfsdp_stats; subtract two for one step's figures."""
    FIELDS = ("steps", "ops", "collectives", "bytes", "busy_ns", "wait_ns")

    def __init__(self, s: Optional[_lib.Stats] = None, **kw: Any) -> None:
        if s is not None:
            kw = {"steps": s.steps, "ops": s.ops, "collectives": list(s.collectives),
                  "bytes": list(s.bytes), "busy_ns": list(s.busy_ns), "wait_ns": list(s.wait_ns)}
        for f in self.FIELDS:
            setattr(self, f, kw[f])

    def __sub__(self, o: Stats) -> Stats:
        def d(a, b):
            return [x - y for x, y in zip(a, b)] if isinstance(a, list) else a - b
        return Stats(**{f: d(getattr(self, f), getattr(o, f)) for f in self.FIELDS})

    def as_dict(self) -> Dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS}

    def __repr__(self):
        return "Stats(%r)" % self.as_dict()


# CUDA's handle of the legacy default stream (cudaStreamLegacy in
# driver_types.h). torch.cuda.current_stream().cuda_stream is 0 on torch's
# default stream, and 0 (NULL) in mfsdp_nccl_config.compute_stream means "no
# stream: the runtime creates its own", which nothing would order with
# torch's kernels; so 0 goes to the C side as this handle.
CUDA_STREAM_LEGACY = 0x1


def nccl_config(lib: Any, device: Optional[int], stream: Optional[int], host_compute: bool,
                nccl_unique_id: Optional[bytes]) -> _lib.NcclConfig:
    """The mfsdp_nccl_config of a GPU Runtime: the C defaults
    (mfsdp_nccl_config_init: blocking communicators, ncclMemAlloc buffers,
    a watchdog every 100 ms), then the device, the compute stream (None: the
    runtime creates one; 0, the legacy default stream that is torch's default
    stream: cudaStreamLegacy; any other handle as given), host compute and
    the unique id."""
    nc = _lib.NcclConfig()
    init = getattr(lib, "mfsdp_nccl_config_init", None)
    if init is None:   # a library without the GPU backends: create refuses it anyway
        nc.flags, nc.watchdog_poll_ms = _lib.NCCL_MEM_ALLOC, 100
    else:
        init(ctypes.byref(nc))
    nc.device = -1 if device is None else int(device)
    if stream is not None:
        nc.compute_stream = CUDA_STREAM_LEGACY if int(stream) == 0 else int(stream)
    if host_compute:
        nc.flags |= _lib.NCCL_HOST_COMPUTE
    if nccl_unique_id:
        nc.unique_id = bytes(nccl_unique_id)
        nc.has_unique_id = 1
    return nc


class Runtime(ClosedWhenCollected):
    """One rank's runtime. backend: "local" (thread-ranks: pass group= and
    rank=; a world of one needs neither), "mpi" (comm: None for
    MPI_COMM_WORLD, or an mpi4py communicator) or "nccl" (device, stream:
    the CUDA device and stream handle; mfsdp.torch passes torch's current
    ones; stream 0, torch's default stream, is the legacy default stream,
    cudaStreamLegacy; None: the runtime creates its own; communicators are
    blocking, as in C: nccl_config()). check=True turns on the check mode (MFSDP_FLAG_CHECK, CPU
    backends: reads and writes outside the windows are refused;
    docs/runtime.md §13). Every failure raises MfsdpError with the library's
    message."""

    def __init__(self, schedule: Schedule, backend: str = "local", rank: Optional[int] = None,
                 timeout_ms: Optional[int] = None, synchronous: bool = False,
                 group: Optional[LocalGroup] = None, comm: Any = None, device: Optional[int] = None,
                 stream: Optional[int] = None, host_compute: bool = False,
                 nccl_unique_id: Optional[bytes] = None, check: bool = False,
                 offload: bool = False) -> None:
        lib = _lib.load()
        if backend not in BACKENDS:
            raise MfsdpError(1, "unknown backend %r (one of %s)" % (backend, ", ".join(BACKENDS)))
        self.schedule = schedule   # borrowed by the C runtime: keep it alive
        self.backend = backend
        self._h = None
        self._own_group = None
        cfg = _lib.Config()
        lib.mfsdp_config_init(ctypes.byref(cfg))
        cfg.backend = BACKENDS[backend]
        cfg.rank = -1 if rank is None else int(rank)
        if timeout_ms is not None:
            cfg.timeout_ms = int(timeout_ms)
        if synchronous:
            cfg.flags |= _lib.FLAG_SYNCHRONOUS
        if check:
            cfg.flags |= _lib.FLAG_CHECK
        if offload:   # MFSDP_FLAG_OFFLOAD_MAIN: main_weight in pinned host memory on GPUs
            cfg.flags |= _lib.FLAG_OFFLOAD_MAIN
        keep: List[Any] = []
        if backend in ("local", "cuda_local"):
            if group is None:
                if schedule.world_size != 1:
                    raise MfsdpError(1, "the local backend with a world of %d ranks needs a "
                                        "shared LocalGroup (group=) and rank=" % schedule.world_size)
                group = self._own_group = LocalGroup(1)
                cfg.rank = 0
            cfg.local_group = group._h
            self._group = group
        if backend == "mpi":
            ptr = _mpi.comm_pointer(comm)
            keep.append(ptr)
            cfg.mpi_comm = ptr
        if backend in ("nccl", "cuda_local") and (device is not None or stream is not None
                                                  or host_compute or nccl_unique_id):
            nc = nccl_config(lib, device, stream, host_compute, nccl_unique_id)
            keep.append(nc)
            cfg.backend_config = ctypes.cast(ctypes.pointer(nc), ctypes.c_void_p)
        h = ctypes.c_void_p()
        _lib.check(lib.mfsdp_create(schedule.handle, ctypes.byref(cfg), ctypes.byref(h)),
                   call="mfsdp_create")
        self._h = h
        schedule._users += 1
        if backend == "mpi":
            _mpi.track(self)
        self.rank = int(lib.mfsdp_rank(h))
        self.world_size = int(lib.mfsdp_world_size(h))
        self.coords = [int(lib.mfsdp_coord(h, a)) for a in range(len(schedule.mesh))]
        self.views = []
        v = _lib.TensorView()
        for i in range(lib.mfsdp_num_tensors(h)):
            self._check(lib.mfsdp_tensor_view_get(h, i, ctypes.byref(v)), "mfsdp_tensor_view_get")
            self.views.append(View(i, v))
        self._by_name = {v.name: v for v in self.views}
        self._lib = lib

    # ---- lifetime ----
    @property
    def handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise UsageError("the runtime was closed")
        return self._h

    def close(self) -> None:
        """Destroys the C runtime (arrays and tensors over its views become invalid)."""
        if self._h:
            _lib.load().mfsdp_destroy(self._h)
            self._h = None
            self.schedule._release()
        if self._own_group is not None:
            self._own_group.close()
            self._own_group = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check(self, r, call):
        if r != _lib.OK:
            raise MfsdpError(r, _lib.last_error(self._h), call)

    # ---- views ----
    def view(self, name_or_index: Union[str, int]) -> View:
        """The View of a tensor by full name or index; KeyError when absent."""
        if isinstance(name_or_index, int):
            return self.views[name_or_index]
        return self._by_name[name_or_index]

    def array(self, name_or_index: Union[str, int], role: str = "weight") -> Any:
        """A NumPy array over one role of a tensor (zero-copy; CPU backends)."""
        from ._arrays import numpy_view
        return numpy_view(self.view(name_or_index), role)

    # ---- hooks ----
    def step_begin(self) -> None:
        self._check(self._lib.mfsdp_step_begin(self.handle), "mfsdp_step_begin")

    def forward_pre(self, unit: int, microbatch: int) -> None:
        self._check(self._lib.mfsdp_forward_pre(self.handle, unit, microbatch), "mfsdp_forward_pre")

    def forward_post(self, unit: int, microbatch: int) -> None:
        self._check(self._lib.mfsdp_forward_post(self.handle, unit, microbatch),
                    "mfsdp_forward_post")

    def backward_pre(self, unit: int, microbatch: int) -> None:
        self._check(self._lib.mfsdp_backward_pre(self.handle, unit, microbatch),
                    "mfsdp_backward_pre")

    def backward_post(self, unit: int, microbatch: int) -> None:
        self._check(self._lib.mfsdp_backward_post(self.handle, unit, microbatch),
                    "mfsdp_backward_post")

    def step_end(self) -> None:
        """Ends the step; after backward_post(0, m - 1) for any 1 <= m <= M
        (a short step: the gradient is the sum over the m microbatches run)."""
        self._check(self._lib.mfsdp_step_end(self.handle), "mfsdp_step_end")

    def eval_forward_pre(self, unit: int) -> None:
        """An evaluation (forward-only) pass between steps: unit u's weights
        are valid from eval_forward_pre(u) to eval_forward_post(u), units
        0..U-1 in order; no gradient buffer is touched."""
        self._check(self._lib.mfsdp_eval_forward_pre(self.handle, unit), "mfsdp_eval_forward_pre")

    def eval_forward_post(self, unit: int) -> None:
        self._check(self._lib.mfsdp_eval_forward_post(self.handle, unit), "mfsdp_eval_forward_post")

    def synchronize(self) -> None:
        self._check(self._lib.mfsdp_synchronize(self.handle), "mfsdp_synchronize")

    # ---- helpers (docs/runtime.md §12; CPU backends for those touching buffers) ----
    def unit_find(self, name: str) -> int:
        """The index of the unit with this name, or -1 (mfsdp_unit_find)."""
        return int(self._lib.mfsdp_unit_find(self.handle, name.encode("utf-8")))

    def _index(self, name_or_index):
        v = self.view(name_or_index)
        return v.index, v

    def scatter(self, name_or_index: Union[str, int], full: Any) -> None:
        """Copies this rank's shard of a tensor's master weight out of `full`,
        the whole tensor (torch CPU tensor or NumPy array, fp32/bf16/fp16; any
        other float dtype is converted to fp32 first), converting to the
        main_weight dtype (mfsdp_main_weight_scatter). Local, no communication:
        every rank passes the same tensor. Between steps only."""
        from ._arrays import host_input
        k, v = self._index(name_or_index)
        ptr, dtype, keep = host_input(full, v.numel, "scatter of %r" % v.name)
        self._check(self._lib.mfsdp_main_weight_scatter(self.handle, k, ptr,
                                                        _DTYPE_CODES[dtype]),
                    "mfsdp_main_weight_scatter")
        del keep

    def gather(self, name_or_index: Union[str, int], root: int = _lib.ALL_RANKS,
               dtype: str = "fp32", out: Any = None) -> Any:
        """The whole master weight of a tensor, converted to `dtype`, on rank
        `root` or on every rank (root=-1, the default) (mfsdp_main_weight_gather).
        Collective: every rank calls it, in the same order. Returns `out` (a
        contiguous host torch tensor or NumPy array of that dtype and numel) or
        a new NumPy array of the tensor's shape on receiving ranks, None on the
        others."""
        from ._arrays import host_output
        k, v = self._index(name_or_index)
        if dtype not in _DTYPE_CODES:
            raise UsageError("gather: dtype %r (one of fp32, bf16, fp16)" % (dtype,))
        receives = root == _lib.ALL_RANKS or root == self.rank
        ptr = None
        if receives:
            ptr, out = host_output(out, v.numel, dtype, v.shape, "gather of %r" % v.name)
        self._check(self._lib.mfsdp_main_weight_gather(self.handle, k, ptr, _DTYPE_CODES[dtype],
                                                       int(root)),
                    "mfsdp_main_weight_gather")
        return out if receives else None

    def gather_shard(self, name_or_index: Union[str, int], shard: Any,
                     root: int = _lib.ALL_RANKS, dtype: str = "fp32", out: Any = None) -> Any:
        """gather() of a caller's buffer sharded like main_weight (an optimizer
        state: Adam's exp_avg, SGD's momentum_buffer) instead of the master
        weight (mfsdp_shard_gather): `shard` is this rank's shard_count
        elements (torch CPU tensor or NumPy array, fp32/bf16/fp16), None where
        shard_count is 0. Collective; returns as gather() does."""
        from ._arrays import host_input, host_output
        k, v = self._index(name_or_index)
        if dtype not in _DTYPE_CODES:
            raise UsageError("gather_shard: dtype %r (one of fp32, bf16, fp16)" % (dtype,))
        sptr, sdtype, keep = None, "fp32", None
        if shard is not None:
            sptr, sdtype, keep = host_input(shard, v.shard_count, "gather_shard of %r" % v.name)
        elif v.shard_count:
            raise UsageError("gather_shard of %r: this rank holds %d elements of it, so shard= "
                             "must be its buffer (None only where the rank holds none)"
                             % (v.name, v.shard_count))
        receives = root == _lib.ALL_RANKS or root == self.rank
        ptr = None
        if receives:
            ptr, out = host_output(out, v.numel, dtype, v.shape, "gather_shard of %r" % v.name)
        self._check(self._lib.mfsdp_shard_gather(self.handle, k, sptr, _DTYPE_CODES[sdtype], ptr,
                                                 _DTYPE_CODES[dtype], int(root)),
                    "mfsdp_shard_gather")
        del keep
        return out if receives else None

    def allreduce(self, values: Any, op: str = "sum") -> Union[float, List[float]]:
        """op ("sum", "max", "min") of a float or a sequence of floats over the
        world, in double (mfsdp_allreduce; every rank gets the same bits).
        Collective. Returns a float for a float, else a list."""
        if op not in _lib.REDUCE_OPS:
            raise UsageError("allreduce: op %r (one of sum, max, min)" % (op,))
        one = isinstance(values, numbers.Real)
        vals = [float(values)] if one else [float(x) for x in values]
        buf = (ctypes.c_double * max(1, len(vals)))(*vals)
        self._check(self._lib.mfsdp_allreduce(self.handle, buf, len(vals), _lib.REDUCE_OPS[op]),
                    "mfsdp_allreduce")
        return buf[0] if one else list(buf[:len(vals)])

    def grad_norm(self) -> float:
        """The global L2 norm of the delivered gradient (replicated shards
        counted once; the same on every rank). After step_end. Collective."""
        norm = ctypes.c_double()
        self._check(self._lib.mfsdp_grad_norm(self.handle, ctypes.byref(norm)), "mfsdp_grad_norm")
        return norm.value

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scales every delivered gradient shard by max_norm / (norm + 1e-6) when
        the global norm exceeds max_norm (> 0); returns the norm before clipping
        (mfsdp_grad_clip). After step_end. Collective."""
        norm = ctypes.c_double()
        self._check(self._lib.mfsdp_grad_clip(self.handle, float(max_norm), ctypes.byref(norm)),
                    "mfsdp_grad_clip")
        return norm.value

    # ---- checkpoints (docs/checkpoint.md; python/mfsdp/checkpoint.py) ----
    def save_checkpoint(self, path: str, step: int = 0, states: Optional[States] = None,
                        user_blob: Optional[bytes] = None) -> None:
        """Saves this runtime's master weights, optimizer states ({name: {tensor
        name: this rank's shard as a host array}}) and this rank's user blob
        (bytes) as a sharded checkpoint in directory `path` (must not exist;
        committed by rename: complete or absent). Collective, between steps."""
        from . import checkpoint
        checkpoint.save(self, path, step, states, user_blob)

    def load_checkpoint(self, path: str, states: Optional[Union[States, Sequence[str]]] = None,
                        user_blob_rank: Optional[int] = None, verify_files: bool = False) -> Loaded:
        """Loads master weights and states from a checkpoint saved under any
        schedule of the same tensors (resharding is an ordinary load). states:
        names (new NumPy arrays) or {name: {tensor name: array}} filled in
        place. Returns a mfsdp.checkpoint.Loaded (step, user_blob, states).
        Collective, between steps."""
        from . import checkpoint
        return checkpoint.load(self, path, states, user_blob_rank, verify_files)

    def import_hf(self, path: str, maps: Optional[Rules] = None,
                  ties: Optional[Rules] = None) -> None:
        """Fills the master weights from a Hugging Face safetensors checkpoint,
        each rank reading only its ranges (mfsdp_ckpt_import_hf). Collective."""
        from . import checkpoint
        checkpoint.import_hf(self, path, maps, ties)

    def export_hf(self, path: str, dtype: Optional[str] = None, maps: Optional[Rules] = None,
                  ties: Optional[Rules] = None, max_file_bytes: int = 0) -> None:
        """Writes the full master weights as a Hugging Face checkpoint in
        directory `path`, every rank writing its ranges in parallel
        (mfsdp_ckpt_export_hf). Collective."""
        from . import checkpoint
        checkpoint.export_hf(self, path, dtype, maps, ties, max_file_bytes)

    # ---- statistics and GPU facts ----
    def stats(self) -> Stats:
        s = _lib.Stats()
        self._check(self._lib.mfsdp_get_stats(self.handle, ctypes.byref(s)), "mfsdp_get_stats")
        return Stats(s)

    def cuda_stream(self, stream: int = 0) -> Optional[int]:
        """The CUDA stream handle (int) of a GPU runtime's stream, else None."""
        fn = getattr(self._lib, "mfsdp_nccl_stream", None)
        return fn(self.handle, stream) if fn is not None else None

    def cuda_device(self) -> int:
        fn = getattr(self._lib, "mfsdp_nccl_device", None)
        return fn(self.handle) if fn is not None else -1

    def __repr__(self):
        return "Runtime(%s, rank %d of %d)" % (self.backend, self.rank, self.world_size)
