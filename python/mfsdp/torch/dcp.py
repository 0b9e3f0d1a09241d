"""
dcp: PyTorch Distributed Checkpoint (torch.distributed.checkpoint) in and
out of an mfsdp model (docs/checkpoint.md, "PyTorch DCP").

The layout is the one an FSDP2 trainer writes and reads,

    {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}

flattened by DCP: `model.<key>` for every key of the model's state_dict
(each name of a tied parameter, persistent buffers), `optim.state.<fqn>.<k>`
for the optimizer's per-parameter state (the parameter's first name; tensors
shaped like the parameter and 0-d `step`s), `optim.param_groups.<i>.<option>`
with `params` the FQNs of the group. torch's own planner, writer and reader
do the format; this module only decides who holds which whole tensor.

Several optimizers (optimizer=[muon, adamw]) are laid out as torch's
get_optimizer_state_dict(model, (muon, adamw)) lays them out: one "state"
keyed by FQN (each parameter under the optimizer that steps it, with that
optimizer's keys) and the optimizers' param groups concatenated in the
given order (`optim.param_groups.<i>`, i counting over all of them); the
boundary between optimizers is not stored, so a load matches the given
optimizers' groups, in order, against the saved ones (count, options,
members) and refuses any difference.

save: the whole tensors (every master weight, every optimizer state of it)
are balanced over the ranks by bytes; every rank takes part in each gather
(the runtime's mfsdp_main_weight_gather / mfsdp_shard_gather to the writer
rank), then all ranks call dcp.save with their part into PATH.tmp-ID (a
marker inside names the writing process), hash a share of the storage
items, and rank 0 writes the checksums (dcp_files.SUMS), removes the marker
and renames PATH.tmp-ID to PATH (or, with overwrite=True, exchanges it with
the checkpoint there). Every exchange between ranks, DCP's included, runs on
a gloo Group with the runtime's timeout_ms; any failure on any rank is a
UsageError on every rank and rank 0 removes PATH.tmp-ID. Before writing,
rank 0 removes the PATH'.tmp-ID of killed saves in the same parent
(clean_residue: the marker's process no longer runs on this host).

Distinct tensors (a model sharded with distinct=, with global names) are
keyed by their global names, weights and optimizer states alike (Names.
fqns_of), and are never gathered: each rank writes its own shards' parts as
DCP chunks of the global tensors (_distinct_part), with the LAYOUT record
of their axes; a load reads this rank's coordinate's tensor (a split one's
slice only) and refuses another tp/ep layout (_layout_problems).

load: all or nothing. Each rank checks the metadata against the model and
the storage (dcp_files.check_storage), then reads, in batches of at most
`batch_bytes`, the whole tensors of which it holds a shard (DCP's planner,
no_dist, through dcp_files.SafeReader) and stages its shard (_stage); the
ranks agree through the runtime's mfsdp_allreduce, and only then are the
master weights (Runtime.scatter), the buffers and the optimizer's state
written. A checkpoint of another model is refused, listing every problem.

The same functions serve the offline `mfsdp-ckpt to-dcp` / `from-dcp`
(mfsdp/tools.py) on a world-of-one runtime, where the "optimizer" is an
OptimizerState (states by tensor name) instead of a torch optimizer.
"""
from __future__ import annotations

import ctypes
import datetime
import errno
import json
import os
import re
import secrets
import shutil
import socket
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

from .._lib import UsageError
from . import dcp_files
from .checkpoint import Optimizers, optimizers_of, owners
from .tensors import DTYPE_NAMES, TORCH_DTYPES

if TYPE_CHECKING:
    from ..runtime import Runtime
    from .shard import ShardedModel

BATCH_BYTES = 256 << 20
DEFAULT_TIMEOUT_MS = 600000       # mfsdp_config_init's
MARKER = ".mfsdp-saving"          # in PATH.tmp-ID while a save writes it: who writes
LAYOUT = "mfsdp.distinct"         # JSON {global name: {"axes": [[axis, size]], "split": D}}


class OptimizerState:
    """An optimizer's state by tensor name: `groups` (each group's options,
    without params), `member` ({tensor name: group index}) and `state`
    ({tensor name: {key: this rank's shard (1-D tensor) or a scalar}}).
    `partial`: of several optimizers, which need not cover every tensor nor
    share their state keys (checked per param group instead)."""

    def __init__(self, groups: List[Dict[str, Any]], member: Dict[str, int],
                 state: Dict[str, Dict[str, Any]], partial: bool = False) -> None:
        self.groups, self.member, self.state = groups, member, state
        self.partial = partial


class Names:
    """How a runtime's tensors appear in a state dict: `keys` ({model state
    dict key: tensor name}, every name of a tied parameter), `fqn` ({tensor
    name: its optimizer FQN}, the first name), `buffers` ({key: tensor});
    `distinct` ({Distinct tensor name: (its global names, this rank's
    coordinate, global_state.expected's {global name: shape})}, out of keys
    and fqn), `layout` ({Distinct tensor name: [(axis, size)]}) and, for a
    save, `master` (global_state.local_shards: this rank's master shards of
    the Distinct tensors). A Distinct tensor's optimizer FQNs are its global
    names (fqns_of)."""

    def __init__(self, keys: Dict[str, str], fqn: Dict[str, str],
                 buffers: Optional[Dict[str, torch.Tensor]] = None) -> None:
        self.keys, self.fqn, self.buffers = keys, fqn, dict(buffers or {})
        self.distinct: Dict[str, Any] = {}
        self.layout: Dict[str, List[Tuple[str, int]]] = {}
        self.master: Dict[str, Tuple[int, int, torch.Tensor]] = {}

    def fqns_of(self, t: str) -> List[str]:
        """The optimizer FQNs of tensor t: its own, or its global names."""
        if t in self.distinct:
            g = self.distinct[t][0]
            return [g[0]] if isinstance(g, tuple) else list(g)
        return [self.fqn[t]]

    def local_fqn(self, t: str) -> str:
        """The FQN whose values this rank holds (a split's whole tensor)."""
        if t in self.distinct:
            g, c, _ = self.distinct[t]
            return g[0] if isinstance(g, tuple) else g[c]
        return self.fqn[t]

    def by_fqn(self) -> Dict[str, str]:
        """{optimizer FQN: tensor name}, Distinct tensors' global names included."""
        out = {f: t for t, f in self.fqn.items()}
        for t in self.distinct:
            out.update({f: t for f in self.fqns_of(t)})
        return out

    @classmethod
    def of_model(cls, sm: ShardedModel) -> Names:
        keys, fqn = {}, {}
        for n, p in sm.model.named_parameters(remove_duplicate=False):
            slot = getattr(p, "_mfsdp_slot", None)
            if slot is not None:
                keys[n] = slot.name
                fqn.setdefault(slot.name, n)
        buffers = {}
        for mname, mod in sm.model.named_modules(remove_duplicate=False):
            for bname, b in mod._buffers.items():
                if b is not None and bname not in mod._non_persistent_buffers_set:
                    buffers[mname + "." + bname if mname else bname] = b
        out = cls({k: t for k, t in keys.items() if t not in sm.distinct},
                  {t: f for t, f in fqn.items() if t not in sm.distinct}, buffers)
        if sm.distinct:
            from . import global_state
            out.distinct = {t: (sm.globals[t], global_state.coordinate(sm, t),
                                global_state.expected(sm, {t})) for t in sm.distinct}
            out.layout = {t: global_state.layout(sm, t) for t in sm.distinct}
        return out


