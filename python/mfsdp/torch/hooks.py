"""
hooks: the per-unit hook machinery under a ShardedModel (shard.py), the
torch side of the hook contract of runtime/include/mfsdp/mfsdp.h: the
phases of a step, the microbatch bookkeeping and the windows in which each
unit's parameters are real.

UnitHooks installs, per unit module, a forward pre-hook (forward_pre;
step_begin before the first unit of the first microbatch), a forward hook
(forward_post, and a gradient hook on each output that calls backward_pre
when the gradient reaches the unit) and, per parameter, a
post-accumulate-grad hook that copies the gradient into grad_local (one
copy, cast when dtypes differ) and, once the unit's last parameter got its
gradient, calls backward_post (or, for a parameter that got none, zero-fills
its grad_local when an earlier unit's backward begins or the backward pass
ends: _complete, _backward_end) — and after the last unit of the last
microbatch, step_end, divides the gradient of tensors Distinct on the
expert axes by those axes' sizes (ShardedModel's expert_axes, _grad_scales),
then points each master parameter's .grad at the delivered gradient shard.

Outside its windows each parameter is swapped for a stand-in that refuses
any computation (guard.py). The loop is held to the schedule (docs/pytorch.md,
"The loop's contract"): each departure raises a UsageError naming the fix at
the call where it happens, and a global optimizer step pre-hook refuses an
optimizer over the model's own parameters or one stepping inside a step. With
grad disabled between steps a forward is an evaluation pass (the runtime's
eval hooks); ShardedModel.finish_step() ends a step after m < M microbatches.

Without optimizer.zero_grad() between steps the next delivered gradient is
added to the master shards' .grad, as torch accumulates.

Microbatches are counted here: the user calls forward and backward, nothing
else. Activation checkpointing (torch.utils.checkpoint, use_reentrant=False)
re-runs a unit's forward inside backward; that recompute is recognised (it
happens while the unit's backward window is open) and calls no hook.

This layer holds no runtime and no model of its own: ShardedModel sets the
attributes UnitHooks names (model, schedule, runtime, the bound units) before
_start_hooks(), and owns what users call (docs/design.md §5.1).
"""
from __future__ import annotations

import time
import warnings
import weakref
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .._lib import UsageError
from . import init as _init
from . import offload as _offload
from .tensors import tensors_in

if TYPE_CHECKING:
    from ..runtime import Runtime, View
    from ..schedule import Schedule
    from .guard import MainParameter, ParamSlot


