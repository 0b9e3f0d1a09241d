"""
fully_shard: mt.fully_shard(model, mesh=..., ...), FSDP2's one call with its
knobs by their names (docs/pytorch.md, "One call: fully_shard" and "Coming
from FSDP2: call by call").

One call builds the spec (spec_from_module: mp_policy gives the layout's
weight and grad dtypes, reshard_after_forward the units' option), compiles it
through the schedule cache, shards the model (mt.shard) and installs the
policy's casts. The result, a FullyShardedModel, is a ShardedModel that is
also callable and answers FSDPModule's methods: each either maps onto mfsdp
or raises a UsageError naming the mfsdp way.

The model's first call runs order.first_forward: the units' order (and the
units called more than once) from a forward on meta tensors, the model
sharded again in that order when it differs. FSDPModule's methods called on
the model itself (FSDP2 shards in place) and copy.deepcopy(model) raise the
same UsageErrors (_install_habits).

The schedule cache is cache.py (compile_cached).
"""
from __future__ import annotations

import fnmatch
import inspect
from typing import Any, List, Mapping, Optional, Union

import torch

from .._lib import UsageError
from ..runtime import Runtime
from ..schedule import Schedule
from . import order as _order
from . import policy as _policy
from .cache import cache_dir, cache_stats, compile_cached, compiler_identity, schedule_key
from . import guard as _guard
from .guard import GuardedParameter
from .shard import ShardedModel
from .spec import Layout, Reshard, spec_from_module

SPEC_OPTIONS = ("grad_dtype", "dtype", "reduce", "overrides", "prefetch", "reshard_last",
                "example", "ties", "matrix_optimizer", "whole_owners", "distinct",
                "global_names")
RUNTIME_OPTIONS = tuple(n for n in inspect.signature(Runtime.__init__).parameters
                        if n not in ("self", "schedule", "backend"))


# ---- the returned object ----

_WHY_SYNC = (
    "gradient synchronisation is compiled into the schedule, not switched per call: "
    "microbatches=M accumulates the step's M microbatches and delivers the gradient once, "
    "after the last; which reduction runs on which microbatch is the layout's: with "
    "layout=\"hsdp\" or \"hfsdp\" the inner (dp_inner) reduce-scatter runs on every microbatch "
    "and the outer (dp_outer) reduction once per step, at the last microbatch (FSDP2's "
    "set_requires_all_reduce(False) on the other microbatches); layout=\"hsdp_nosync\" defers "
    "both: the gradient accumulates unreduced on every rank (grad [Partial, Partial]) and is "
    "reduced over both axes at the last microbatch only (FSDP2's "
    "set_requires_gradient_sync(False) on the other microbatches); sm.finish_step() ends a "
    "step early")

FSDP_METHODS = {
    "set_requires_gradient_sync": _WHY_SYNC,
    "set_requires_all_reduce": _WHY_SYNC,
    "set_is_last_backward": "the schedule knows the step's last microbatch (microbatches=M); "
                            "end a step after fewer with sm.finish_step()",
    "set_reshard_after_forward": "reshard_after_forward is compiled per unit: pass "
                                 "reshard_after_forward=True, False or {unit pattern: bool} to "
                                 "mt.fully_shard",
    "set_reshard_after_backward": "a unit's unsharded weight is released after its backward "
                                  "by the compiled schedule (its buffer is reused by other units)",
    "set_modules_to_forward_prefetch": "prefetch is compiled: pass prefetch=N (units gathered "
                                       "ahead) to mt.fully_shard",
    "set_modules_to_backward_prefetch": "prefetch is compiled: pass prefetch=N (units gathered "
                                        "ahead) to mt.fully_shard",
    "unshard": "a unit's weights are gathered by its hooks; between steps read the whole "
               "weights with sm.full_state_dict(), and evaluate by calling the model under "
               "torch.no_grad() (no unshard needed)",
    "set_gradient_divide_factor": "the reduction is reduce=\"avg\" (mean over ranks) or "
                                  "\"sum\", an option of mt.fully_shard; scale the loss for "
                                  "any other factor",
    "set_reduce_scatter_divide_factor": "the reduction is reduce=\"avg\" or \"sum\" (an option "
                                        "of mt.fully_shard); scale the loss for another factor",
    "set_force_sum_reduction_for_comms": "pass reduce=\"sum\" to mt.fully_shard",
    "no_sync": "DDP's and FSDP1's no_sync() has no counterpart: accumulation over "
               "microbatches is compiled into the schedule; pass microbatches=M to "
               "mt.fully_shard and run M forward/backward pairs per optimizer step (the "
               "gradient is delivered once, after the last); " + _WHY_SYNC,
}