# ---- torch.distributed ----

def _dist_for(what: str, rt: Runtime):
    """torch.distributed when the runtime has several ranks (checked to be
    the same world), None for a world of one (DCP then runs no_dist)."""
    if rt.world_size == 1:
        return None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("%s on %d ranks needs torch.distributed: call "
                         "torch.distributed.init_process_group(\"gloo\", ...) on every rank first "
                         "(DCP coordinates the ranks' writes through it; any backend with CPU "
                         "tensors, the gloo one included)" % (what, rt.world_size))
    if dist.get_world_size() != rt.world_size or dist.get_rank() != rt.rank:
        raise UsageError("%s: torch.distributed has rank %d of %d, the mfsdp runtime rank %d of "
                         "%d: the two must be the same world in the same order"
                         % (what, dist.get_rank(), dist.get_world_size(), rt.rank, rt.world_size))
    return dist


def timeout_ms(rt: Runtime, given: Optional[int] = None) -> int:
    """`given`, else the runtime's timeout_ms, else mfsdp_config's default (600000)."""
    t = given if given is not None else getattr(rt, "timeout_ms", None)
    return DEFAULT_TIMEOUT_MS if t is None else int(t)


class Group:
    """The gloo group of a save's collectives (DCP's own included), made once
    per runtime with the runtime's timeout_ms, so that a rank that stops
    ends every other rank's save within it, not within the default group's
    timeout (30 minutes). None inside for a world of one."""

    def __init__(self, dist: Any, rt: Runtime, what: str, ms: Optional[int] = None) -> None:
        self.dist, self.what, self.pg = dist, what, None
        if dist is None:
            return
        self.pg = getattr(rt, "_mfsdp_dcp_group", None)
        if self.pg is None:
            rt.allreduce(0.0)      # every rank is here (within timeout_ms) before new_group waits
            ms = timeout_ms(rt, ms)
            self.pg = self._call(lambda: dist.new_group(
                backend="gloo", timeout=datetime.timedelta(
                    milliseconds=ms if ms > 0 else 365 * 86400 * 1000)), "creating its group")
            rt._mfsdp_dcp_group = self.pg

    def _call(self, fn, doing):
        try:
            return fn()
        except Exception as e:   # noqa: BLE001 -- gloo's timeout and peer errors alike
            raise UsageError("%s: %s failed: a rank did not answer within timeout_ms or left "
                             "(%s: %s)" % (self.what, doing, type(e).__name__,
                                           str(e).splitlines()[0] if str(e) else "")) from None

    def all_gather(self, obj: Any) -> List[Any]:
        if self.dist is None:
            return [obj]
        out = [None] * self.dist.get_world_size(self.pg)
        self._call(lambda: self.dist.all_gather_object(out, obj, group=self.pg),
                   "exchanging the ranks' state")
        return out

    def broadcast(self, obj: Any) -> Any:
        if self.dist is None:
            return obj
        box = [obj]
        self._call(lambda: self.dist.broadcast_object_list(box, src=0, group=self.pg),
                   "agreeing on the outcome")
        return box[0]


# ---- the optimizer in tensor names ----

def optimizer_state(sm: ShardedModel, optimizer, what: str) -> OptimizerState:
    """This rank's part of a torch optimizer over sm.main_parameters(), or of
    a list of them (their groups concatenated, torch's multi-optimizer rule)."""
    opts = optimizers_of(optimizer, what)
    if len(opts) > 1:
        owners(sm, opts, what)           # refuses a parameter in two of them, naming it
    by_id = {id(mp): (name, mp) for name, mp, _, _ in sm._main}
    groups, member, state = [], {}, {}
    for optimizer in opts:
        for g in optimizer.param_groups:
            gi = len(groups)
            groups.append({k: v for k, v in g.items() if k != "params"})
            for p in g["params"]:
                if id(p) not in by_id:
                    raise UsageError("%s: the optimizer steps a tensor that is not a main "
                                     "parameter of this model (give it sm.main_parameters())"
                                     % what)
                name, mp = by_id[id(p)]
                member[name] = gi
                st = optimizer.state.get(mp)
                if st:
                    state[name] = dict(st)
    return OptimizerState(groups, member, state, partial=len(opts) > 1)


