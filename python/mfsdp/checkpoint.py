"""
checkpoint: sharded checkpoints and Hugging Face import/export of one rank's
runtime, through libmfsdp's checkpoint API (runtime/include/mfsdp/mfsdp_ckpt.h,
docs/checkpoint.md). Runtime.save_checkpoint, load_checkpoint, import_hf and
export_hf call these; mfsdp.torch.ShardedModel adds the optimizer on top.

Optimizer states are given per state name as {tensor name: host array}: a
NumPy array or torch CPU tensor holding this rank's shard of that tensor
(the view's shard_count elements, fp32/bf16/fp16), laid out like
main_weight. A tensor this rank holds that is missing from a state is passed
to the library as NULL, so every rank refuses the call with the library's
message ("state 'exp_avg': no buffer for tensor ..."). Every call here is
collective: every rank calls it with the same directory and state names.
"""
from __future__ import annotations

import ctypes
import json
import os
import stat
from typing import TYPE_CHECKING, Any, Dict, Iterable, Mapping, Optional, Sequence, Union

from . import _lib
from ._lib import UsageError

if TYPE_CHECKING:
    from .runtime import Runtime

# Optimizer states: {state name: {tensor name: host array}}; Hugging Face name
# rules: {FROM: TO} (in order) or a sequence of "FROM=TO".
States = Mapping[str, Mapping[str, Any]]
Rules = Union[Mapping[str, str], Iterable[str]]

_DTYPE_CODES = {name: code for code, name in _lib.DTYPE_NAMES.items()}


class Loaded:
    """What load_checkpoint returns: the saved `step`, the `user_blob` (bytes;
    None when the chosen rank saved none), the `states` it filled ({state
    name: {tensor name: array}}) and `bytes_read`, the bytes this rank read
    from the data files (replicas share reads: docs/checkpoint.md)."""
    __slots__ = ("step", "user_blob", "states", "bytes_read")

    def __init__(self, step: int, user_blob: Optional[bytes], states: States,
                 bytes_read: int = 0) -> None:
        self.step, self.user_blob, self.states = step, user_blob, states
        self.bytes_read = bytes_read

    def __repr__(self):
        return "Loaded(step=%d, user_blob=%s, states=%s)" % (
            self.step, None if self.user_blob is None else "%d bytes" % len(self.user_blob),
            sorted(self.states))


