"""
init: the FSDP2 way to build a large model, and the check that every rank
starts from the same values (docs/pytorch.md, "Building on meta").

    with torch.device("meta"):
        model = Model(config)
    sm = mt.fully_shard(model, mesh=...)        # no memory for the weights yet
    model.to_empty(device="cpu")                # the buffers (the weights are the runtime's)
    model.apply(model._init_weights)            # or init_weights(), reset_parameters()

DeferredInit replays the model's own init unit by unit. Between sharding and
the first forward the modules hold stand-ins (guard.py); the first
computation on one of them (nn.init.normal_, .data, weight[i].zero_()) makes
its unit whole: a full-size tensor per parameter (zeros the first time, the
current master weights gathered from every rank when the unit was made
whole before), which the modules hold until a parameter of another unit is
touched. Then the unit's tensors give each rank its shard and are freed. So
each rank runs the same init calls on full tensors in the same order as one
process initialising the whole model, and its random number generator is
consumed the same way: the master shards hold exactly the single-process
values, and at most one unit is whole at a time (peak_bytes). The first
forward (or a helper such as full_state_dict) ends the init: every unit must
have been initialised or loaded (load_full_state_dict, load_dcp, import_hf,
load_checkpoint), no buffer may still be on meta.

agree(): every rank's initial values of every parameter and buffer are
compared at sharding (after the deferred init for a model built on meta):
an 8-byte checksum per tensor, one all-reduce of the hashes' max and min.
A mismatch (ranks seeded differently) is a UsageError naming the tensors;
rank 0's values are not broadcast.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

from .. import _lib
from .._lib import MfsdpError, UsageError
from .guard import GuardedParameter
from .tensors import DTYPE_NAMES, leaves_in

if TYPE_CHECKING:
    from .shard import ShardedModel


def tensor_hash(t: torch.Tensor) -> int:
    """A 64-bit checksum of a tensor's bytes (CRC-32 and Adler-32 side by
    side: several GB/s, a model that every rank holds whole is read once;
    bf16/fp16 through their bits). Not cryptographic: it tells values that
    differ by accident (another seed), not by design."""
    b = t.detach().reshape(-1).contiguous().cpu()
    if b.dtype == torch.bool:
        b = b.to(torch.uint8)
    data = memoryview(b.view(torch.uint8).numpy()) if b.numel() else b""   # no copy
    return zlib.crc32(data) | (zlib.adler32(data) << 32)


def differing(sm: ShardedModel, hashes: Dict[str, int]) -> List[str]:
    """The keys of {key: hash} whose hash is not the same on every rank (one
    all-reduce of max and min, in chunks of 22 bits each exact in a double);
    [] on one rank, or on the nccl backend without torch.distributed."""
    rt = sm.runtime
    if rt.world_size <= 1 or not hashes:
        return []
    names = sorted(hashes)
    parts = []
    for n in names:
        h = hashes[n]
        parts += [float(h & 0x3FFFFF), float((h >> 22) & 0x3FFFFF), float(h >> 44)]
    try:
        got = rt.allreduce(parts + [-x for x in parts], "max")
    except MfsdpError as e:
        if e.code != _lib.ERR_UNSUPPORTED:
            raise
        got = _dist_max(parts + [-x for x in parts], rt)   # the nccl backend has no helpers
        if got is None:
            return []
    k = len(parts)
    return [names[i // 3] for i in range(0, k, 3)
            if any(got[j] != -got[k + j] for j in range(i, i + 3))]


def agree(sm: ShardedModel, hashes: Dict[str, int], what: str) -> None:
    """Compares the hashes {tensor name: hash} over the world (differing);
    a UsageError names the tensors whose values differ between ranks."""
    differ = differing(sm, hashes)
    if differ:
        raise UsageError(
            "the ranks start from different values of %d tensor%s (%s%s) %s: each rank would "
            "train its own shard of another model. Seed every rank the same before building "
            "the model (torch.manual_seed(seed) on every rank, as a single process would), or "
            "load the weights after sharding (sm.load_full_state_dict(sd), sm.load_dcp(dir), "
            "sm.import_hf(dir)); mfsdp compares the ranks' values (a hash per tensor) and does "
            "not broadcast rank 0's" % (
                len(differ), "" if len(differ) == 1 else "s", ", ".join(differ[:8]),
                ", ..." if len(differ) > 8 else "", what))


def _dist_max(values: List[float], rt: Any) -> Optional[List[float]]:
    """The max over torch.distributed's world (the nccl backend needs it
    initialised on more than one rank), or None without it."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return None
    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def replaced(name: str) -> str:
    """The refusal of a parameter replaced after sharding."""
    return ("parameter %r was replaced after sharding (a new nn.Parameter set on its module): "
            "the runtime trains the parameters it sharded, so the new one would never change; "
            "initialise in place instead (nn.init.normal_(module.weight), "
            "module.weight.copy_(...)), or replace it before mt.fully_shard / mt.shard" % name)