class UnitHooks:
    """The hook layer of a ShardedModel: its step state (m, phase, fwd_done,
    bwd_open, pending, steps, hook_seconds), its windows and its hooks.
    ShardedModel (its subclass) binds the units, then calls _start_hooks()."""

    # set by ShardedModel before _start_hooks() (shard.py, units.py)
    model: torch.nn.Module
    schedule: Schedule
    runtime: Runtime
    M: int                 # the schedule's microbatches per step
    U: int                 # its units
    _units: List[Tuple[torch.nn.Module, List[Tuple[torch.nn.Parameter, View, torch.Tensor]]]]
    _main: List[Tuple[str, MainParameter, torch.Tensor, View]]
    _slots: List[List[ParamSlot]]
    _probing: bool         # a forward on meta finding the units' order (fully_shard.py)
    _init: Optional[_init.DeferredInit]
    _carry: List[Tuple[torch.nn.Parameter, torch.Tensor]]

    def _start_hooks(self) -> None:
        """The state of "between steps, none run yet", and the hooks on every
        unit module and parameter (their handles in self._handles)."""
        self._closed = False
        self._in_step = False      # between step_begin and step_end
        self._grad_unused = False  # a step delivered its gradient and no optimizer stepped since
        self._evaluating = None    # the unit whose evaluation forward is under way
        self._reset_step()
        self._touched = set()      # tensors that got a gradient in this step (_untouched_everywhere)
        self.steps = 0
        self._shut_all("between steps (no step has run yet)")
        self.hook_seconds = 0.0   # host time inside this object's hooks (C calls included)
        self._handles = []
        for u, (mod, entries) in enumerate(self._units):
            self._handles.append(mod.register_forward_pre_hook(self._timed(self._make_fwd_pre(u))))
            self._handles.append(mod.register_forward_hook(self._timed(self._make_fwd_post(u))))
            for k, (p, v, gl) in enumerate(entries):
                self._handles.append(p.register_post_accumulate_grad_hook(
                    self._timed(self._make_grad_ready(u, k))))

    def _refuse_if_closed(self, what):
        if self._closed:
            raise UsageError("%s after sm.close(): the runtime is gone; shard the model again "
                             "with mt.shard (take sm.full_state_dict() before closing to keep "
                             "the weights)" % what)

    def _check_replaced(self):
        """A parameter replaced after sharding (module.weight = nn.Parameter(...)
        in an init) would be trained by nobody: refused before the first step."""
        for slots in self._slots:
            for s in slots:
                for mod, attr in s.holders:
                    p = mod._parameters.get(attr)
                    if p is not s.stand_in and p is not s.real:
                        raise UsageError(_init.replaced(s.name))

    # ---- state ----
    def _reset_step(self):
        self.m = 0
        self._reset_microbatch()
        self.phase = "idle"

    def _reset_microbatch(self):
        self.fwd_done = [False] * self.U
        self.bwd_open = [False] * self.U
        self.pending = [len(e) for _, e in self._units]
        self.got = [[False] * len(e) for _, e in self._units]
        self._end_queued = False   # _backward_end queued on this microbatch's backward
        self.recompute = [0] * self.U
        self.extra = [0] * self.U
        self.phase = "idle"

    def _unit_name(self, u):
        return self.schedule.units[u]

    # ---- windows: which parameters the modules see (guard.py) ----
    def _open(self, u):
        for s in self._slots[u]:
            s.open()

    def _shut(self, u, state):
        for s in self._slots[u]:
            if not s.whole_step:
                s.shut(state)

    def _shut_all(self, state):
        for slots in self._slots:
            for s in slots:
                s.shut(state)

    def _shut_whole_step(self, state):
        for slots in self._slots:
            for s in slots:
                if s.whole_step:
                    s.shut(state)

    # ---- steps ----
    def _begin_step(self, u):
        if self._init is not None:
            self._init.end(self.model)
        if self.steps == 0:
            self._check_replaced()
        if self._grad_unused and any(mp.grad is not None for _, mp, _, _ in self._main):
            raise UsageError(
                "forward of unit %r would begin step %d, but step %d's delivered gradient was "
                "never used: a step is the schedule's %d microbatch%s (this would be microbatch "
                "%d); to accumulate more microbatches per optimizer step pass microbatches=N to "
                "mt.fully_shard (or spec_from_module), else run optimizer.step() over "
                "sm.main_parameters() and optimizer.zero_grad() after each step; end a step "
                "early with sm.finish_step(), or drop its gradient with zero_grad()"
                % (self._unit_name(u), self.steps + 1, self.steps, self.M,
                   "" if self.M == 1 else "es", self.M + 1))
        # no zero_grad() since the last step: torch adds the next gradient to .grad
        self._carry = [(mp, mp.grad.detach().clone()) for _, mp, _, _ in self._main
                       if mp.grad is not None]
        self._shut_whole_step("between steps")
        for slots in self._slots:
            for s in slots:
                s.grad_delivered(False)
        self.runtime.step_begin()
        self._in_step = True

    def _end_step(self):
        self.runtime.step_end()
        with torch.no_grad():      # expert tensors: their all-to-all summed over expert_axes
            for g, factor in getattr(self, "_grad_scales", ()):
                g.mul_(factor)
        self._in_step = False
        self._grad_unused = True
        self.steps += 1
        self._reset_step()
        self._shut_all("between steps, after step %d" % self.steps)
        for slots in self._slots:
            for s in slots:
                s.grad_delivered(True)     # clip_grad_norm_(model.parameters()) refused
        untouched = self._untouched_everywhere()
        for name, mp, g, _ in self._main:
            mp.grad = None if name in untouched else g if g.dtype == mp.dtype else g.to(mp.dtype)
        if self._carry:          # no zero_grad() since the last step: torch accumulates
            grads = {id(mp): g for _, mp, g, _ in self._main}
            with torch.no_grad():
                for mp, old in self._carry:
                    if mp.grad is None:
                        mp.grad = old.clone()
                    else:
                        mp.grad.add_(old)
                    if mp.grad is not grads[id(mp)]:
                        grads[id(mp)].copy_(mp.grad)    # clip_grad_norm_ reads the runtime's
            self._carry = []

    def _untouched_everywhere(self):
        """Names of the Distinct-model tensors no rank holding them got a
        gradient for in this step (every microbatch zero-filled by _complete:
        an expert no token of its expert-data-parallel group reached). Their
        master parameters get .grad None, so the optimizer skips them as it
        skips such an expert of the single-process model (AdamW would decay a
        zero gradient's weight and moments). Decided with one MAX all-reduce
        of a flag per tensor over each mesh axis the tensor is not Distinct on
        (torch.distributed, as the model's own all-to-all uses), so every
        rank holding the tensor decides alike. Models without Distinct tensors
        (and runs without torch.distributed) keep the zero gradient."""
        touched = self._touched
        self._touched = set()
        distinct = getattr(self, "distinct", None)
        if not distinct or self.runtime.world_size == 1 or not _dist_ready(self):
            return set()
        mesh = self.device_mesh()
        axes = list(self.schedule.mesh)
        groups = {}
        for v in self.runtime.views:     # every tensor, held here or not: the same on every rank
            groups.setdefault(tuple(distinct.get(v.name, ())), []).append(v.name)
        untouched = set()
        for own, names in sorted(groups.items()):
            flags = torch.tensor([name in touched for name in names], dtype=torch.int32)
            for a in axes:
                if a not in own and self.schedule.mesh[a] > 1:
                    torch.distributed.all_reduce(flags, torch.distributed.ReduceOp.MAX,
                                                 group=mesh[a].get_group())
            untouched.update(n for n, f in zip(names, flags.tolist()) if not f)
        return untouched

    def _optimizer_step(self):
        """An optimizer over this model's main parameters is about to step."""
        self._refuse_if_closed("optimizer.step()")
        if self._in_step:
            raise UsageError(
                "optimizer.step() inside a step: %d of the schedule's %d microbatches have run "
                "and the gradient is delivered after the last; run the remaining microbatches, or "
                "end the step early with sm.finish_step() (each microbatch's loss scaled by 1/m)"
                % (self.m, self.M))
        self._grad_unused = False

    # ---- hooks ----
    def _timed(self, fn):
        def hook(*args):
            if self._probing:          # the forward on meta of fully_shard.py's probe
                return None
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.hook_seconds += time.perf_counter() - t0
        return _not_traced(hook)

    def _make_fwd_pre(self, u):
        def hook(module, args):
            if self.bwd_open[u] or (self.phase == "bwd" and torch._C._current_graph_task_id() != -1
                                    and self.fwd_done[u]):
                self.recompute[u] += 1     # activation-checkpoint recompute: no hook
                self._open(u)
                return None
            if not torch.is_grad_enabled():
                return self._eval_forward_pre(u)
            if self.fwd_done[u]:
                return self._forward_again(u)
            if self.phase == "bwd":
                raise UsageError(
                    "forward of unit %r while the backward of microbatch %d is unfinished: run "
                    "loss.backward() before the next forward" % (self._unit_name(u), self.m))
            if not self._in_step:
                if not module.training and not getattr(self, "_warned_eval", False):
                    self._warned_eval = True
                    warnings.warn(
                        "mfsdp: a forward of a model in eval mode with grad enabled begins a "
                        "training step (microbatch 0, which needs its loss.backward()); an "
                        "evaluation forward needs torch.no_grad() or torch.inference_mode()",
                        UserWarning, stacklevel=_offload._caller_level())
                self._begin_step(u)
            self._enter(u, "fwd")
            return None
        return hook

    def _forward_again(self, u):
        """Unit u's forward begins again in this microbatch: a module called
        twice whose weights stay gathered for the whole step (its tensors in
        the `tied` layout) runs without hooks; otherwise a UsageError naming
        why: a whole forward with no backward after it (an evaluation without
        torch.no_grad()), or a module called twice."""
        if self.phase == "fwd" and self._slots[u] and all(s.whole_step for s in self._slots[u]):
            self.extra[u] += 1
            return None
        if all(self.fwd_done) and self.phase == "fwd":
            raise UsageError(
                "forward of unit %r again before the backward of microbatch %d: the last forward "
                "ran with grad enabled, so it was microbatch %d of a training step, and no "
                "loss.backward() followed. An evaluation forward needs torch.no_grad() (or "
                "torch.inference_mode()); model.eval() alone does not turn off autograd"
                % (self._unit_name(u), self.m, self.m))
        names = [s.name for s in self._slots[u]]
        raise UsageError(
            "unit %r ran twice in the forward of microbatch %d: its weights are gathered for one "
            "call and freed after it. Keep them gathered for the whole step by declaring its "
            "parameters as ties (mt.fully_shard(..., ties=%r), or spec_from_module's ties=: "
            "the `tied` layout), make each call its own module, or put the calls inside one "
            "unit" % (self._unit_name(u), self.m, names[:4] + (["..."] if len(names) > 4 else [])))

    def _enter(self, u, phase):
        """Unit u's forward ("fwd") or backward ("bwd") of this microbatch
        begins: the runtime's pre hook, the mark that it ran, its weights open."""
        self.phase = phase
        if phase == "fwd":
            nxt = next((w for w in range(self.U) if not self.fwd_done[w]), u)
            if nxt != u:
                self._out_of_order(u, nxt)
            self.runtime.forward_pre(u, self.m)
            self.fwd_done[u] = True
        else:
            self.runtime.backward_pre(u, self.m)
            self.bwd_open[u] = True
        self._open(u)

    def _out_of_order(self, u, nxt):
        why = getattr(self, "order_note", None) or (
            "the schedule was given to mt.shard, which keeps its order")
        raise UsageError(
            "unit %r began its forward in microbatch %d while the schedule expects unit %r "
            "next: the model's forward runs its units in another order than the schedule's "
            "(%s). Give the units in the forward's order: mt.fully_shard(..., units=[...]) or "
            "spec_from_module(..., units=[...]) (%s)" % (
                self._unit_name(u), self.m, self._unit_name(nxt),
                ", ".join(self.schedule.units[:6]) + (", ..." if self.U > 6 else ""), why))

    def _eval_forward_pre(self, u):
        if self._in_step:
            raise UsageError(
                "forward of unit %r under torch.no_grad() or inference_mode inside a step "
                "(%d of the schedule's %d microbatches have run): an evaluation forward runs "
                "between steps, so finish the step first (its remaining microbatches, or "
                "sm.finish_step()); torch.utils.checkpoint with use_reentrant=True runs its "
                "forward so too: use use_reentrant=False" % (self._unit_name(u), self.m, self.M))
        if self._init is not None:
            self._init.end(self.model)
        if u == 0:
            self._shut_whole_step("between evaluation passes")
        self.runtime.eval_forward_pre(u)
        self._evaluating = u
        self._open(u)
        return None

    def _make_fwd_post(self, u):
        def hook(module, args, output):
            if self.recompute[u]:
                self.recompute[u] -= 1
                if not self.bwd_open[u]:
                    self._shut(u, "after its recomputed forward")
                return None
            if self.extra[u]:          # a later call of a unit kept gathered (_forward_again)
                self.extra[u] -= 1
                return None
            if self._evaluating == u:
                self._evaluating = None
                self.runtime.eval_forward_post(u)
                self._shut(u, "after its evaluation forward")
                return None
            self.runtime.forward_post(u, self.m)
            self._shut(u, "after its forward in microbatch %d; it reopens in its backward"
                       % self.m)
            outs = [t for t in tensors_in(output) if t.requires_grad]
            if not outs:
                raise UsageError(
                    "unit %r returned no tensor that requires grad, so its backward cannot be "
                    "hooked (torch.utils.checkpoint needs use_reentrant=False)" % self._unit_name(u))
            for t in outs:
                t.register_hook(self._timed(self._make_bwd_pre(u)))
            return None
        return hook

    def _make_bwd_pre(self, u):
        def hook(grad):
            self._refuse_if_closed("the backward of a graph built before close()")
            if self.bwd_open[u] or self.pending[u] == 0:
                return None
            if not self.fwd_done[u]:
                raise UsageError(
                    "backward of unit %r with no forward of it in microbatch %d: a second "
                    "loss.backward() over a graph whose backward already ran (retain_graph=True) "
                    "or over an earlier microbatch's graph; each microbatch is one forward, then "
                    "one backward" % (self._unit_name(u), self.m))
            for w in range(self.U - 1, u, -1):
                if self.pending[w] and self.bwd_open[w]:
                    self._complete(w)   # its backward is over: what got no gradient is zero
            late = [w for w in range(u + 1, self.U) if self.pending[w]]
            if late:
                raise UsageError(
                    "unit %r's backward began while unit %r's never did: the loss does not "
                    "depend on unit %r's output in microbatch %d (each unit's forward output "
                    "must reach the loss)" % (self._unit_name(u), self._unit_name(late[0]),
                                              self._unit_name(late[0]), self.m))
            if not self._end_queued:
                self._end_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
            self._enter(u, "bwd")
            return None
        return hook

    def _make_grad_ready(self, u, k):
        def hook(p):
            self._refuse_if_closed("the backward of a graph built before close()")
            if not self.bwd_open[u]:
                raise UsageError(
                    "parameter %r received a gradient outside the backward of its unit %r "
                    "(used outside the unit? tied weights must belong to the first unit that "
                    "uses them)" % (self._units[u][1][k][1].name, self._unit_name(u)))
            _, v, gl = self._units[u][1][k]
            gl.copy_(p.grad.view(gl.shape))
            p.grad = None
            self.got[u][k] = True
            self._touched.add(v.name)
            self.pending[u] -= 1
            if self.pending[u] == 0:
                self._post(u)
        return hook

    def _post(self, u):
        """Unit u's backward is complete in this microbatch: backward_post."""
        self.bwd_open[u] = False
        self.runtime.backward_post(u, self.m)
        self._shut(u, "after its backward in microbatch %d" % self.m)
        if u == 0:
            self._microbatch_done()

    def _complete(self, u):
        """Unit u's backward is over with some parameters given no gradient (an
        expert no token was routed to, a branch this input did not take):
        theirs is zero in this microbatch, as DDP's find_unused_parameters
        and a zero-token grouped GEMM give, so every rank's collectives stay
        the schedule's."""
        for k, (_, _, gl) in enumerate(self._units[u][1]):
            if not self.got[u][k]:
                gl.zero_()
                self.got[u][k] = True
        self.pending[u] = 0
        self._post(u)

    def _backward_end(self):
        """Queued on the engine by the first backward_pre of a microbatch: at the
        end of that backward, the units still open got their gradients, but
        for parameters that got none (zero)."""
        for w in range(self.U - 1, -1, -1):
            if self.pending[w] and self.bwd_open[w]:
                self._complete(w)

    def _microbatch_done(self):
        self.m += 1
        self._reset_microbatch()
        if self.m == self.M:
            self._end_step()