def _describe(opt, main, what):
    """{tensor name: {key: ("shard", dtype name) | ("scalar", value)}} of the
    local states, or raises for a state neither shaped like the shard nor a scalar."""
    out = {}
    for name, st in opt.state.items():
        d = {}
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.numel() == main[name]:
                # this rank's shard: 1-D, or a Whole main weight's full-shape tensor
                if v.dtype not in DTYPE_NAMES or v.device.type != "cpu":
                    raise UsageError("%s: optimizer state %r of %r is a %s %s tensor (fp32, bf16 or "
                                     "fp16 on the CPU)" % (what, k, name, v.device.type, v.dtype))
                d[k] = ("shard", DTYPE_NAMES[v.dtype])
            elif isinstance(v, torch.Tensor) and v.dim() == 0:
                d[k] = ("scalar", v.detach().clone())
            elif isinstance(v, (bool, int, float)):
                d[k] = ("scalar", v)
            else:
                raise UsageError("%s: optimizer state %r of %r is neither shaped like the "
                                 "parameter nor a scalar" % (what, k, name))
        out[name] = d
    return out


# ---- save ----

def _balance(items, world):
    """Writer rank of each (bytes) item: largest first onto the least loaded rank."""
    load, owner = [0] * world, [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-items[i], i)):
        r = min(range(world), key=lambda q: (load[q], q))
        owner[i] = r
        load[r] += items[i]
    return owner


def save(rt: Runtime, names: Names, path: str, opt: Optional[OptimizerState] = None,
         what: str = "save_dcp", overwrite: bool = False,
         timeout: Optional[int] = None) -> None:
    """Writes the runtime's master weights (and `opt`) as a DCP checkpoint in
    directory `path`: a new one, or with overwrite=True one that replaces the
    DCP checkpoint there (atomically where renameat2 can exchange them).
    Collective over the runtime's world; every failure is a UsageError on
    every rank within timeout_ms (`timeout`, else the runtime's), and leaves
    no PATH.tmp-*."""
    group = Group(_dist_for(what, rt), rt, what, timeout)
    main = {v.name: v.shard_count for v in rt.views if v.shard_count}
    problem = None
    try:
        _check_target(path, what, overwrite)
        mine = _describe(opt, main, what) if opt is not None else {}
    except UsageError as e:
        problem, mine = e.message, {}
    local = {"problem": problem, "states": mine,
             "member": opt.member if opt is not None else {},
             "groups": opt.groups if opt is not None else None,
             "held": [(t, c, off, x.numel()) for t, (c, off, x) in sorted(names.master.items())],
             "coords": {t: c for t, (c, _, _) in names.master.items()}}
    every = group.all_gather(local)
    problems = [d["problem"] for d in every if d["problem"]]
    if problems:
        raise UsageError(problems[0] if rt.rank == 0 or not local["problem"] else local["problem"])
    states, member = {}, {}
    for d in every:
        states.update(d["states"])
        split = sorted(t for t, g in d["member"].items() if member.setdefault(t, g) != g)
        if split:
            raise UsageError("%s: %s %s in one param group on some ranks and in another on "
                             "others: every rank must give each tensor to the same one"
                             % (what, ", ".join(repr(t) for t in split[:8]),
                                "is" if len(split) == 1 else "are"))
    groups = every[0]["groups"]
    if opt is not None:
        missing = [v.name for v in rt.views if v.name not in states and v.name not in
                   names.distinct and (v.name in member or not opt.partial)]
        if missing:
            raise UsageError("%s: the optimizer has no state for %s (save after the first "
                             "optimizer.step())" % (what, ", ".join(missing[:8])))
    sd = _gathered(rt, names, opt, states, member, groups)
    chunks = _distinct_part(rt, names, opt, every, states, sd, what) if names.distinct else {}
    _write(rt, group, sd, path, what, overwrite, chunks)


def _check_target(path, what, overwrite):
    if os.path.lexists(path):
        if not overwrite:
            raise UsageError("%s: %s exists; a checkpoint is never overwritten unless asked: pick "
                             "a new directory, or pass overwrite=True to replace the DCP "
                             "checkpoint there" % (what, path))
        if os.path.islink(path) or not os.path.isdir(path) or \
                not os.path.isfile(os.path.join(path, dcp_files.METADATA)):
            raise UsageError("%s: %s exists and is not a DCP checkpoint (a directory with a "
                             ".metadata): overwrite=True replaces a checkpoint, nothing else"
                             % (what, path))
    if not os.path.isdir(os.path.dirname(os.path.abspath(path)) or "."):
        raise UsageError("%s: the parent directory of %s does not exist" % (what, path))


def _reason(e):
    """One line for an exception; DCP's CheckpointException by its ranks' causes."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        parts = []
        for r, f in sorted(failures.items()):
            ex = f[0] if isinstance(f, tuple) else f
            parts.append("rank %s: %s" % (r, _reason(ex)))
        return "; ".join(parts)
    if isinstance(e, UsageError):
        return e.message
    text = [line.strip() for line in str(e).splitlines() if line.strip()]
    return "%s: %s" % (type(e).__name__, "; ".join(text[:4]))


def _write(rt, group, sd, path, what, overwrite, chunks=None):
    """dcp.save of this rank's part (and its `chunks`, dcp_files.
    make_chunk_planner) into PATH.tmp-ID, the checksums, then rank 0
    commits (module comment); a failure anywhere is every rank's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    token = group.broadcast(secrets.token_hex(6) if rt.rank == 0 else None)
    tmp = "%s.tmp-%s" % (os.path.abspath(path).rstrip("/"), token)
    error, sums = None, {}
    try:
        if rt.rank == 0:
            clean_residue(path)
            os.makedirs(tmp, exist_ok=True)
            _write_marker(tmp)
        with warnings.catch_warnings():   # no_dist on purpose for a world of one
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp), process_group=group.pg,
                     no_dist=group.pg is None,
                     planner=dcp_files.make_chunk_planner(chunks or {}))
        sums = dcp_files.item_sums(tmp, rt.rank, rt.world_size, what)
    except UsageError as e:
        error = "%s (rank %d)" % (e.message, rt.rank)
    except (Exception, CheckpointException) as e:   # noqa: BLE001 -- DCP's derives from BaseException
        error = "%s: writing %s failed on rank %d: %s" % (what, tmp, rt.rank, _reason(e))
    try:
        every = group.all_gather((error, sums))
    except UsageError:
        shutil.rmtree(tmp, ignore_errors=True)     # the save failed: any rank that knows removes it
        raise
    errors = [e for e, _ in every if e]
    if rt.rank == 0 and not errors:
        items = {}
        for _, s in every:
            items.update(s)
        errors = [e for e in [_commit(tmp, path, items, what, overwrite)] if e]
    if errors:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        final = group.broadcast(errors[0] if errors else None)
    except UsageError:
        shutil.rmtree(tmp, ignore_errors=True)     # never a committed PATH: tmp is renamed first
        raise
    if final:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UsageError(final)