def read_manifest(path: str) -> Optional[Dict[str, Any]]:
    """The manifest of checkpoint directory `path` as a dict (docs/checkpoint.md,
    "The manifest"), or None when it cannot be read or parsed, or is not a
    regular file (a FIFO there would block a plain open; the library's load
    then says why)."""
    try:
        fd = os.open(os.path.join(os.fsdecode(path), "manifest.json"), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1  # the file object owns it now
            m = json.load(f)
        return m if isinstance(m, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def verify(path: str) -> None:
    """Checks a checkpoint without a runtime (mfsdp_ckpt_verify): the manifest,
    every file's size, header and CRC-32C, every piece's CRC-32C. Raises
    MfsdpError naming the first bad file."""
    lib = _lib.load()
    _lib.check(lib.mfsdp_ckpt_verify(os.fsencode(path)), None, "mfsdp_ckpt_verify")


def _array_dtype(x, what):
    """The dtype name of a host array (torch CPU tensor or NumPy array)."""
    from ._arrays import _numpy_name, _TORCH_NAMES, _torch_tensor
    if _torch_tensor(x):
        name = _TORCH_NAMES.get(str(x.dtype).replace("torch.", ""))
    else:
        name = _numpy_name(getattr(x, "dtype", None)) if hasattr(x, "dtype") else None
    if name is None:
        raise UsageError("%s: a NumPy array or torch CPU tensor of fp32, bf16 or fp16 "
                         "(got %s)" % (what, getattr(x, "dtype", type(x).__name__)))
    return name


def _pointer(x, numel, dtype, writable, what):
    """The address of host array x (contiguous, `numel` elements of `dtype`)."""
    from ._arrays import _torch_tensor
    if _torch_tensor(x):
        ok = x.device.type == "cpu" and x.is_contiguous()
        n, ptr = x.numel(), x.data_ptr()
    else:
        ok = x.flags.c_contiguous and (x.flags.writeable or not writable)
        n, ptr = x.size, x.ctypes.data
    if not ok or n != numel:
        raise UsageError("%s: needs a contiguous%s host array of %d %s elements (this rank's "
                         "shard), got %d" % (what, " writable" if writable else "", numel,
                                             dtype, n))
    return ptr


def _states(rt, states, writable):
    """(CkptState array, count, keep-alive) for {name: {tensor name: array}}."""
    states = states or {}
    if not isinstance(states, dict):
        raise UsageError("states: a dict {state name: {tensor name: array}}")
    arr = (_lib.CkptState * max(1, len(states)))()
    keep = []
    for i, (name, shards) in enumerate(states.items()):
        unknown = sorted(set(shards) - {v.name for v in rt.views})
        if unknown:
            raise UsageError("state %r: no tensor named %s in the schedule" % (
                name, ", ".join(repr(u) for u in unknown)))
        ptrs = (ctypes.c_void_p * max(1, len(rt.views)))()
        dtype = None
        for v in rt.views:
            x = shards.get(v.name)
            if x is None or v.shard_count == 0:
                continue
            what = "state %r of tensor %r" % (name, v.name)
            d = _array_dtype(x, what)
            if dtype is not None and d != dtype:
                raise UsageError("state %r: tensor %r is %s, others are %s (one dtype per state)"
                                 % (name, v.name, d, dtype))
            dtype = d
            ptrs[v.index] = _pointer(x, v.shard_count, d, writable, what)
        bname = str(name).encode("utf-8")
        keep += [bname, ptrs]
        arr[i].name = bname
        arr[i].dtype = _DTYPE_CODES[dtype or "fp32"]
        arr[i].shards = ptrs
    return arr, len(states), keep


def save(rt: Runtime, path: str, step: int = 0, states: Optional[States] = None,
         user_blob: Optional[bytes] = None) -> None:
    """mfsdp_ckpt_save: main_weight, the states and this rank's user blob
    (bytes-like) into directory `path`, which must not exist."""
    arr, n, keep = _states(rt, states, writable=False)
    opt = _lib.CkptSaveOptions()
    opt.step = int(step)
    opt.nstates = n
    opt.states = arr
    blob = None
    if user_blob is not None:
        blob = ctypes.create_string_buffer(bytes(user_blob), len(user_blob) or 1)
        opt.user_blob = ctypes.cast(blob, ctypes.c_void_p)
        opt.user_blob_bytes = len(user_blob)
    rt._check(_lib.load().mfsdp_ckpt_save(rt.handle, os.fsencode(path), ctypes.byref(opt)),
              "mfsdp_ckpt_save")
    del keep, blob


def _blob_capacity(manifest, who):
    for f in (manifest or {}).get("files", []):
        if isinstance(f, dict) and f.get("rank") == who and isinstance(f.get("user_blob"), list):
            try:
                return int(f["user_blob"][1])
            except (IndexError, TypeError, ValueError):
                return 0
    return 0


def _allocate(rt, manifest, names):
    """{name: {tensor name: new NumPy array}} in the manifest's dtypes."""
    from ._arrays import _numpy_dtype
    import numpy as np
    dtypes = {s.get("name"): s.get("dtype") for s in (manifest or {}).get("states", [])
              if isinstance(s, dict)}
    out = {}
    for name in names:
        d = dtypes.get(name, "fp32")
        d = d if d in _DTYPE_CODES else "fp32"
        out[name] = {v.name: np.zeros(v.shard_count, dtype=_numpy_dtype(d))
                     for v in rt.views if v.shard_count}
    return out


def load(rt: Runtime, path: str, states: Optional[Union[States, Sequence[str]]] = None,
         user_blob_rank: Optional[int] = None, verify_files: bool = False) -> Loaded:
    """mfsdp_ckpt_load, under this runtime's schedule (any mesh or layout:
    resharding is an ordinary load). states: a sequence of state names (new
    NumPy arrays are allocated in the checkpoint's dtypes) or a dict {name:
    {tensor name: array}} filled in place. user_blob_rank: whose blob to
    return (None: this rank's number). verify_files: check every file's
    CRC-32C first (MFSDP_CKPT_VERIFY_FILES). Returns a Loaded."""
    manifest = read_manifest(path)
    if states is not None and not isinstance(states, dict):
        states = _allocate(rt, manifest, [str(s) for s in states])
    arr, n, keep = _states(rt, states, writable=True)
    who = rt.rank if user_blob_rank is None else int(user_blob_rank)
    cap = _blob_capacity(manifest, who)
    blob = ctypes.create_string_buffer(max(1, cap))
    opt = _lib.CkptLoadOptions()
    opt.flags = _lib.CKPT_VERIFY_FILES if verify_files else 0
    opt.nstates = n
    opt.states = arr
    opt.user_blob_rank = who
    opt.user_blob = ctypes.cast(blob, ctypes.c_void_p)
    opt.user_blob_capacity = cap
    rt._check(_lib.load().mfsdp_ckpt_load(rt.handle, os.fsencode(path), ctypes.byref(opt)),
              "mfsdp_ckpt_load")
    del keep
    if opt.user_blob_bytes > cap:     # the manifest we read is not the one loaded
        raise UsageError("load_checkpoint: the user blob of rank %d has %d bytes, the manifest "
                         "read before the load said %d (was %s replaced during the load?)"
                         % (who, opt.user_blob_bytes, cap, os.fsdecode(path)))
    data = blob.raw[:opt.user_blob_bytes] if opt.user_blob_bytes else None
    return Loaded(int(opt.step), data, states or {}, int(opt.bytes_read))


def _rules(rules, what):
    """[b"FROM=TO", ...] from a dict (in order) or a sequence of "FROM=TO"."""
    if rules is None:
        return []
    items = ["%s=%s" % kv for kv in rules.items()] if isinstance(rules, dict) else list(rules)
    for r in items:
        if not isinstance(r, str) or "=" not in r:
            raise UsageError("%s: %r is not FROM=TO" % (what, r))
    return [r.encode("utf-8") for r in items]


def _hf_options(maps, ties):
    m, t = _rules(maps, "maps"), _rules(ties, "ties")
    o = _lib.HfOptions()
    marr = (ctypes.c_char_p * max(1, len(m)))(*m)
    tarr = (ctypes.c_char_p * max(1, len(t)))(*t)
    o.nmaps, o.maps, o.nties, o.ties = len(m), marr, len(t), tarr
    return o, (m, t, marr, tarr)


def import_hf(rt: Runtime, path: str, maps: Optional[Rules] = None,
              ties: Optional[Rules] = None) -> None:
    """mfsdp_ckpt_import_hf: main_weight from a Hugging Face checkpoint
    (model.safetensors, its .index.json, or a directory with either). maps:
    prefix rewrites {HF prefix: schedule prefix} (or "FROM=TO" strings, first
    match wins); ties: {schedule name: source schedule name}."""
    o, keep = _hf_options(maps, ties)
    rt._check(_lib.load().mfsdp_ckpt_import_hf(rt.handle, os.fsencode(path), ctypes.byref(o)),
              "mfsdp_ckpt_import_hf")
    del keep


def export_hf(rt: Runtime, path: str, dtype: Optional[str] = None, maps: Optional[Rules] = None,
              ties: Optional[Rules] = None, max_file_bytes: int = 0) -> None:
    """mfsdp_ckpt_export_hf: the full main_weight tensors as a consolidated
    Hugging Face checkpoint in directory `path` (must not exist), in `dtype`
    ("fp32", "bf16", "fp16"; None: the main_weight dtype), files of at most
    max_file_bytes (0: 5 GB) plus an index when there are several."""
    if dtype is None:
        dtype = rt.views[0].dtype["main_weight"] if rt.views else "fp32"
    if dtype not in _DTYPE_CODES:
        raise UsageError("export_hf: dtype %r (one of fp32, bf16, fp16)" % (dtype,))
    o, keep = _hf_options(maps, ties)
    rt._check(_lib.load().mfsdp_ckpt_export_hf(rt.handle, os.fsencode(path), _DTYPE_CODES[dtype],
                                               ctypes.byref(o), int(max_file_bytes)),
              "mfsdp_ckpt_export_hf")
    del keep
