"""
guard: the sharded model's parameters outside their windows.

A parameter of a sharded model is a view of the runtime's unsharded weight,
which holds the tensor only inside the windows the schedule gives it (its
unit's forward hooks and backward hooks; the whole step for a weight
replicated on every axis, the `tied` layout). Outside them the same bytes
may hold another unit's weight, so a read there trains silently wrong.

Each parameter therefore has a stand-in, a GuardedParameter of the same
shape, dtype and device over no data (one element, expanded), that every
module holding the parameter sees outside the windows: metadata (shape,
dim, numel, dtype, device, requires_grad, grad) answers as for the real
parameter; any computation raises a UsageError naming the parameter, its
unit and why no window is open. ParamSlot swaps the real parameter and its
stand-in in the holders' _parameters dicts (a few dict stores per
parameter per hook: the generation check costs no tensor work). Autograd
is unaffected: the graph holds the real parameter it read in the window.
Before the first step of a model built on meta a stand-in forwards any
computation to init.DeferredInit (its unit made whole for the init). A
refusal names the habit that reached the stand-in when it is not a tie
(freezing, deepcopy, torch.compile). MainParameter is a master shard that
answers dim()/ndim with its whole tensor's (nanoGPT's p.dim() >= 2 grouping).
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from .._lib import UsageError

_T = torch.Tensor
# what a stand-in answers: the facts of the tensor, never its data
_METADATA = frozenset([
    _T.dim, _T.ndimension, _T.numel, _T.nelement, _T.size, _T.element_size,
    _T.shape.__get__, _T.ndim.__get__, _T.dtype.__get__, _T.device.__get__,
    _T.is_cuda.__get__, _T.is_leaf.__get__, _T.requires_grad.__get__, _T.grad.__get__,
    _T.grad.__set__, _T.__hash__, _T.layout.__get__, _T.is_floating_point, _T.is_complex,
    _T.is_sparse.__get__, _T.is_meta.__get__, _T.is_quantized.__get__, _T.__len__,
])


def _over_no_data(cls, like, slot, requires_grad):
    """A `cls` tensor of like's shape, dtype and device over one zero element
    (expanded: no memory of that size), belonging to ParamSlot `slot`."""
    data = torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape)
    g = torch.Tensor._make_subclass(cls, data, requires_grad)
    g._mfsdp_slot = slot
    return g


def _plain_call(func, args, kwargs):
    """func as on a plain tensor (shape, dtype and the other metadata)."""
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **(kwargs or {}))


class GuardedParameter(torch.nn.Parameter):
    """The stand-in of a sharded parameter outside its windows (see above)."""

    def __new__(cls, like, slot):
        return _over_no_data(cls, like, slot, like.requires_grad)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _METADATA:
            return _plain_call(func, args, kwargs)
        guard = next((a for a in _flat(args, kwargs) if isinstance(a, GuardedParameter)), None)
        what = getattr(func, "__name__", str(func))
        if guard is None:
            raise UsageError("%s on a parameter of a sharded model outside its windows" % what)
        slot = guard._mfsdp_slot
        if slot.init is not None:          # a model built on meta, before its first step
            return slot.init.call(func, args, kwargs or {})
        raise UsageError(slot.refusal(what, func))

    def __repr__(self):
        return "GuardedParameter(%r, shape=%s: %s)" % (
            self._mfsdp_slot.name, list(self.shape), self._mfsdp_slot.state)

    def __reduce_ex__(self, proto):
        raise UsageError(self._mfsdp_slot.refusal("pickling"))

    def __deepcopy__(self, memo):
        raise UsageError(self._mfsdp_slot.refusal("deepcopy", copy_deepcopy))


def copy_deepcopy() -> None:
    """Stands for copy.deepcopy in refusal() (not a torch function)."""


_FREEZE = frozenset([_T.requires_grad_, _T.requires_grad.__set__])


class GuardedGrad(torch.Tensor):
    """The .grad of a stand-in after a step delivered its gradient: the
    model's own parameters hold none (autograd's gradient went into the
    runtime), so torch.nn.utils.clip_grad_norm_(model.parameters()) would
    clip nothing and report 0. Any computation on it raises a UsageError
    naming sm.clip_grad_norm_; zeroing it (model.zero_grad(), with or without
    set_to_none) works."""

    def __new__(cls, like, slot):
        return _over_no_data(cls, like, slot, False)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _METADATA:
            return _plain_call(func, args, kwargs)
        if func == _T.grad_fn.__get__:
            return None
        if func in _ZEROING:
            return args[0]            # zero_grad(set_to_none=False): nothing to zero
        slot = next(a for a in _flat(args, kwargs) if isinstance(a, GuardedGrad))._mfsdp_slot
        raise UsageError(
            "%s of the .grad of parameter %r of a sharded model (model.parameters()): the "
            "model's own parameters hold no gradient, the runtime delivers it to the master "
            "shards (sm.main_parameters()); clip with sm.clip_grad_norm_(max_norm) instead of "
            "torch.nn.utils.clip_grad_norm_(model.parameters(), ...), read the global norm with "
            "sm.grad_norm()" % (getattr(func, "__name__", str(func)), slot.name))

    def __repr__(self):
        return "GuardedGrad(%r: the gradient is on sm.main_parameters())" % self._mfsdp_slot.name


_ZEROING = frozenset([_T.zero_, _T.detach_, _T.requires_grad_])


def _flat(args, kwargs):
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


class ParamSlot:
    """One sharded parameter: the real one, its stand-in and every
    (module, attribute) that holds it. `state` says why no window is open
    (shown in the refusal); open() shows the real parameter, shut() the
    stand-in."""
    __slots__ = ("name", "unit", "real", "stand_in", "holders", "is_open", "state",
                 "whole_step", "init")

    def __init__(self, name: str, unit: str, real: torch.nn.Parameter,
                 holders: List[Tuple[Any, str]], whole_step: bool) -> None:
        self.name = name                # the tensor's full name
        self.unit = unit                # its unit's name
        self.real = real
        self.holders = holders          # [(module, attribute name)]
        self.whole_step = whole_step    # weight replicated on every axis: open for the step
        self.stand_in = GuardedParameter(real, self)
        self.is_open = True
        self.state = "before the first step"
        self.init = None                # DeferredInit (init.py) of a model built on meta

    def open(self) -> None:
        if not self.is_open:
            for mod, attr in self.holders:
                mod._parameters[attr] = self.real
            self.is_open = True

    def shut(self, state: str) -> None:
        self.state = state
        if self.is_open:
            for mod, attr in self.holders:
                mod._parameters[attr] = self.stand_in
            self.is_open = False

    def grad_delivered(self, delivered: bool) -> None:
        """A step delivered the gradient (the stand-in's .grad refuses use,
        GuardedGrad), or a new step began (.grad is None)."""
        self.stand_in.grad = GuardedGrad(self.real, self) if delivered else None

    def refusal(self, what: str, func: Any = None) -> str:
        if self.state == "closed":
            return ("%s of parameter %r: its ShardedModel was closed (sm.close()), so the "
                    "parameter has no data; take sm.full_state_dict() before close() and load it "
                    "into an unsharded model, or shard the model again with mt.shard"
                    % (what, self.name))
        why = _habit(func, self.name)
        if why:
            return why
        return ("%s of parameter %r outside the windows of its unit %r (%s): the runtime holds "
                "the weight only between that unit's hooks. A weight read by another unit's "
                "module (F.linear(h, self.tok.weight)) is a tie: declare it so that "
                "spec_from_module gives it the `tied` layout (valid for the whole step); between "
                "steps, read the weights with sm.full_state_dict()" % (what, self.name,
                                                                        self.unit, self.state))


def _compiling() -> bool:
    try:
        return bool(torch.compiler.is_compiling())
    except AttributeError:       # torch without torch.compiler
        return False


def refusal_of(func: Any, name: str) -> str:
    """The refusal of a habit (below) on parameter `name`, or ""."""
    return _habit(func, name)


def _habit(func: Any, name: str) -> str:
    """The refusal of a habit that reaches a stand-in for another reason than
    a tie: freezing, deepcopy (an EMA copy), torch.compile of the sharded
    model, an init after sharding a model that was not built on meta."""
    if func in _FREEZE:
        return ("requires_grad_(False) on parameter %r of a sharded model: frozen parameters "
                "are not supported (every parameter of the schedule is trained; its gradient "
                "is reduced by the schedule). Keep the module out of the sharded model (apply "
                "it outside, under torch.no_grad()), or leave it trainable and keep it fixed by "
                "giving its master shard lr=0.0 and weight_decay=0.0 in its own param group "
                "(sm.named_main_parameters())" % name)
    if func is copy_deepcopy:
        return ("copy.deepcopy of a sharded model (parameter %r): its parameters are views of "
                "the runtime's buffers, not values. For an EMA keep copies of the master shards "
                "(ema = [p.detach().clone() for p in sm.main_parameters()], then "
                "e.lerp_(p, 1 - decay) after each optimizer.step()); for a whole copy take "
                "sm.full_state_dict() and load it into an unsharded model" % name)
    if _compiling():
        return ("torch.compile of a sharded model (it reached parameter %r while tracing): "
                "mfsdp's unit hooks gather and free the weights around each unit's forward, "
                "which a whole-model graph cannot hold. Compile each block before sharding "
                "instead (for layer in model.layers: layer.compile(), then mt.fully_shard): "
                "the blocks run compiled inside the unit hooks" % name)
    return ""
_DIMS = frozenset([_T.dim, _T.ndimension, _T.ndim.__get__])


class MainParameter(torch.nn.Parameter):
    """A master shard (sm.main_parameters()): a 1-D slice of its tensor
    (or, for a Whole main weight, the whole tensor) that answers dim(),
    ndim and ndimension() with its whole tensor's number of dimensions
    (len(full_shape)), so grouping by p.dim() >= 2 (nanoGPT's weight decay)
    does what it does on the full parameters. shape, numel() and every
    computation are the shard's own; results are plain tensors."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _DIMS and isinstance(args[0], MainParameter):
            full = getattr(args[0], "full_shape", None)
            if full is not None:
                return len(full)
        return _plain_call(func, args, kwargs)


def _foreach_types() -> None:
    """torch's optimizers take their foreach path only for listed types."""
    import torch.optim.optimizer as _opt
    import torch.utils._foreach_utils as _fe
    for lst in (getattr(_opt, "_foreach_supported_types", None),
                getattr(_fe, "_foreach_supported_types", None)):
        if isinstance(lst, list) and MainParameter not in lst:
            lst.append(MainParameter)


_foreach_types()



def holders_of(model: torch.nn.Module) -> Dict[int, List[Tuple[torch.nn.Module, str]]]:
    """{id(parameter): [(module, attribute name)]} over every module of the
    model, tied parameters listed under each module that holds them."""
    out = {}
    for mod in model.modules():
        for attr, p in mod._parameters.items():
            if p is not None:
                out.setdefault(id(p), []).append((mod, attr))
    return out