def _commit(tmp, path, items, what, overwrite):
    """Rank 0: the checksums, the marker removed, then tmp renamed to path (or
    exchanged with the checkpoint there). None, or the error's message."""
    try:
        dcp_files.write_sums(tmp, items, what)
        os.unlink(os.path.join(tmp, MARKER))
        _fsync_dir(tmp)
        if not os.path.lexists(path):
            os.rename(tmp, path)
        elif not overwrite:
            return "%s: %s appeared during the save; nothing overwritten" % (what, path)
        elif _exchange(tmp, path):
            shutil.rmtree(tmp, ignore_errors=True)      # the replaced checkpoint
        else:                                           # no renameat2: a moment without path
            old = tmp + ".old"
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except OSError:
                os.rename(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(os.path.dirname(os.path.abspath(path)) or ".")
    except (OSError, UsageError) as e:
        return "%s: committing %s: %s" % (what, path, e)
    return None


def _fsync_dir(d):
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a, b):
    """renameat2(a, b, RENAME_EXCHANGE): True when done, False where the
    kernel, libc or file system has no exchange; OSError otherwise."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


# ---- a killed save's PATH.tmp-ID ----

def _start_time(pid):
    """The process's start time (field 22 of /proc/PID/stat), None when unknown."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _write_marker(tmp):
    doc = {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid())}
    with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as f:
        json.dump(doc, f)


def _alive(pid, start):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, TypeError):
        return True
    return start is None or _start_time(pid) in (None, start)


