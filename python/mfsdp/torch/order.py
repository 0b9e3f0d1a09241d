"""
order: the units' order taken from the model's forward (mt.fully_shard).

A schedule runs its units in the order of the spec, which spec_from_module
takes from the module tree (registration order). A forward may call them
in another order (norms in one ModuleList, blocks in another) or call one
module twice (a shared norm). So mt.fully_shard records the order at the
model's first call: before anything else runs, the root's forward pre-hook
runs the forward once more on meta tensors (the inputs, every parameter and
buffer as meta: no memory, no data, no random numbers drawn) and records the
units' first calls. When that order is not the schedule's, or a unit is
called more than once, the spec is written again with the units in the
forward's order and the repeated units' parameters as ties (the `tied`
layout: gathered once per step, valid for every call), compiled through the
cache, and the model sharded again before the first unit runs: the master
shards keep their values and their Parameter objects (an optimizer made
before the first forward keeps working; each tensor's shard on each rank is
the same under any unit order for the Flat placements, which is checked).
A forward that cannot run on meta (it reads a value: .item(), a data-
dependent branch) keeps the spec's order; a unit then called out of order is
refused at its forward, naming units= (hooks.py, _out_of_order).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

import torch

from .._lib import MfsdpError, UsageError
from . import init as _init
from .spec import spec_from_module

if TYPE_CHECKING:
    from .fully_shard import FullyShardedModel


def _meta(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("meta")
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_meta(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_meta(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _meta(v) for k, v in obj.items()}
    return obj


def _eager() -> Any:
    """Compiled modules (layer.compile()) run eagerly in the probe: nothing is
    compiled for meta tensors."""
    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if stance is None:
        import contextlib
        return contextlib.nullcontext()
    return stance("force_eager")


def probe(sm: FullyShardedModel, args: Tuple[Any, ...],
          kwargs: Dict[str, Any]) -> Tuple[List[int], Dict[int, int]]:
    """(units in the order of their first call, {unit: calls}) of the
    model's forward on meta copies of args, kwargs, parameters and buffers."""
    order, calls = [], {}

    def seen(u):
        def hook(module, a):
            calls[u] = calls.get(u, 0) + 1
            if calls[u] == 1:
                order.append(u)
        return hook

    handles = [mod.register_forward_pre_hook(seen(u), prepend=True)
               for u, (mod, _) in enumerate(sm._units)]
    params, buffers = [], []
    for slots in sm._slots:
        for s in slots:
            meta = torch.nn.Parameter(torch.empty(s.real.shape, dtype=s.real.dtype,
                                                  device="meta"),
                                      requires_grad=s.real.requires_grad)
            for mod, attr in s.holders:
                params.append((mod, attr, mod._parameters[attr]))
                mod._parameters[attr] = meta
    for mod in sm.model.modules():
        for name, b in mod._buffers.items():
            if b is not None:
                buffers.append((mod, name, b))
                mod._buffers[name] = b.detach().to("meta")
    sm._probing = True
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), _eager():
            sm.model(*_meta(args), **_meta(kwargs))   # the root's hooks too (its casts)
    finally:
        sm._probing = False
        for h in handles:
            h.remove()
        for mod, attr, p in params:
            mod._parameters[attr] = p
        for mod, name, b in buffers:
            mod._buffers[name] = b
    return order, calls


def first_forward(sm: FullyShardedModel, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    """The root's first call: the order of the forward (module comment)."""
    if sm._init is not None:
        sm._init.end(sm.model)       # the deferred init ends here (init.py)
    try:
        order, calls = probe(sm, args, kwargs)
    except Exception as e:            # a forward that reads values cannot run on meta
        sm.order_note = ("mt.fully_shard could not run the forward on meta tensors to find "
                          "the order: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:200]))
        return
    repeated = [u for u, c in calls.items()
                if c > 1 and not all(s.whole_step for s in sm._slots[u])]
    if sorted(order) != list(range(sm.U)):
        sm.order_note = ("the forward on meta tensors called %d of the %d units"
                          % (len(order), sm.U))
        return
    if order == list(range(sm.U)) and not repeated:
        sm.order_note = "the forward on meta tensors ran the units in this order"
        return
    names = [sm.schedule.units[u] for u in order]
    ties = {s.name for slots in sm._slots for s in slots if s.whole_step}
    ties |= {s.name for u in repeated for s in sm._slots[u]}
    kw = dict(sm._spec_args)
    kw.pop("example", None)
    kw["ties"] = sorted(ties | set(_as_list(kw.get("ties", ()))))
    kw["units"] = names
    try:
        spec = spec_from_module(sm.model, **kw)
    except ValueError as e:
        raise UsageError("fully_shard: the spec in the forward's order (%s): %s"
                         % (", ".join(names), e)) from e
    from .cache import compile_cached
    sched, status = compile_cached(spec, name=type(sm.model).__name__,
                                   cache=sm._spec_cache)
    twice = [sm.schedule.units[u] for u in repeated]
    rebuild(sm, sched)
    sm.spec, sm.cache_status = spec, status
    sm.order_note = "mt.fully_shard took this order from the forward on meta tensors%s" % (
        " (called more than once, kept gathered for the step: %s)" % ", ".join(twice)
        if twice else "")


def _as_list(x: Any) -> List[str]:
    return [x] if isinstance(x, str) else list(x)


def rebuild(sm: FullyShardedModel, sched: Any) -> None:
    """Shards the model again with `sched` (the same tensors, units in
    another order), the master shards' values and Parameter objects kept."""
    old_rt = sm.runtime
    old = {n: (mp, v.shard_offset, v.shard_count) for n, mp, _, v in sm._main}
    for h in sm._handles:
        h.remove()
    sm._handles = []
    _init.unguard_applies(sm._applies)
    for slots in sm._slots:
        for s in slots:
            s.open()                  # the real parameters back in the modules
    backend, offload_policy, rt_kw = sm._how
    sm._build(sm.model, sched, backend, offload_policy, rt_kw, False)
    same = len(old) == len(sm._main) and all(
        n in old and old[n][1:] == (v.shard_offset, v.shard_count) for n, _, _, v in sm._main)
    try:
        differ = sm.runtime.allreduce([0.0 if same else 1.0], "max")[0] > 0
    except MfsdpError:
        differ = not same
    if differ:
        old_rt.close()
        sm.close()
        raise UsageError(
            "the forward runs the units in another order than the module tree, and in that "
            "order the ranks' shards of the master weights differ (a Whole layout): give "
            "mt.fully_shard units= in the forward's order (%s) and create the optimizer after it"
            % ", ".join(sched.units))
    with torch.no_grad():
        for i, (n, mp, g, v) in enumerate(sm._main):
            keep = old[n][0]
            mp.copy_(keep)
            keep.data = mp.data       # the optimizer's Parameter now over the new runtime
            sm._main[i] = (n, keep, g, v)
    old_rt.close()
