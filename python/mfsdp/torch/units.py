"""
units: a model's units under a schedule, bound to a runtime's tensors (the
first steps of ShardedModel, shard.py).

match() checks the schedule against the model: every unit names a
submodule, every tensor a parameter of it with the same shape, every
parameter is covered; all mismatches are listed in one ModelMismatchError.
bind() makes each parameter's .data a view of the runtime's unsharded weight
(valid inside its unit's windows, hooks.py, as FSDP2's unsharded parameters
are) and gives each tensor this rank holds a master shard (a MainParameter
over main_weight, its gradient over grad), copying the parameter's current
value into it unless the model was built on meta (init.py fills it then).
Nothing here installs a hook or calls the runtime's step API.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, List, Set, Tuple

import torch

from .. import _lib
from .._lib import MfsdpError, UsageError
from . import init as _init
from .guard import GuardedParameter, MainParameter, ParamSlot
from .tensors import tensor

if TYPE_CHECKING:
    from ..runtime import Runtime
    from ..schedule import Schedule


class ModelMismatchError(UsageError):
    """The schedule does not describe the model; `problems` lists every mismatch."""

    def __init__(self, problems: List[str]) -> None:
        self.problems = list(problems)
        super().__init__("the schedule does not match the model (%d problem%s):\n  %s" % (
            len(self.problems), "" if len(self.problems) == 1 else "s",
            "\n  ".join(self.problems)))


def match(model: torch.nn.Module,
          sched: Schedule) -> List[Tuple[int, Any, List[Tuple[int, Any]]]]:
    """[(unit index, module, [(view index, parameter)])] or ModelMismatchError."""
    taken = [n for n, p in model.named_parameters() if isinstance(p, GuardedParameter)]
    if taken:
        raise ModelMismatchError([
            "parameter %r is already sharded (%s): a model is driven by one ShardedModel, and "
            "close() frees its weights; shard a fresh model" % (
                n, model.get_parameter(n)._mfsdp_slot.state) for n in taken])
    problems = []
    units = []
    covered = set()
    for u, uname in enumerate(sched.units):
        try:
            mod = model.get_submodule(uname)
        except AttributeError:
            problems.append("unit %r: the model has no submodule of that name" % uname)
            units.append((u, None, []))
            continue
        params = []
        for t in sched.unit_tensors(u):
            tname = t.name[len(uname) + 1:]
            try:
                p = mod.get_parameter(tname)
            except AttributeError:
                problems.append("tensor %r: module %r has no parameter %r" % (
                    t.name, uname, tname))
                continue
            if tuple(p.shape) != t.shape:
                problems.append("tensor %r: the schedule says shape %s, the model has %s" % (
                    t.name, list(t.shape), list(p.shape)))
                covered.add(id(p))     # named, so not listed again as uncovered
                continue
            if id(p) in covered:
                problems.append("tensor %r: this parameter is already another tensor of the "
                                "schedule (tied weights belong to one unit)" % t.name)
                continue
            if not p.requires_grad:
                problems.append("tensor %r: the parameter does not require grad (frozen "
                                "parameters are not supported)" % t.name)
            covered.add(id(p))
            params.append((t.index, p))
        units.append((u, mod, params))
    for name, p in model.named_parameters():
        if id(p) not in covered:
            problems.append("parameter %r %s is in no unit of the schedule" % (
                name, list(p.shape)))
    if problems:
        raise ModelMismatchError(problems)
    return units


def bind(rt: Runtime, schedule: Schedule, units: List[Tuple[int, Any, List[Tuple[int, Any]]]],
         holders: Dict[int, List[Tuple[torch.nn.Module, str]]], whole_step: Set[str], meta: bool,
         out_units: List[Any], out_main: List[Any],
         out_slots: List[List[ParamSlot]]) -> Tuple[Dict[str, int], Dict[str, torch.dtype]]:
    """Binds match()'s units to runtime `rt`, appending per unit (module,
    [(param, view, grad_local tensor)]) to out_units and its [ParamSlot] to
    out_slots, and (name, master Parameter, grad tensor, view) per master
    shard to out_main. Returns ({tensor name: hash of its initial value}
    (none on meta), {tensor name: the parameter's dtype})."""
    hashes, dtypes = {}, {}
    with torch.no_grad():
        for u, mod, params in units:
            entries, slots = [], []
            for vi, p in params:
                v = rt.views[vi]
                if v.shard_count:
                    whole = schedule.tensors[vi].whole_main_weight
                    main = MainParameter(master(rt, v, "main_weight", whole))
                    if not meta:
                        flat = p.detach().reshape(-1)[v.shard_offset:
                                                      v.shard_offset + v.shard_count]
                        main.data.copy_(flat.view(main.shape).to(device=main.device,
                                                                 dtype=main.dtype))
                    main.full_name, main.full_shape = v.name, torch.Size(v.shape)
                    out_main.append((v.name, main, master(rt, v, "grad", whole), v))
                dtypes[v.name] = p.dtype
                if meta:              # the init after sharding fills the shards (init.py)
                    p = materialised(p, tensor(rt, v, "weight"), holders)
                else:
                    hashes[v.name] = _init.tensor_hash(p)
                    p.data = tensor(rt, v, "weight")
                entries.append((p, v, tensor(rt, v, "grad_local")))
                slots.append(ParamSlot(v.name, schedule.units[u], p, holders[id(p)],
                                       v.name in whole_step))
            out_units.append((mod, entries))
            out_slots.append(slots)
    return hashes, dtypes


def built_on_meta(model: torch.nn.Module) -> bool:
    """True when every parameter is on meta (the FSDP2 way to build a large
    model: init.py); a model with some on meta and some not is refused."""
    on = [p.is_meta for p in model.parameters()]
    if any(on) and not all(on):
        names = [n for n, p in model.named_parameters() if p.is_meta]
        raise UsageError("the model has %d parameters on meta (%s, ...) and %d elsewhere: build "
                         "it wholly on meta (with torch.device(\"meta\"): ...) and initialise it "
                         "after mt.fully_shard, or materialise it wholly before"
                         % (len(names), names[0], len(on) - len(names)))
    return bool(on) and all(on)


def materialised(p: torch.nn.Parameter, data: torch.Tensor,
                 holders: Dict[int, Any]) -> torch.nn.Parameter:
    """A Parameter over the runtime's weight replacing meta parameter p in
    every module that holds it (a meta tensor's .data cannot be set)."""
    real = torch.nn.Parameter(data, requires_grad=p.requires_grad)
    for mod, attr in holders[id(p)]:
        mod._parameters[attr] = real
    holders[id(real)] = holders.pop(id(p))
    return real



def master(rt: Runtime, view: Any, role: str, whole: bool) -> torch.Tensor:
    """The tensor over main_weight or grad of a view: this rank's 1-D shard,
    or for a Whole main weight (view.shard_count == numel on an owner) the
    whole tensor in its own shape."""
    t = tensor(rt, view, role)
    if not whole:
        return t
    if view.shard_offset != 0 or view.shard_count != view.numel:
        raise MfsdpError(_lib.ERR_INTERNAL, "tensor %r: main_weight is Whole but this rank's shard "
                         "is elements [%d, +%d) of %d (an owner holds them all, a non-owner none)"
                         % (view.name, view.shard_offset, view.shard_count, view.numel))
    return t.view(view.shape)

def replicated_weights(schedule: Schedule, holders: Dict[int, Any],
                       units: List[Any]) -> Set[str]:
    """Names of the tensors whose compute weight is replicated on every axis
    (the `tied` layout, DDP's): gathered once per step, valid for the whole
    step. From the schedule's YAML (its buckets' weight placements); for a
    schedule loaded from a file that is no longer readable, the parameters
    held by several modules (ties by name)."""
    text = schedule.text
    if text is None:
        try:
            with open(schedule.name, "rb") as f:
                text = f.read()
        except OSError:
            return {schedule.tensors[ti].name for _, _, params in units for ti, p in params
                    if len(holders[id(p)]) > 1}
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    out, replicated = set(), False
    for line in text.splitlines():
        if line.startswith("- name: ") or not line.startswith((" ", "-")):
            replicated = False      # the next bucket, or the next top-level key
        m = _WEIGHT_PLACEMENT.match(line)
        if m:
            replicated = all(p.strip() == "Replicate" for p in m.group(1).split(","))
        m = _BUCKET_TENSOR.match(line)
        if m and replicated:
            out.add(m.group(1).strip().strip('"'))
    return out


_WEIGHT_PLACEMENT = re.compile(r"^  weight: \{.*placement: \[([^\]]*)\]")
_BUCKET_TENSOR = re.compile(r'^  - \{name: ("[^"]*"|[^,]+),')