def buffer_hashes(model: torch.nn.Module) -> Dict[str, int]:
    return {"buffer " + n: tensor_hash(b) for n, b in model.named_buffers()
            if b is not None and not b.is_meta}


def _swap(obj: Any, whole: Dict[int, torch.Tensor]) -> Any:
    """obj with every stand-in replaced by its unit's whole tensor."""
    if isinstance(obj, GuardedParameter):
        return whole.get(id(obj), obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_swap(o, whole) for o in obj)
    if isinstance(obj, list):
        return [_swap(o, whole) for o in obj]
    if isinstance(obj, dict):
        return {k: _swap(v, whole) for k, v in obj.items()}
    return obj


class DeferredInit:
    """The init of a model built on meta, one unit whole at a time (module comment)."""

    def __init__(self, sm: ShardedModel, dtypes: Dict[str, torch.dtype]) -> None:
        self.sm = sm
        self.dtypes = dtypes                 # tensor name -> the parameter's own dtype
        self.unit_of = {}                    # tensor name -> unit index
        for u, slots in enumerate(sm._slots):
            for s in slots:
                self.unit_of[s.name] = u
                s.init = self
        self.main = {n: (mp, v) for n, mp, _, v in sm._main}
        self.views = {v.name: v for v in sm.runtime.views}
        self.whole = {}                      # unit -> [(slot, full tensor)]
        self.by_stand_in = {}                # id(stand-in) -> full tensor
        self.initialised = set()             # units made whole at least once, or loaded
        self.hashes = {}                     # tensor name -> hash of its full value
        self.live_bytes = 0
        self.peak_bytes = 0                  # most bytes whole at once (full tensors)

    # ---- what the stand-ins call ----
    def call(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """func over the whole tensors of the stand-ins it was given."""
        units = {self.unit_of[a._mfsdp_slot.name] for a in leaves_in([args, kwargs])
                 if isinstance(a, GuardedParameter)}
        for u in [w for w in self.whole if w not in units]:
            self.flush(u)
        for u in sorted(units):
            self.make_whole(u)
        return func(*_swap(args, self.by_stand_in), **_swap(kwargs, self.by_stand_in))

    def make_whole(self, u: int) -> None:
        if u in self.whole:
            return
        rt = self.sm.runtime
        entries = []
        with torch.no_grad():
            for s in self.sm._slots[u]:
                mp, v = self.main.get(s.name, (None, self.views[s.name]))
                dev = mp.device if mp is not None else s.real.device
                full = torch.zeros(v.shape, dtype=self.dtypes[s.name], device=dev)
                if u in self.initialised:    # made whole before: its values are in the shards
                    host = full if full.device.type == "cpu" else torch.empty_like(full, device="cpu")
                    rt.gather(v.index, root=_lib.ALL_RANKS, dtype=DTYPE_NAMES[host.dtype],
                              out=host)
                    if host is not full:
                        full.copy_(host)
                p = torch.nn.Parameter(full, requires_grad=s.real.requires_grad)
                for mod, attr in s.holders:
                    mod._parameters[attr] = p
                self.by_stand_in[id(s.stand_in)] = p
                self.live_bytes += full.numel() * full.element_size()
                entries.append((s, p))
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.sm.init_peak_bytes = self.peak_bytes
        self.whole[u] = entries
        self.initialised.add(u)

    def flush(self, u: int) -> None:
        """Unit u's whole tensors give this rank its shards and are freed."""
        with torch.no_grad():
            for s, p in self.whole.pop(u):
                mp, v = self.main.get(s.name, (None, None))
                if mp is not None:
                    flat = p.detach().reshape(-1)[v.shard_offset:v.shard_offset + v.shard_count]
                    mp.copy_(flat.view(mp.shape).to(mp.dtype))
                self.hashes[s.name] = tensor_hash(p)
                for mod, attr in s.holders:
                    if mod._parameters.get(attr) is not p:
                        raise UsageError(replaced(s.name))
                    mod._parameters[attr] = s.stand_in
                del self.by_stand_in[id(s.stand_in)]
                self.live_bytes -= p.numel() * p.element_size()

    # ---- the sharded model's calls ----
    def flush_all(self) -> None:
        for u in list(self.whole):
            self.flush(u)

    def drop(self) -> None:
        """close(): the whole tensors freed, the stand-ins back, nothing written."""
        for u in list(self.whole):
            for s, p in self.whole.pop(u):
                for mod, attr in s.holders:
                    if mod._parameters.get(attr) is p:
                        mod._parameters[attr] = s.stand_in
        self.by_stand_in = {}
        self.live_bytes = 0

    def loaded(self) -> None:
        """The master weights were set by a load: every unit is initialised,
        and the values are the same on every rank (no check needed)."""
        self.flush_all()
        self.initialised = set(range(len(self.sm._slots)))
        self.hashes = {}

    def end(self, model: torch.nn.Module) -> None:
        """The first forward: every unit initialised, no buffer on meta,
        the ranks' values equal (agree); the stand-ins guard again."""
        self.flush_all()
        missing = [self.sm.schedule.units[u] for u in range(len(self.sm._slots))
                   if u not in self.initialised and self.sm._slots[u]]
        if missing:
            raise UsageError(
                "the model was built on meta and unit%s %s %s never initialised: after "
                "mt.fully_shard run the model's init (model.to_empty(device=...), then "
                "model.apply(model._init_weights), model.init_weights() or each module's "
                "reset_parameters()), or load the weights (sm.load_full_state_dict, "
                "sm.load_dcp, sm.import_hf, sm.load_checkpoint) before the first forward"
                % ("" if len(missing) == 1 else "s", ", ".join(map(repr, missing[:8])),
                   "was" if len(missing) == 1 else "were"))
        meta = [n for n, b in model.named_buffers() if b is not None and b.is_meta]
        if meta:
            raise UsageError(
                "buffer%s %s %s still on meta at the first forward: call "
                "model.to_empty(device=...) after mt.fully_shard (it allocates the buffers; the "
                "weights are the runtime's) and set the buffers in the model's init"
                % ("" if len(meta) == 1 else "s", ", ".join(map(repr, meta[:8])),
                   "is" if len(meta) == 1 else "are"))
        for slots in self.sm._slots:
            for s in slots:
                s.init = None
        hashes = dict(self.hashes, **buffer_hashes(model))
        self.sm._init = None
        agree(self.sm, hashes, "after the init that followed the meta build")


def apply_guard(sm: ShardedModel, module: torch.nn.Module) -> Any:
    """The _apply of a module of a sharded model (to_empty, to, float,
    bfloat16, cuda, ...): parameters are the runtime's, so a conversion that
    keeps their dtype and device leaves them alone (to_empty after a meta
    build only allocates the buffers); one that would change them is a
    UsageError naming the mfsdp way. Buffers are converted as torch does."""
    def _apply(fn: Any, recurse: bool = True) -> torch.nn.Module:
        if recurse:
            for child in module.children():
                child._apply(fn)
        for name, p in module._parameters.items():
            if p is None:
                continue
            probe = fn(torch.zeros(1, dtype=p.dtype))
            if probe.dtype != p.dtype:
                raise UsageError(
                    "converting parameter %r of a sharded model from %s to %s (model.to(dtype), "
                    ".half(), .bfloat16()): the compute dtype is compiled into the schedule and "
                    "the master weights stay fp32; pass mp_policy=MixedPrecisionPolicy("
                    "param_dtype=%s) to mt.fully_shard (or dtype= to spec_from_module) instead, "
                    "on the unconverted model" % (name, p.dtype, probe.dtype, probe.dtype))
            if probe.device.type != p.device.type:
                raise UsageError(
                    "moving parameter %r of a sharded model to %s: its memory is the runtime's "
                    "(backend %r); choose the device with the backend (backend=\"nccl\" uses "
                    "torch's current CUDA device) and move only the inputs"
                    % (name, probe.device, sm.runtime.backend))
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fn(b)
        return module
    return _apply


def guard_applies(sm: ShardedModel, model: torch.nn.Module) -> List[torch.nn.Module]:
    """Installs apply_guard on every module; returns them (close() removes it)."""
    mods = list(model.modules())
    for mod in mods:
        mod.__dict__["_apply"] = apply_guard(sm, mod)
    return mods


def unguard_applies(mods: Optional[List[torch.nn.Module]]) -> None:
    for mod in mods or ():
        mod.__dict__.pop("_apply", None)