def _dist_ready(sm) -> bool:
    """torch.distributed is up with the runtime's world, on a process backend."""
    dist = torch.distributed
    return (sm._how[0] not in ("local", "cuda_local") and dist.is_available()
            and dist.is_initialized() and dist.get_world_size() == sm.runtime.world_size)


def _not_traced(hook):
    """A hook that torch.compile runs as Python (a graph break), not traced:
    torch.compile(model) of a sharded model compiles the code between the
    unit hooks, which gather and free the weights as in eager mode."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(hook) if disable is not None else hook


_HOOK = []     # the one global optimizer step pre-hook, once installed


def watch_optimizers(sm: UnitHooks) -> None:
    """Marks sm's parameters for the global optimizer step pre-hook
    (torch.optim.optimizer.register_optimizer_step_pre_hook, installed
    once): the real parameters carry their ParamSlot, the main parameters
    their ShardedModel (a weak reference)."""
    owner = weakref.ref(sm)
    for _, mp, _, _ in sm._main:
        mp._mfsdp_owner = owner
    for slots in sm._slots:
        for s in slots:
            s.real._mfsdp_slot = s
    if not _HOOK:
        _HOOK.append(register_optimizer_step_pre_hook(_check_optimizer))


# Optimizers that update each matrix as a whole (Newton-Schulz): by class
# name, torch.optim.Muon's and the usual re-implementations'.
MATRIX_OPTIMIZERS = ("Muon",)


def _refuse_split_matrix(optimizer, p):
    """A matrix optimizer's (MATRIX_OPTIMIZERS) step over main parameter p
    that is not its whole tensor (a Flat 1-D shard of a matrix, or a Whole
    matrix this rank does not own): UsageError naming the tensor and the fix,
    before any update."""
    full = getattr(p, "full_shape", None)
    if full is None or tuple(p.shape) == tuple(full):
        return
    raise UsageError(
        "%s.step() over main parameter %r, a %s shard of its %s tensor: %s updates each "
        "matrix whole, so it needs the tensor's main_weight Whole on this rank; give it "
        "sm.whole_parameters() (the Whole tensors this rank owns: with "
        "matrix_optimizer=\"whole\" the hidden matrices) and the rest to AdamW"
        % (type(optimizer).__name__, getattr(p, "full_name", "?"),
           "x".join(str(n) for n in p.shape) or "0-element", list(full),
           type(optimizer).__name__))


def _check_optimizer(optimizer, args, kwargs):
    """Refuses a step over a sharded model's own parameters (its stand-ins or
    the real ones: they never hold a gradient, so nothing would train), a
    matrix optimizer's step over a split matrix (_refuse_split_matrix), and
    lets each ShardedModel whose main parameters it steps check its state."""
    owners = {}
    matrix = type(optimizer).__name__ in MATRIX_OPTIMIZERS
    for g in optimizer.param_groups:
        for p in g["params"]:
            slot = getattr(p, "_mfsdp_slot", None)
            if slot is not None:
                raise UsageError(
                    "%s.step() over parameter %r of a sharded model (model.parameters()): the "
                    "model's own parameters are views of the runtime's unsharded weights and "
                    "never hold a gradient, so nothing would train; give the optimizer "
                    "sm.main_parameters() (or sm.param_groups(weight_decay=...))"
                    % (type(optimizer).__name__, slot.name))
            owner = getattr(p, "_mfsdp_owner", None)
            if owner is not None:
                if matrix:
                    _refuse_split_matrix(optimizer, p)
                owners[id(owner)] = owner
    for owner in owners.values():
        sm = owner()
        if sm is None or sm._closed:
            raise UsageError("%s.step() over the main parameters of a closed ShardedModel: "
                             "their memory is gone; create the optimizer over the main "
                             "parameters of a new mt.shard" % type(optimizer).__name__)
        sm._optimizer_step()
    return None