class FullyShardedModel(ShardedModel):
    """What mt.fully_shard returns: the ShardedModel (main_parameters(),
    clip_grad_norm_, full_state_dict, checkpoints, close) plus, for an FSDP2
    user, sm(...) (the model's forward, casts included), .module, .spec (the
    .mfsdp text), .schedule, .cache_status, and FSDPModule's methods
    (FSDP_METHODS: each names the mfsdp way; reshard() is a no-op between
    steps, where every weight is sharded)."""

    def __init__(self, model: torch.nn.Module, schedule: Schedule, spec: str,
                 precision: _policy.Precision, backend: str, cache_status: str,
                 offload_policy: Any = None, spec_args: Optional[Mapping[str, Any]] = None,
                 spec_cache: bool = True, expert_axes: Any = (), tensor_axes: Any = (),
                 **runtime_kw: Any) -> None:
        super().__init__(model, schedule, backend=backend, offload_policy=offload_policy,
                         expert_axes=expert_axes, tensor_axes=tensor_axes, **runtime_kw)
        self.spec = spec
        self.precision = precision
        self.cache_status = cache_status
        self._cast_handles = _policy.install_casts(
            model, [mod for mod, _ in self._units], precision)
        model._mfsdp_fully_shard = self
        self._spec_args, self._spec_cache = dict(spec_args or {}), spec_cache
        self.order_note = "the model has not been called yet (order.py takes the units' order then)"
        self._order_handle = None
        if spec_args is not None:         # the units' order from the first forward (order.py)
            self._order_handle = model.register_forward_pre_hook(
                self._first_call, with_kwargs=True, prepend=True)
        self._habits = _install_habits(model)

    def _first_call(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        self._order_handle.remove()
        self._order_handle = None
        if self._closed:
            return None
        if self._in_step or self.steps or self.phase != "idle":
            self.order_note = ("the model's own forward first ran after a step had begun, so "
                               "its order was not taken from it")
            return None
        _order.first_forward(self, args, kwargs)
        return None

    @property
    def module(self) -> torch.nn.Module:
        """The sharded module itself (FSDP2 returns it, sharded in place)."""
        return self.model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def close(self) -> None:
        for h in getattr(self, "_cast_handles", []):
            h.remove()
        self._cast_handles = []
        if getattr(self, "_order_handle", None) is not None:
            self._order_handle.remove()
            self._order_handle = None
        for name in getattr(self, "_habits", ()):
            self.model.__dict__.pop(name, None)
        self._habits = []
        if getattr(self.model, "_mfsdp_fully_shard", None) is self:
            del self.model._mfsdp_fully_shard
        super().close()

    # ---- nn.Module's calls an FSDP2 user makes on the returned model ----
    def parameters(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError("sm.parameters(): the model's own parameters are views of the "
                         "runtime's unsharded weights and never hold a gradient; give the "
                         "optimizer sm.main_parameters() (this rank's fp32 master shards) or "
                         "sm.param_groups(weight_decay=...), and clip with sm.clip_grad_norm_")

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError("sm.named_parameters(): use sm.named_main_parameters() (this rank's "
                         "master shards, with .full_name and .full_shape)")

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError("sm.state_dict(): the weights live in the runtime's shards; "
                         "sm.full_state_dict() gathers whole tensors (FSDP2's "
                         "get_model_state_dict(full_state_dict=True)), sm.save_dcp(dir, opt) writes "
                         "a DCP checkpoint (FSDP2's dcp.save), sm.save_checkpoint(dir, opt) "
                         "mfsdp's sharded one")

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError("sm.load_state_dict(): use sm.load_full_state_dict(sd) (whole "
                         "tensors, FSDP2's set_model_state_dict with full_state_dict=True), "
                         "sm.load_dcp(dir, opt) (a DCP checkpoint, FSDP2's included) or "
                         "sm.load_checkpoint(dir, opt)")

    def train(self, mode: bool = True) -> FullyShardedModel:
        self.model.train(mode)
        return self

    def eval(self) -> FullyShardedModel:
        self.model.eval()
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The model's zero_grad, which also clears the master shards' .grad
        (where the delivered gradient is), as FSDP2's clears its sharded
        parameters'."""
        self.model.zero_grad(set_to_none)

    # ---- FSDPModule ----
    def reshard(self) -> None:
        """FSDPModule.reshard: between steps every weight is already sharded
        (the unsharded buffers are transient), so this checks that no step
        is under way and does nothing."""
        self._between_steps("reshard()")

    def __getattr__(self, name: str) -> Any:
        why = FSDP_METHODS.get(name)
        if why is None and name.startswith(("set_", "unshard", "reset_", "finalize_")) \
                and _is_fsdp_method(name):
            why = ("FSDP2's runtime knob %s has no mfsdp counterpart: the schedule is compiled "
                   "from the spec (sm.spec); see docs/pytorch.md, \"Coming from FSDP2\"" % name)
        if why is None:
            raise AttributeError("%r object has no attribute %r" % (type(self).__name__, name))

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise UsageError("%s(): %s" % (name, why))
        return refuse


def _install_habits(model):
    """FSDP2 shards in place, so its users call FSDPModule's methods on the
    model itself (model.set_requires_gradient_sync(False), model.no_sync()):
    each becomes a function of the model that raises the UsageError naming
    the mfsdp way (removed by close())."""
    names = []
    for name, why in FSDP_METHODS.items():
        if name in model.__dict__ or hasattr(type(model), name):
            continue

        def refuse(*args: Any, _name: str = name, _why: str = why, **kwargs: Any) -> None:
            raise UsageError("model.%s(): %s" % (_name, _why))
        model.__dict__[name] = refuse
        names.append(name)

    def no_deepcopy(memo: Any) -> None:
        first = next((n for n, _ in model.named_parameters()), "?")
        raise UsageError(_guard.refusal_of(_guard.copy_deepcopy, first))
    model.__dict__["__deepcopy__"] = no_deepcopy     # copy.deepcopy(model): an EMA copy
    return names + ["__deepcopy__"]


def _is_fsdp_method(name):
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return True
    return hasattr(FSDPModule, name)


# ---- the call ----

def _mesh_dict(mesh):
    if isinstance(mesh, Mapping):
        return dict(mesh)
    names = getattr(mesh, "mesh_dim_names", None)
    if names is not None and hasattr(mesh, "shape"):       # a torch DeviceMesh
        return dict(zip(names, (int(s) for s in mesh.shape)))
    if mesh is not None and hasattr(mesh, "shape"):
        raise UsageError("mesh: a DeviceMesh without mesh_dim_names; name its axes "
                         "(init_device_mesh(..., mesh_dim_names=(\"dp_outer\", \"dp_inner\"))) "
                         "or give a dict {\"dp_outer\": 2, \"dp_inner\": 2}")
    raise UsageError("mesh=%r: give {axis name: size}, outermost first, e.g. "
                     "{\"dp_outer\": 2, \"dp_inner\": 2}, or a named DeviceMesh" % (mesh,))


def _refuse_sharded(model):
    """A second call, or the root after a submodule (FSDP2's per-block habit)."""
    _policy.refuse_first([
        (isinstance(model, ShardedModel),
         "fully_shard of a ShardedModel: it is sharded already; one call shards the whole "
         "model"),
        (isinstance(model, (list, tuple)),
         "fully_shard([modules]): FSDP2's grouped call; mfsdp shards the root model once and "
         "its groups become units: mt.fully_shard(model, units=[\"blocks.0\", ...])"),
        (getattr(model, "_mfsdp_fully_shard", None) is not None,
         "fully_shard of a model that fully_shard already sharded: one call shards the whole "
         "model (its ShardedModel is the first call's result)")])
    inner = [n for n, m in model.named_modules() if n and
             getattr(m, "_mfsdp_fully_shard", None) is not None]
    if inner:
        raise UsageError(
            "fully_shard(model) after fully_shard(model.%s): FSDP2 is applied per block and "
            "then to the root, mfsdp in one call on the root, and FSDP2's per-block groups "
            "become its units: mt.fully_shard(model, units=%r) (by default the units are the "
            "root's children that own parameters, ModuleLists expanded). The earlier call "
            "sharded %s: close() its ShardedModel and start from a fresh model"
            % (inner[0], inner[:3] + (["..."] if len(inner) > 3 else []), ", ".join(inner)))
    if any(isinstance(p, GuardedParameter) for p in model.parameters()) or \
            any(hasattr(p, "_mfsdp_slot") for p in model.parameters()):
        raise UsageError("fully_shard of a model whose parameters are sharded already "
                         "(mt.shard or fully_shard on it or a submodule): shard a fresh model "
                         "once")


def _split_options(options, precision):
    spec_kw, rt_kw = {}, {}
    for k, v in options.items():
        if k in SPEC_OPTIONS:
            spec_kw[k] = v
        elif k in RUNTIME_OPTIONS:
            rt_kw[k] = v
        else:
            raise UsageError("fully_shard: unknown option %r (spec options: %s; runtime options: "
                             "%s)" % (k, ", ".join(SPEC_OPTIONS), ", ".join(RUNTIME_OPTIONS)))
    if precision is not None and ("dtype" in spec_kw or "grad_dtype" in spec_kw):
        raise UsageError("fully_shard: mp_policy= and dtype=/grad_dtype= both set the dtypes; "
                         "give one of them")
    return spec_kw, rt_kw


def fully_shard(model: torch.nn.Module, *, mesh: Any, layout: Layout = "hfsdp",
                microbatches: int = 1, mp_policy: Any = None,
                reshard_after_forward: Union[Reshard, int] = None, offload_policy: Any = None,
                backend: str = "mpi", units: Optional[List[str]] = None, cache: bool = True,
                expert_axes: Any = (), tensor_axes: Any = (), **options: Any) -> FullyShardedModel:
    """Shards `model` in one call, FSDP2's fully_shard with its knobs by their
    names: builds the spec (spec_from_module), compiles it through the
    schedule cache (compile_cached) and shards the model (mt.shard).

    mesh                    {axis: size}, outermost first, or a DeviceMesh with names
    layout, units, microbatches   as spec_from_module
    mp_policy               FSDP2's MixedPrecisionPolicy (or any object with its
                            fields): param_dtype -> weight dtype, reduce_dtype
                            -> grad dtype (None: the parameters' dtype),
                            output_dtype -> the root's floating outputs,
                            cast_forward_inputs -> the root's and each unit's
                            floating inputs cast to param_dtype
    reshard_after_forward   None (every unit but the last), True, False, or
                            {unit name or pattern: bool}; an int is refused
    offload_policy          FSDP2's CPUOffloadPolicy, passed to mt.shard (offload.py:
                            the master shards in pinned host memory on a GPU backend,
                            a no-op said once on local and mpi)
    backend                 "mpi", "local", "nccl"
    cache                   False: compile every time
    expert_axes             the Distinct axes (distinct=) the model dispatches tokens
                            over with its own all-to-all (expert parallelism, e.g.
                            ("ep",)): a tensor Distinct on them gets its gradient,
                            already summed over those axes' tokens by the
                            all-to-all, divided by their sizes (reduce avg), so it
                            is the mean over the whole batch as the dense ones';
                            not a TP axis (its ranks share their tokens)
    tensor_axes             the Distinct axes whose coordinates each compute their own
                            tensor's gradient from the same tokens (tensor
                            parallelism, e.g. ("tp",)): kept as computed. Every
                            Distinct axis is in exactly one of the two (else a
                            UsageError: undeclared, an expert gradient would be off
                            by the axis size)
    options                 spec options (reduce, overrides, prefetch, example,
                            ties, reshard_last, matrix_optimizer, whole_owners,
                            distinct ({parameter pattern: axis}), global_names
                            ({parameter pattern: global name}: naming.py), dtype,
                            grad_dtype without mp_policy) and runtime options
                            (timeout_ms, check, ...)
    """
    _refuse_sharded(model)
    _policy.check_reshard(reshard_after_forward)
    mesh = _mesh_dict(mesh)
    spec_kw, rt_kw = _split_options(options, mp_policy)
    if mp_policy is not None:
        precision = _policy.resolve(mp_policy, model)
    else:
        d = spec_kw.get("dtype", _policy.SPEC_DTYPES[_policy.model_dtype(model)])
        precision = _policy.Precision(d, spec_kw.get("grad_dtype", d), None, None)
    spec_kw["dtype"], spec_kw["grad_dtype"] = precision.weight, precision.grad
    if isinstance(reshard_after_forward, dict):
        names = [n for n, _ in model.named_modules() if n]
        for pat in reshard_after_forward:
            if not any(fnmatch.fnmatchcase(n, pat) for n in names):
                raise UsageError("reshard_after_forward names %r, which is no module of the "
                                 "model" % (pat,))
    try:
        spec = spec_from_module(model, mesh, layout=layout, units=units,
                                microbatches=microbatches,
                                reshard_after_forward=reshard_after_forward, **spec_kw)
    except ValueError as e:
        raise UsageError("fully_shard: %s" % e) from e
    sched, status = compile_cached(spec, name=type(model).__name__, cache=cache)
    spec_args = dict(spec_kw, mesh=mesh, layout=layout, units=units, microbatches=microbatches,
                     reshard_after_forward=reshard_after_forward)
    return FullyShardedModel(model, sched, spec, precision, backend, status,
                             offload_policy=offload_policy, spec_args=spec_args,
                             spec_cache=cache, expert_axes=expert_axes, tensor_axes=tensor_axes,
                             **rt_kw)


__all__ = ["fully_shard", "FullyShardedModel", "compile_cached", "cache_dir", "schedule_key",
           "compiler_identity", "cache_stats", "FSDP_METHODS"]