def clean_residue(path: str) -> List[str]:
    """Removes, in the parent directory of `path`, every NAME.tmp-ID that a
    save_dcp (or to-dcp) on this host left when it was killed: its marker
    names a process that no longer runs. A save still running, or one from
    another host, is left alone. Returns the directories removed."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not re.fullmatch(r".+\.tmp-[0-9a-f]{12}", name):
            continue
        d = os.path.join(parent, name)
        try:
            f, _ = dcp_files.open_regular(d, MARKER, "save_dcp")
            with f:
                doc = json.loads(f.read().decode("utf-8"))
            host, pid, start = doc["host"], int(doc["pid"]), doc.get("start")
        except (UsageError, OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            continue                   # not a save's, or not readable: never touched
        if host == socket.gethostname() and not _alive(pid, start) and not os.path.islink(d):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _gathered(rt, names, opt, states, member, groups):
    """This rank's part of the state dict: the whole tensors it writes
    (gathered from every rank's shards), plus the small entries on every rank."""
    items = []                       # (view, state key or None, dtype name)
    for v in rt.views:
        if v.name in names.distinct:
            continue
        items.append((v, None, "fp32"))
        for k, (kind, x) in sorted(states.get(v.name, {}).items()):
            if kind == "shard":
                items.append((v, k, x))
    owner = _balance([v.numel * TORCH_DTYPES[d].itemsize for v, _, d in items], rt.world_size)
    full = {}
    local = {} if opt is None else opt.state
    for (v, k, d), r in zip(items, owner):
        out = None
        if r == rt.rank:
            out = torch.empty(v.shape, dtype=TORCH_DTYPES[d])
        if k is None:
            rt.gather(v.index, root=r, out=out)
        else:
            rt.gather_shard(v.index, local[v.name][k] if v.shard_count else None, root=r,
                            dtype=d, out=out)
        if out is not None:
            full[(v.name, k)] = out
    model = {key: full[(t, None)] for key, t in names.keys.items() if (t, None) in full}
    if rt.rank == 0:
        model.update({k: b.detach().clone() for k, b in names.buffers.items()})
    sd = {"model": model}
    if opt is not None:
        st = {}
        for t, d in states.items():
            if t in names.distinct:
                continue                       # _distinct_part
            f = names.fqn[t]
            for k, (kind, x) in d.items():
                if kind == "scalar":
                    st.setdefault(f, {})[k] = x
                elif (t, k) in full:
                    st.setdefault(f, {})[k] = full[(t, k)]
        pg = []
        pos = {t: i for i, t in enumerate(names.fqn)}
        order = sorted((v.name for v in rt.views), key=lambda t: pos.get(t, len(pos)))
        for gi, g in enumerate(groups):
            pg.append(dict(g, params=[f for t in order if member.get(t) == gi
                                      for f in names.fqns_of(t)]))
        sd["optim"] = {"state": st, "param_groups": pg}
    return sd


def _stated(names, every, what):
    """{Distinct tensor name: the coordinates whose ranks have its optimizer
    state}: a parameter that got no gradient yet has none (torch's own
    optimizers step only parameters with a .grad), and its global names are
    then written without state, as get_optimizer_state_dict writes them.
    UsageError when the ranks of one coordinate disagree, or a split
    tensor's slices do (its one global name is stated whole or not at all)."""
    have, lack = {}, {}
    for r, d in enumerate(every):
        for t, c in d["coords"].items():
            (have if t in d["states"] else lack).setdefault(t, {}).setdefault(c, []).append(r)
    out = {}
    for t in names.distinct:
        both = sorted(set(have.get(t, {})) & set(lack.get(t, {})))
        if both:
            c = both[0]
            raise UsageError("%s: the optimizer has state for %r on rank %d, none on rank %d of "
                             "the same coordinate %d: replicas must step alike" % (
                                 what, t, have[t][c][0], lack[t][c][0], c))
        out[t] = set(have.get(t, {}))
        if isinstance(names.distinct[t][0], tuple) and out[t] and lack.get(t):
            raise UsageError("%s: the optimizer has state for some slices of %r (split over "
                             "%s) and not for others: its global tensor %r has no whole state"
                             % (what, t, "/".join(a for a, _ in names.layout[t]),
                                names.distinct[t][0][0]))
    return out


def _distinct_part(rt, names, opt, every, states, sd, what):
    """The Distinct tensors' part of this rank's save: returns its chunks
    for dcp_files.make_chunk_planner, and adds their scalar optimizer
    states and the layout record (LAYOUT) to `sd`.

    Each rank writes the elements of its own master shard (and of its
    optimizer state's shards) that no rank before it (in global_state.
    writes' order) of the same coordinate holds, as DCP chunks of the global tensor at
    their offsets (a split's slice k shifted by k * its width along D);
    the flat range is cut into boxes (dcp_files.boxes). Chosen over
    gathering each global tensor to one writing rank: no tensor bytes
    cross the network, every rank writes in parallel, and a rank holds no
    more than its own shards plus one box's copy while DCP serializes it
    (resolve_data), where a gather needs the largest global tensor on its
    writer; torch's dcp.load and load_dcp read any box out of the chunks."""
    views = {v.name: v for v in rt.views}
    counts = {}
    for t, axes in names.layout.items():
        counts[t] = 1
        for _, n in axes:
            counts[t] *= n
    from . import global_state
    ranges = global_state.writes([d["held"] for d in every], rt.rank,
                                 {t: views[t].numel for t in names.distinct}, counts, what)
    local = {} if opt is None else opt.state
    stated = _stated(names, every, what) if opt is not None else {}
    chunks = {}
    for t, spans in ranges.items():
        v, (g, c, expected), f = views[t], names.distinct[t], names.local_fqn(t)
        _, off, master = names.master[t]
        parts = [("model." + f, ("model", f), master)]
        parts += [("optim.state.%s.%s" % (f, k), ("optim", "state", f, k),
                   local[t][k].reshape(-1)) for k, (kind, _) in sorted(states.get(t, {}).items())
                  if kind == "shard" and c in stated.get(t, ())]
        for a, b in spans:
            for o, sizes, start in dcp_files.boxes(tuple(v.shape), a, b):
                if isinstance(g, tuple):
                    o[g[1]] += c * v.shape[g[1]]
                n = 1
                for d in sizes:
                    n *= d
                for key, path, data in parts:
                    chunks[(key, tuple(o))] = (data[start - off:start - off + n].view(sizes),
                                               tuple(expected[f]), path)
    if opt is not None:
        st = sd["optim"]["state"]
        for t in names.distinct:
            scalars = {}                     # coordinate -> its lowest rank's scalar states
            for d in every:
                if t in d["states"] and t in d["coords"]:
                    scalars.setdefault(d["coords"][t], {k: x for k, (kind, x)
                                                        in d["states"][t].items()
                                                        if kind == "scalar"})
            for i, f in enumerate(names.fqns_of(t)):
                if scalars and (i in scalars or isinstance(names.distinct[t][0], tuple)):
                    st.setdefault(f, {}).update(scalars.get(i, next(iter(scalars.values()))))
    if rt.rank == 0:
        record = {f: {"axes": [list(a) for a in names.layout[t]],
                      "split": g[1] if isinstance(g, tuple) else None}
                  for t, (g, _, _) in names.distinct.items() for f in names.fqns_of(t)}
        sd[LAYOUT.split(".")[0]] = {LAYOUT.split(".")[1]: json.dumps(record, sort_keys=True)}
    return chunks


# ---- load ----

def _open(path, what):
    """(SafeReader, DCP Metadata) of checkpoint directory `path`."""
    if not os.path.isdir(path):
        raise UsageError("%s: %s is not a directory (a DCP checkpoint is one)" % (what, path))
    if not os.path.lexists(os.path.join(path, dcp_files.METADATA)):
        raise UsageError("%s: %s has no .metadata: not a committed DCP checkpoint" % (what, path))
    reader = dcp_files.SafeReader(path, what)
    return reader, reader.read_metadata()


def _metadata(path, what):
    return _open(path, what)[1].state_dict_metadata


def _shape(m):
    return tuple(m.size) if hasattr(m, "size") else None


def plan_load(rt: Runtime, names: Names, md: Dict[str, Any], want_optim: bool,
              groups: Optional[int], what: str,
              partial: bool = False) -> Tuple[List[str], Dict[str, Dict[str, str]],
                                              Dict[str, Dict[str, str]]]:
    """(problems, {tensor name: {state key: "shard" | "scalar"}}, the same
    by optimizer FQN) of loading DCP metadata `md` into this runtime (and an
    optimizer of `groups` groups; `partial`: several optimizers, whose
    states load() checks per group). A Distinct tensor's optimizer FQNs are
    its global names; one without state is no problem (no gradient yet)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    problems = []
    shapes = {v.name: tuple(v.shape) for v in rt.views}
    want = {"model." + k: shapes[t] for k, t in names.keys.items()}
    want.update({"model." + k: tuple(b.shape) for k, b in names.buffers.items()})
    master = {v.name: TORCH_DTYPES[v.dtype["main_weight"]] for v in rt.views}
    dtypes = {"model." + k: master[t] for k, t in names.keys.items()}
    for t, (_, _, expected) in names.distinct.items():
        want.update({"model." + g: tuple(shape) for g, shape in expected.items()})
        dtypes.update({"model." + g: master[t] for g in expected})
    dtypes.update({"model." + k: b.dtype for k, b in names.buffers.items()})
    for key, shape in want.items():
        m = md.get(key)
        if m is None:
            problems.append("missing %r %s" % (key, list(shape)))
        elif not isinstance(m, TensorStorageMetadata):
            problems.append("%r is not a tensor in the checkpoint" % key)
        elif _shape(m) != shape:
            problems.append("%r: shape %s in the checkpoint, the model has %s"
                            % (key, list(_shape(m)), list(shape)))
        elif m.properties.dtype != dtypes[key]:
            problems.append("%r: dtype %s in the checkpoint, the model's %s" % (
                key, m.properties.dtype, dtypes[key]))
    problems += ["unexpected %r (the model has no such parameter or buffer)" % k
                 for k in md if k.startswith("model.") and k not in want]
    if not want_optim:
        return problems, {}, {}
    return _plan_optim(rt, names, md, groups, partial, problems)


def _opt_shapes(rt, names):
    """{optimizer FQN: (tensor name, the state's shape)} in the schedule's
    order: a Distinct tensor's global names with their whole shapes."""
    out = {}
    for v in rt.views:
        t = v.name
        if t in names.distinct:
            out.update({f: (t, tuple(names.distinct[t][2][f])) for f in names.fqns_of(t)})
        elif t in names.fqn:
            out[names.fqn[t]] = (t, tuple(v.shape))
    return out


def _plan_optim(rt, names, md, groups, partial, problems):
    """plan_load's optimizer part: (problems, {tensor name: {state key:
    "shard" | "scalar"}}, the same by optimizer FQN)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    opt_shapes = _opt_shapes(rt, names)
    found, pg = {}, {}
    for key, m in md.items():
        if key.startswith("optim.state."):
            f, _, k = key[len("optim.state."):].rpartition(".")
            if f not in opt_shapes:
                problems.append("unexpected %r (no parameter %r in the model)" % (key, f))
                continue
            shape = opt_shapes[f][1]
            if isinstance(m, TensorStorageMetadata) and _shape(m) == shape and \
                    m.properties.dtype not in DTYPE_NAMES:
                problems.append("%r: dtype %s in the checkpoint (optimizer state is float32, "
                                "bfloat16 or float16)" % (key, m.properties.dtype))
            elif isinstance(m, TensorStorageMetadata) and _shape(m) == shape:
                found.setdefault(f, {})[k] = "shard"
            elif isinstance(m, TensorStorageMetadata) and _shape(m) == ():
                found.setdefault(f, {})[k] = "scalar"
            elif isinstance(m, TensorStorageMetadata):
                problems.append("%r: shape %s in the checkpoint, the parameter has %s"
                                % (key, list(_shape(m)), list(shape)))
            else:
                found.setdefault(f, {})[k] = "scalar"
        elif key.startswith("optim.param_groups."):
            i, _, opt_name = key[len("optim.param_groups."):].partition(".")
            pg.setdefault(int(i) if i.isdigit() else -1, set()).add(opt_name)
        elif key.startswith("optim."):
            problems.append("unexpected %r" % key)
    if not found and not pg:
        problems.append("no optimizer state in the checkpoint (saved without optim)")
        return problems, {}, {}
    shape_of = [found[f] for f in opt_shapes if f in found]
    model_keys = sorted(set().union(*[set(d.items()) for d in shape_of])) if shape_of else []
    distinct = {f for t in names.distinct for f in names.fqns_of(t)}
    for f in opt_shapes if not partial else ():
        if f not in found and f in distinct:
            continue                         # a parameter that had no gradient yet (_stated)
        if f not in found:
            problems.append("missing the optimizer state of %r (optim.state.%s.*)" % (f, f))
        elif sorted(found[f].items()) != model_keys:
            problems.append("optim.state.%s has %s, other parameters %s" % (
                f, sorted(found[f]), sorted(k for k, _ in model_keys)))
    if groups is not None and sorted(pg) != list(range(groups)):
        problems.insert(0, "%d param groups in the checkpoint, the optimizer%s %d"
                        % (len(pg), "s have" if partial else " has", groups))
    kinds = {}
    for f in found:
        kinds.setdefault(opt_shapes[f][0], dict(found[f]))
    return problems, kinds, found


def _group_states(names, found, saved_groups):
    """Several optimizers: every parameter of a saved group has state, with
    the same keys as the others of its group (`found`: by optimizer FQN)."""
    by_fqn = names.by_fqn()
    problems = []
    for gi, g in enumerate(saved_groups):
        first = None
        for f in g.get("params", []):
            if f not in by_fqn:
                continue
            if f not in found:
                problems.append("missing the optimizer state of %r (optim.state.%s.*; param "
                                "group %d)" % (f, f, gi))
            elif first is None:
                first = (f, sorted(found[f].items()))
            elif sorted(found[f].items()) != first[1]:
                problems.append("optim.state.%s has %s, %s of the same param group %d %s" % (
                    f, sorted(found[f]), first[0], gi, sorted(k for k, _ in first[1])))
    return problems


def _read(path, md, template, what, boxes=None):
    """dcp.load of `template` through a SafeReader (dcp_files); every failure
    a UsageError. boxes {key: offsets}: those keys' templates are read from
    the box of the stored tensor at offsets (dcp_files.make_box_planner)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    reader = dcp_files.SafeReader(path, what)
    reader.use_metadata(md)
    try:
        with warnings.catch_warnings():  # no_dist on purpose: each rank reads its own tensors
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(template, storage_reader=reader, no_dist=True,
                     planner=dcp_files.make_box_planner(boxes) if boxes else None)
    except UsageError:
        raise
    except (Exception, CheckpointException) as e:   # noqa: BLE001 -- DCP's derives from BaseException
        inner = [f[0] if isinstance(f, tuple) else f
                 for f in (getattr(e, "failures", None) or {}).values()]
        if len(inner) == 1 and isinstance(inner[0], UsageError):
            raise inner[0] from None
        raise UsageError("%s: reading %s failed: %s" % (what, path, _reason(e))) from None
    return template


def _batches(path, requests, md, batch_bytes, what, boxes=None):
    """Yields {key: tensor or object} read from the checkpoint, at most
    batch_bytes of tensors a batch (a bigger tensor alone); boxes {key:
    (offsets, sizes)}: only that box of the stored tensor."""
    sd, boxes = md.state_dict_metadata, boxes or {}
    batch, size = {}, 0
    for key in requests:
        m = sd[key]
        if hasattr(m, "size"):
            t = torch.empty(tuple(boxes[key][1]) if key in boxes else tuple(m.size),
                            dtype=m.properties.dtype)
            n = t.numel() * t.element_size()
        else:
            t, n = None, 0
        if batch and size + n > batch_bytes:
            yield _read(path, md, batch, what, {k: boxes[k][0] for k in batch if k in boxes})
            batch, size = {}, 0
        batch[key] = t
        size += n
    if batch:
        yield _read(path, md, batch, what, {k: boxes[k][0] for k in batch if k in boxes})


class Staged:
    """What a load read, held until every rank has read all of it: this
    rank's master shards {tensor: 1-D tensor}, the buffers {key: tensor},
    the optimizer's state {tensor: {key: shard or scalar}} and saved groups."""

    def __init__(self) -> None:
        self.main: Dict[str, torch.Tensor] = {}
        self.buffers: Dict[str, Any] = {}
        self.state: Dict[str, Dict[str, Any]] = {}
        self.groups: List[Dict[str, Any]] = []


def _stage(rt, names, path, opt_groups, check_groups, batch_bytes, what, partial):
    """Checks a DCP checkpoint against the model and its storage, then reads
    this rank's part into a Staged; writes nothing of the model."""
    reader, md_all = _open(path, what)
    md = md_all.state_dict_metadata
    want_optim = opt_groups is not None
    problems, kinds, found = plan_load(rt, names, md, want_optim,
                                       len(opt_groups) if opt_groups else None, what, partial)
    views = {v.name: v for v in rt.views}
    where = {}                              # DCP key -> (tensor name, state key or None)
    for t in list(names.fqn) + list(names.distinct):
        f = names.local_fqn(t)                  # a Distinct tensor's: its coordinate's global one
        if views[t].shard_count:
            where["model." + f] = (t, None)
            for k in kinds.get(t, {}):
                if "optim.state.%s.%s" % (f, k) in md:       # a Distinct one may have none
                    where["optim.state.%s.%s" % (f, k)] = (t, k)
    for k in names.buffers:
        where["model." + k] = (None, k)
    group_keys = sorted(k for k in md if k.startswith("optim.param_groups.")) if want_optim else []
    if names.distinct and LAYOUT in md:
        group_keys.append(LAYOUT)
    if not problems:
        problems = dcp_files.check_storage(path, md_all, [k for k in where if k in md] + group_keys,
                                           what)
    staged = Staged()
    if want_optim and not problems:
        got = _read(path, md_all, {k: None for k in group_keys}, what)
        by_index = {}
        for k in group_keys:
            if k == LAYOUT:
                continue
            i, _, o = k[len("optim.param_groups."):].partition(".")
            by_index.setdefault(int(i), {})[o] = got[k]
        staged.groups = [by_index[i] for i in sorted(by_index)]
        if partial:
            problems += _group_states(names, found, staged.groups)
        problems += check_groups(staged.groups)
    if LAYOUT in group_keys and not problems:
        problems += _layout_problems(names, _read(path, md_all, {LAYOUT: None}, what)[LAYOUT])
    if problems:
        raise UsageError("%s: %s is not a checkpoint of this model (%d problem%s):\n  %s" % (
            what, path, len(problems), "" if len(problems) == 1 else "s", "\n  ".join(problems)))
    boxes = {}                 # a split tensor's keys: only this coordinate's slice is read
    for key, (t, k) in where.items():
        g = names.distinct[t][0] if t in names.distinct else None
        if isinstance(g, tuple) and (k is None or kinds[t][k] == "shard"):
            shape = list(views[t].shape)
            off = [0] * len(shape)
            off[g[1]] = names.distinct[t][1] * shape[g[1]]
            boxes[key] = (off, shape)
    for got in _batches(path, list(where), md_all, batch_bytes, what, boxes):
        for key, x in got.items():
            t, k = where[key]
            if t is None:
                staged.buffers[k] = x.clone()
                continue
            v = views[t]
            if k is None:
                staged.main[t] = x.reshape(-1)[v.shard_offset:v.shard_offset + v.shard_count].clone()
            elif kinds[t][k] == "shard":
                staged.state.setdefault(t, {})[k] = \
                    x.reshape(-1)[v.shard_offset:v.shard_offset + v.shard_count].clone()
            else:
                staged.state.setdefault(t, {})[k] = x.clone() if isinstance(x, torch.Tensor) else x
    return staged


def _layout_problems(names, text):
    """The Distinct tensors saved over other axis sizes or another split
    than this model's (LAYOUT, written by save_dcp): a split's whole tensor
    is the coordinates' slices in order, which a fused weight (Megatron's
    QKV) lays out differently per tp size, and a rename maps coordinates
    to global names by the spec's template; so a checkpoint reshards across
    data-parallel sizes only, with the same tp/ep sizes."""
    try:
        saved = json.loads(text)
    except (TypeError, ValueError):
        return ["%r is not the JSON save_dcp writes" % LAYOUT]
    problems = []
    for t, (g, _, _) in names.distinct.items():
        split = g[1] if isinstance(g, tuple) else None
        mine = [list(a) for a in names.layout[t]]
        for f in names.fqns_of(t):
            got = saved.get(f) if isinstance(saved, dict) else None
            if not isinstance(got, dict):
                continue                     # saved without a layout (not Distinct there)
            if [n for _, n in got.get("axes", [])] != [n for _, n in mine] or \
                    got.get("split") != split:
                problems.append(
                    "%r was saved Distinct over %s%s, this model holds it over %s%s: a DCP "
                    "checkpoint of Distinct tensors loads with the same tp/ep sizes (it "
                    "reshards across data-parallel sizes only)" % (
                        f, " x ".join("%s = %s" % (a, n) for a, n in got.get("axes", [])),
                        "" if got.get("split") is None else " split %s" % got.get("split"),
                        " x ".join("%s = %d" % (a, n) for a, n in mine),
                        "" if split is None else " split %d" % split))
                break
    return problems


def _agree(rt, error, what, path):
    """Raises on every rank when a rank failed to stage (the runtime's own
    collective, within its timeout_ms): nothing is committed anywhere."""
    failed = error is not None
    if rt.world_size > 1:
        first = int(rt.allreduce(float(rt.rank if failed else rt.world_size), "min"))
        if error is None and first < rt.world_size:
            raise UsageError("%s: rank %d refused %s (its error says why); nothing was loaded on "
                             "any rank" % (what, first, path))
    if error is not None:
        raise UsageError(error)


def load(rt: Runtime, names: Names, path: str, opt_groups: Optional[List[Dict[str, Any]]],
         check_groups, batch_bytes: int = BATCH_BYTES,
         what: str = "load_dcp", partial: bool = False) -> Optional[OptimizerState]:
    """Reads a DCP checkpoint into the runtime's master weights (and the
    model's buffers); with opt_groups (the loading optimizer's groups, or []
    for "any"), returns the optimizer's state for this rank's shards. All or
    nothing on every rank: each rank checks and reads its part first
    (_stage; every problem listed in one UsageError), the ranks agree, and
    only then is anything written. check_groups(saved param groups) returns
    further problems."""
    from torch.distributed.checkpoint.api import CheckpointException
    error, staged = None, None
    try:
        staged = _stage(rt, names, path, opt_groups, check_groups, batch_bytes, what, partial)
    except UsageError as e:
        error = e.message
    except (Exception, CheckpointException) as e:   # noqa: BLE001 -- every rank must learn of it
        error = "%s: reading %s failed: %s" % (what, path, _reason(e))
    _agree(rt, error, what, path)
    views = {v.name: v for v in rt.views}
    for t, shard in staged.main.items():
        v = views[t]
        full = torch.empty(v.numel, dtype=shard.dtype)
        full[v.shard_offset:v.shard_offset + v.shard_count] = shard
        rt.scatter(v.index, full)
    with torch.no_grad():
        for k, x in staged.buffers.items():
            names.buffers[k].copy_(x)
    if opt_groups is None:
        return None
    fqn_group = {}
    for gi, g in enumerate(staged.groups):
        for f in g.get("params", []):
            fqn_group[f] = gi
    by_fqn = names.by_fqn()
    member = {by_fqn[f]: gi for f, gi in fqn_group.items() if f in by_fqn}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in staged.groups]
    return OptimizerState(groups, member, staged.state)


# ---- ShardedModel.save_dcp / load_dcp ----

def checked_path(path: Any, what: str) -> str:
    """`path` as a str, or a UsageError naming what was given."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise UsageError("%s: the checkpoint directory must be a non-empty path (str or "
                         "os.PathLike), got %r" % (what, path))
    return os.fspath(path)


def save_dcp(sm: ShardedModel, path: str, optimizer: Optional[Optimizers] = None,
             overwrite: bool = False) -> None:
    """See ShardedModel.save_dcp; overwrite=True replaces the DCP checkpoint at path."""
    path = checked_path(path, "save_dcp")
    if not isinstance(overwrite, bool):
        raise UsageError("save_dcp: overwrite must be True or False, got %r" % (overwrite,))
    sm._between_steps("save_dcp")
    _distinct_ok(sm, "save_dcp")
    opt = optimizer_state(sm, optimizer, "save_dcp") if optimizer is not None else None
    runtime_kw = getattr(sm, "_how", (None, None, {}))[2]      # what mt.shard gave the Runtime
    names = Names.of_model(sm)
    if sm.distinct:                                  # this rank's own shards (_distinct_part)
        from . import global_state
        names.master = global_state.local_shards(sm, set(sm.distinct))
    save(sm.runtime, names, path, opt, overwrite=overwrite,
         timeout=runtime_kw.get("timeout_ms"))


def _distinct_ok(sm, what):
    """UsageError for a DCP checkpoint of Distinct tensors without global
    names (their optimizer state goes under the same global names)."""
    if not sm.distinct:
        return
    from . import global_state
    global_state.refuse_unnamed(sm, what, sm.distinct)


def load_dcp(sm: ShardedModel, path: str, optimizer: Optional[Optimizers] = None,
             batch_bytes: int = BATCH_BYTES) -> None:
    """See ShardedModel.load_dcp."""
    path = checked_path(path, "load_dcp")
    if isinstance(batch_bytes, bool) or not isinstance(batch_bytes, int) or batch_bytes < 1:
        raise UsageError("load_dcp: batch_bytes must be a positive int (bytes read at a time), "
                         "got %r" % (batch_bytes,))
    sm._between_steps("load_dcp")
    _distinct_ok(sm, "load_dcp")
    names = Names.of_model(sm)
    opts = optimizers_of(optimizer, "load_dcp")
    mine = optimizer_state(sm, opts, "load_dcp") if opts is not None else None
    flat = [(i, o, g) for i, o in enumerate(opts or []) for g in o.param_groups]
    several = opts is not None and len(opts) > 1

    def whose(i, o):
        return "%s's" % type(o).__name__ if not several else \
            "optimizer %d's (%s)" % (i, type(o).__name__)

    def check_groups(saved):
        problems = []
        for gi, ((i, o, g), s) in enumerate(zip(flat, saved)):
            have = sorted(k for k in g if k != "params")
            got = sorted(k for k in s if k != "params")
            if have != got:
                problems.append("param group %d: the checkpoint's options %s, this %s %s (saved "
                                "by another optimizer class%s?)" % (
                                    gi, got, whose(i, o), have,
                                    ", or the optimizers in another order" if several else ""))
            held = set(s.get("params", []))
            for t, k in mine.member.items():
                out = [f for f in names.fqns_of(t) if f not in held] if k == gi else []
                if out:
                    problems.append("%r is in param group %d of the optimizer%s, not in the "
                                    "checkpoint's" % (out[0], gi, "s (%s)" % whose(i, o)
                                                      if several else ""))
        if several:
            saved_at = {f for s in saved for f in s.get("params", [])}
            problems += ["%r is in none of these optimizers but has optimizer state in the "
                         "checkpoint" % names.fqns_of(t)[0] for t, _, _, _ in sm._main
                         if t not in mine.member and names.fqns_of(t)[0] in saved_at]
        return problems

    opt = load(sm.runtime, names, path, mine.groups if opts is not None else None,
               check_groups, batch_bytes, partial=several)
    if opts is None:
        return
    for (_, _, g), s in zip(flat, opt.groups):
        for k, v in s.items():
            g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
    for name, mp, _, _ in sm._main:
        if name in mine.member:
            optimizer = flat[mine.member[name]][1]
            optimizer.state[mp] = {k: (x.view(mp.shape).to(mp.dtype) if isinstance(x, torch.Tensor)
                                       and x.dim() == 1 else x)
                                   for k, x in opt.state.get(name, {}).items()}
