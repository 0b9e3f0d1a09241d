"""
shard: mfsdp.torch.shard(model, schedule, backend), the torch side of the
hook contract of runtime/include/mfsdp/mfsdp.h.

What shard() does, in order:
  1. checks the schedule against the model: every unit names a submodule,
     every tensor a parameter of it with the same shape, every parameter is
     covered; all mismatches are listed in one ModelMismatchError;
  2. creates the runtime and copies each parameter's current value into this
     rank's main_weight shard (so training starts from torch's init), after
     comparing every rank's values (init.agree: a checksum per tensor, one
     all-reduce); a model built on meta gets its values from the init that
     follows sharding, replayed unit by unit (init.DeferredInit);
  3. makes each parameter's .data a view of the runtime's unsharded weight
     (valid inside its unit's windows, as FSDP2's unsharded parameters are);
  4. installs, per unit module, a forward pre-hook (forward_pre; step_begin
     before the first unit of the first microbatch), a forward hook
     (forward_post, and a gradient hook on each output that calls
     backward_pre when the gradient reaches the unit) and, per parameter, a
     post-accumulate-grad hook that copies the gradient into grad_local (one
     copy, cast when dtypes differ) and, once the unit's last parameter got
     its gradient, calls backward_post — and after the last unit of the last
     microbatch, step_end, then points each master parameter's .grad at the
     delivered gradient shard.

Outside its windows each parameter is swapped for a stand-in that refuses
any computation (guard.py). The loop is held to the schedule (docs/pytorch.md,
"The loop's contract"): each departure raises a UsageError naming the fix at
the call where it happens, and a global optimizer step pre-hook refuses an
optimizer over the model's own parameters or one stepping inside a step. With
grad disabled between steps a forward is an evaluation pass (the runtime's
eval hooks); finish_step() ends a step after m < M microbatches.

Without optimizer.zero_grad() between steps the next delivered gradient is
added to the master shards' .grad, as torch accumulates. The master shards
(guard.MainParameter) answer dim() with their whole tensor's. Module
conversions (to_empty, .to(dtype)) go through init.apply_guard.

Microbatches are counted here: the user calls forward and backward, nothing
else. Activation checkpointing (torch.utils.checkpoint, use_reentrant=False)
re-runs a unit's forward inside backward; that recompute is recognised (it
happens while the unit's backward window is open) and calls no hook.
"""
from __future__ import annotations

import re
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import _lib
from .._lib import MfsdpError, UsageError
from ..runtime import Runtime
from . import init as _init
from . import offload as _offload
from .guard import GuardedParameter, MainParameter, ParamSlot, holders_of
from .tensors import DTYPE_NAMES, tensor

if TYPE_CHECKING:
    from ..checkpoint import Rules
    from .checkpoint import Optimizers
    from ..runtime import Stats
    from ..schedule import Schedule


class ModelMismatchError(UsageError):
    """The schedule does not describe the model; `problems` lists every mismatch."""

    def __init__(self, problems: List[str]) -> None:
        self.problems = list(problems)
        super().__init__("the schedule does not match the model (%d problem%s):\n  %s" % (
            len(self.problems), "" if len(self.problems) == 1 else "s",
            "\n  ".join(self.problems)))


def _match(model, sched):
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


def _tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors_in(o)


class ShardedModel:
    """The model driven by an mfsdp runtime (returned by shard())."""

    def __init__(self, model: torch.nn.Module, schedule: Schedule, backend: str = "mpi",
                 offload_policy: Any = None, **runtime_kw: Any) -> None:
        self._probing = False      # a forward on meta finding the units' order (fully_shard.py)
        self._build(model, schedule, backend, offload_policy, runtime_kw, True)

    def _build(self, model, schedule, backend, offload_policy, runtime_kw, check):
        """Everything of __init__ (the module comment's steps 1-4); `check`:
        compare the ranks' initial values (False when a FullyShardedModel
        rebuilds itself for the forward's unit order: its masters are copied)."""
        self.model = model
        self.schedule = schedule
        self._how = (backend, offload_policy, dict(runtime_kw))
        units = _match(model, schedule)
        meta = _built_on_meta(model)
        offload = _offload.requested(offload_policy, backend)   # CPU offload (offload.py)
        if backend in ("nccl", "cuda_local"):
            runtime_kw = _nccl_args(runtime_kw, backend, schedule.world_size)
        _refuse_torchrun(backend, schedule.world_size)
        self.runtime = rt = Runtime(schedule, backend=backend, offload=offload, **runtime_kw)
        self.offload = _offload.report(rt, offload)   # active, host_bytes, reason
        self.M = schedule.microbatches
        self.U = len(schedule.units)
        self._units = []       # per unit: (module, [(param, view, grad_local tensor)])
        self._main = []        # (name, master Parameter, grad tensor, view)
        self._slots = []       # per unit: [ParamSlot] (guard.py)
        holders = holders_of(model)
        whole_step = _replicated_weights(schedule, holders, units)
        hashes, dtypes = {}, {}
        with torch.no_grad():
            for u, mod, params in units:
                entries, slots = [], []
                for vi, p in params:
                    v = rt.views[vi]
                    if v.shard_count:
                        whole = schedule.tensors[vi].whole_main_weight
                        main = MainParameter(_master(rt, v, "main_weight", whole))
                        if not meta:
                            flat = p.detach().reshape(-1)[v.shard_offset:
                                                          v.shard_offset + v.shard_count]
                            main.data.copy_(flat.view(main.shape).to(device=main.device,
                                                                     dtype=main.dtype))
                        main.full_name, main.full_shape = v.name, torch.Size(v.shape)
                        self._main.append((v.name, main, _master(rt, v, "grad", whole), v))
                    dtypes[v.name] = p.dtype
                    if meta:              # the init after sharding fills the shards (init.py)
                        p = _materialised(p, tensor(rt, v, "weight"), holders)
                    else:
                        hashes[v.name] = _init.tensor_hash(p)
                        p.data = tensor(rt, v, "weight")
                    entries.append((p, v, tensor(rt, v, "grad_local")))
                    slots.append(ParamSlot(v.name, schedule.units[u], p, holders[id(p)],
                                           v.name in whole_step))
                self._units.append((mod, entries))
                self._slots.append(slots)
        self._closed = False
        self._in_step = False      # between step_begin and step_end
        self._grad_unused = False  # a step delivered its gradient and no optimizer stepped since
        self._evaluating = None    # the unit whose evaluation forward is under way
        self._reset_step()
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
        self._handles += _refuse_module_state_dicts(model)
        _watch_optimizers(self)
        self._applies = _init.guard_applies(self, model)   # to_empty, .to(dtype): init.py
        model.__dict__["zero_grad"] = self._model_zero_grad(model)
        self._carry = []       # (master, .grad kept from the last step: no zero_grad() since)
        self._init = _init.DeferredInit(self, dtypes) if meta else None
        self.init_peak_bytes = getattr(self, "init_peak_bytes", 0)   # most bytes whole at once in it
        if not meta and check:
            hashes.update(_init.buffer_hashes(model))
            try:
                _init.agree(self, hashes, "at sharding")
            except UsageError:
                self.close()
                raise

    # ---- public ----
    def main_parameters(self) -> List[torch.nn.Parameter]:
        """This rank's fp32 master shards as Parameters (for the optimizer);
        their .grad is the delivered gradient shard after each step's last
        backward. Each carries its whole tensor's name and shape (`full_name`,
        `full_shape`: a shard is 1-D, its tensor need not be). A tensor whose
        main_weight is Whole is here only on its owner ranks, as a Parameter
        of the tensor's own shape (.grad too): torch.optim.Muon takes the 2-D
        ones as they are; the other ranks have no entry for it."""
        return [mp for _, mp, _, _ in self._main]

    def named_main_parameters(self) -> List[Tuple[str, torch.nn.Parameter]]:
        """(tensor name, master shard) pairs, e.g. to give norms no weight decay."""
        return [(n, mp) for n, mp, _, _ in self._main]

    def param_groups(self, weight_decay: float,
                     no_decay: Optional[Callable[[str, Tuple[int, ...]], bool]] = None,
                     **options: Any) -> List[Dict[str, Any]]:
        """The optimizer's two parameter groups over main_parameters(): those
        that decay (weight_decay) and those that do not (0.0), chosen by the
        whole tensor: no_decay(full name, full shape) is true for the second
        group (default: fewer than 2 dimensions, nanoGPT's rule: biases and
        norms). Both groups are always present (a rank may hold no shard of
        some tensors). `options` go into both groups (lr=, betas=, ...)."""
        if no_decay is None:
            no_decay = _fewer_than_two_dims
        decay, keep = [], []
        for name, mp, _, _ in self._main:
            (keep if no_decay(name, mp.full_shape) else decay).append(mp)
        return [dict(options, params=decay, weight_decay=weight_decay),
                dict(options, params=keep, weight_decay=0.0)]

    def shards(self) -> List[Tuple[str, int, torch.nn.Parameter]]:
        """[(tensor name, shard_offset, master shard)] of this rank (for
        checkpoints); a Whole main weight's shard is the full-shape tensor at
        offset 0 (flatten it: .reshape(-1))."""
        return [(n, v.shard_offset, mp) for n, mp, _, v in self._main]

    def stats(self) -> Stats:
        return self.runtime.stats()

    def finish_step(self) -> None:
        """Ends the step after the m < M microbatches run so far (a short
        step: the end of an epoch or a data shard): mfsdp_step_end, and the
        delivered gradient, the sum over those m microbatches averaged over
        ranks, is in the master shards' .grad; scale each microbatch's loss by
        1/m for their mean. Call after a microbatch's backward."""
        self._refuse_if_closed("finish_step")
        if self.phase != "idle" or any(self.fwd_done):
            raise UsageError("finish_step() during microbatch %d (its forward or backward is "
                             "under way): call it after that microbatch's loss.backward()"
                             % self.m)
        if not self._in_step or self.m == 0:
            raise UsageError("finish_step() with no microbatch run in this step: call it after "
                             "the backward of the step's last microbatch (1 to %d of them)"
                             % self.M)
        self._end_step()

    # ---- whole-model helpers (collective: every rank calls them, in the same order) ----
    def _between_steps(self, what):
        self._refuse_if_closed(what)
        if self._init is not None:
            self._init.flush_all()       # a helper reads the master shards
        if self._in_step or self.phase != "idle" or any(self.fwd_done):
            raise UsageError("%s inside a step (%d of the schedule's %d microbatches have run): "
                             "call it after the step's last backward (or sm.finish_step()) and "
                             "before the next step's forward" % (what, self.m, self.M))

    def _refuse_if_closed(self, what):
        if self._closed:
            raise UsageError("%s after sm.close(): the runtime is gone; shard the model again "
                             "with mt.shard (take sm.full_state_dict() before closing to keep "
                             "the weights)" % what)
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over the whole model: the global L2
        norm of the delivered gradient (every rank's shards, a replicated shard
        counted once), and when it exceeds max_norm every gradient is scaled by
        max_norm / (norm + 1e-6) (mfsdp_grad_clip). Every rank gets the same
        norm and factor. Call after the step's last backward, before
        optimizer.step(). Returns the norm before clipping (a 0-d float64 tensor)."""
        if float(norm_type) != 2.0:
            raise UsageError("clip_grad_norm_: only the L2 norm (norm_type=2.0) is supported, "
                             "not %r" % (norm_type,))
        self._between_steps("clip_grad_norm_")
        norm = self.runtime.clip_grad_norm(max_norm)
        with torch.no_grad():
            for _, mp, g, _ in self._main:
                if g.dtype != mp.dtype and mp.grad is not None:
                    mp.grad.copy_(g)       # .grad is a converted copy: refresh it
        return torch.tensor(norm, dtype=torch.float64)

    def grad_norm(self) -> float:
        """The global L2 norm of the delivered gradient (as clip_grad_norm_
        computes it, without clipping), a float, the same on every rank."""
        self._between_steps("grad_norm")
        return self.runtime.grad_norm()

    def full_state_dict(self, rank0_only: bool = True,
                        dtype: torch.dtype = torch.float32) -> Dict[str, torch.Tensor]:
        """{parameter name: whole master weight} (CPU tensors of the parameter's
        shape, in `dtype`) gathered from every rank's shards
        (mfsdp_main_weight_gather): on rank 0 only (the others get {}) or, with
        rank0_only=False, on every rank. Parameters only (buffers are the same on
        every rank: take them from the model). Between steps; collective."""
        self._between_steps("full_state_dict")
        name = DTYPE_NAMES.get(dtype)
        if name is None:
            raise UsageError("full_state_dict: dtype %r (float32, bfloat16 or float16)" % (dtype,))
        root = _lib.ALL_RANKS if not rank0_only else 0
        out = {}
        for v in self.runtime.views:
            t = torch.empty(v.shape, dtype=dtype) if root < 0 or self.runtime.rank == 0 else None
            if self.runtime.gather(v.index, root=root, dtype=name, out=t) is not None:
                out[v.name] = t
        return out

    def load_full_state_dict(self, state_dict: Mapping[str, torch.Tensor],
                             strict: bool = True) -> None:
        """Sets the master weights from whole tensors (a full_state_dict(), or
        the model's own state_dict() of a single-process run): each rank copies
        its shard (mfsdp_main_weight_scatter, no communication; every rank passes
        the same values). strict: every parameter must be present and no other
        key (the model's buffers and the other names of tied weights are
        ignored). The optimizer state is not touched. Between steps."""
        self._between_steps("load_full_state_dict")
        params = {v.name: v for v in self.runtime.views}
        known = {n for n, _ in self.model.named_buffers()}    # and tied weights' other names
        known |= {n for n, _ in self.model.named_parameters(remove_duplicate=False)}
        problems = []
        for n, v in params.items():
            t = state_dict.get(n)
            if t is None:
                if strict:
                    problems.append("missing parameter %r" % n)
            elif tuple(t.shape) != v.shape:
                problems.append("%r: shape %s, the parameter has %s" % (
                    n, list(t.shape), list(v.shape)))
        if strict:
            problems += ["unexpected key %r" % k for k in state_dict
                         if k not in params and k not in known]
        if problems:
            raise UsageError("load_full_state_dict: %s" % "; ".join(problems))
        for n, v in params.items():
            if n in state_dict:
                self.runtime.scatter(v.index, state_dict[n])
        self._loaded()

    # ---- checkpoints (python/mfsdp/torch/checkpoint.py, docs/checkpoint.md) ----
    def save_checkpoint(self, path: str, optimizer: Optional[Optimizers] = None,
                        step: Optional[int] = None, user_blob: Optional[bytes] = None) -> None:
        """Saves a sharded checkpoint in directory `path` (must not exist): the
        master weights, the state of `optimizer` (over main_parameters(); its
        tensors shaped like the parameters as sharded states, its shared scalars
        such as Adam's step and the param groups' numeric hyper-parameters in
        this rank's blob), `step` (default: self.steps) and this rank's
        `user_blob` (bytes: data-loader position, RNG state). `optimizer` may
        be a list or tuple of optimizers, each over its own main parameters
        (Muon on the matrices + AdamW on the rest): their states are saved
        together, a parameter in two of them refused. Every rank writes
        only its own unique bytes; committed by rename. Between steps;
        collective."""
        from . import checkpoint
        checkpoint.save(self, path, optimizer, step, user_blob)

    def load_checkpoint(self, path: str, optimizer: Optional[Optimizers] = None,
                        user_blob_rank: Optional[int] = None,
                        verify_files: bool = False) -> Tuple[int, Optional[bytes]]:
        """Loads a checkpoint saved by save_checkpoint under any mesh or layout
        of the same model (resharding is an ordinary load): the master weights
        and, with `optimizer` (a new optimizer of the same class over
        main_parameters(); or the same list of optimizers that saved, the
        same classes in the same order, each parameter in the optimizer that
        had it: any difference is refused before anything is read), its
        state. Returns (step, user blob of rank
        user_blob_rank, default this rank's number; None when that rank saved
        none) and sets self.steps to the step. Between steps; collective."""
        from . import checkpoint
        out = checkpoint.load(self, path, optimizer, user_blob_rank, verify_files)
        self._loaded()
        return out

    def save_dcp(self, path: str, optimizer: Optional[Optimizers] = None, overwrite: bool = False) -> None:
        """Saves the model (and `optimizer`, over main_parameters()) as a PyTorch
        Distributed Checkpoint in directory `path` (must not exist unless
        overwrite=True, which replaces a DCP checkpoint there atomically), laid out as
        FSDP2's {"model": get_model_state_dict, "optim": get_optimizer_state_dict}
        so that an FSDP2 trainer loads it with dcp.load (several optimizers:
        torch's get_optimizer_state_dict(model, (a, b)) layout, their param
        groups concatenated in order); committed by rename.
        Needs torch.distributed initialised on more than one rank. Between steps;
        collective (python/mfsdp/torch/dcp.py)."""
        from . import dcp
        dcp.save_dcp(self, path, optimizer, overwrite=overwrite)

    def load_dcp(self, path: str, optimizer: Optional[Optimizers] = None,
                 batch_bytes: int = 256 << 20) -> None:
        """Loads a PyTorch Distributed Checkpoint saved the FSDP2 way (or by
        save_dcp) under any mesh or layout: the master weights and, with
        `optimizer` (one, or the list that saved, in the same order), its
        per-parameter state and param groups' options. Each rank
        reads the whole tensors it holds a shard of, at most `batch_bytes` at a
        time; another model's checkpoint is refused listing every problem before
        anything is written. Between steps (python/mfsdp/torch/dcp.py)."""
        from . import dcp
        dcp.load_dcp(self, path, optimizer, batch_bytes)
        self._loaded()

    def import_hf(self, path: str, maps: Optional[Rules] = None,
                  ties: Optional[Rules] = None) -> None:
        """Sets the master weights from a Hugging Face safetensors checkpoint
        (model.safetensors, its .index.json or a directory with either), each
        rank reading only its shards, converted to fp32 (Runtime.import_hf).
        maps: {HF prefix: parameter prefix}; ties: {name: source}. Between
        steps; collective."""
        self._between_steps("import_hf")
        self.runtime.import_hf(path, maps, ties)
        self._loaded()

    def _loaded(self):
        """The master weights were set by a load (a model built on meta needs no init)."""
        if self._init is not None:
            self._init.loaded()

    def export_hf(self, path: str, dtype: Optional[Union[str, torch.dtype]] = None,
                  maps: Optional[Rules] = None, ties: Optional[Rules] = None,
                  max_file_bytes: int = 0) -> None:
        """Writes the full master weights as a Hugging Face checkpoint in
        directory `path`, every rank writing its own ranges, no gathering
        (Runtime.export_hf). dtype: "fp32", "bf16", "fp16" or a torch dtype.
        Between steps; collective."""
        self._between_steps("export_hf")
        self.runtime.export_hf(path, DTYPE_NAMES.get(dtype, dtype), maps, ties, max_file_bytes)

    def allreduce(self, values: Any, op: str = "sum") -> Union[float, List[float]]:
        """Runtime.allreduce: op ("sum", "max", "min") of floats over the world.
        Between steps; collective."""
        self._between_steps("allreduce")
        return self.runtime.allreduce(values, op)

    def mean_over_ranks(self, value: Any, count: Any = 1.0) -> float:
        """The world's mean of a logged value (a float or a one-element tensor,
        e.g. this rank's loss) weighted by `count` (this rank's samples or tokens):
        sum(value * count) / sum(count) over the ranks, the same bits on every
        rank. Between steps (log the step's losses after it); collective."""
        self._between_steps("mean_over_ranks")
        if isinstance(value, torch.Tensor):
            value = value.detach().item()
        s, c = self.runtime.allreduce([float(value) * float(count), float(count)], "sum")
        return s / c

    def close(self) -> None:
        """Removes the hooks and destroys the runtime; works at any point, also
        inside a step or after an error. The model's parameters become
        stand-ins that refuse any use naming the fix (guard.py), and the real
        parameters lose their views (no tensor over freed memory survives);
        save shards() or full_state_dict() first to keep the weights."""
        if self._closed:
            return
        self._closed = True
        for h in self._handles:
            h.remove()
        self._handles = []
        _init.unguard_applies(getattr(self, "_applies", None))
        self.model.__dict__.pop("zero_grad", None)
        if getattr(self, "_init", None) is not None:
            self._init.drop()
            for slots in self._slots:
                for s in slots:
                    s.init = None
            self._init = None
        self._shut_all("closed")
        with torch.no_grad():
            for _, entries in self._units:
                for p, _, _ in entries:
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            for _, mp, _, _ in self._main:
                mp.grad = None
                mp.data = torch.empty(0, dtype=mp.dtype, device=mp.device)
        self._main = []
        if self._in_step:
            try:            # no op left in flight: a half-done step's collectives complete
                self.runtime.synchronize()
            except MfsdpError:
                pass        # a failed runtime: destroy tells its peers
        self.runtime.close()

    def _check_replaced(self):
        """A parameter replaced after sharding (module.weight = nn.Parameter(...)
        in an init) would be trained by nobody: refused before the first step."""
        for slots in self._slots:
            for s in slots:
                for mod, attr in s.holders:
                    p = mod._parameters.get(attr)
                    if p is not s.stand_in and p is not s.real:
                        raise UsageError(_init.replaced(s.name))

    def _model_zero_grad(self, model):
        """model.zero_grad() of the sharded model clears the master shards'
        .grad too (the gradient lives there, as on FSDP2's sharded parameters),
        so a loop that calls it instead of optimizer.zero_grad() does not
        accumulate (a loop that calls neither accumulates, as torch does)."""
        own = type(model).zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            own(model, set_to_none)
            self._carry = []
            for _, mp, _, _ in self._main:
                if mp.grad is None:
                    continue
                if set_to_none or self._in_step:
                    mp.grad = None
                else:
                    mp.grad.zero_()
        return zero_grad

    # ---- state ----
    def _reset_step(self):
        self.m = 0
        self._reset_microbatch()
        self.phase = "idle"

    def _reset_microbatch(self):
        self.fwd_done = [False] * self.U
        self.bwd_open = [False] * self.U
        self.pending = [len(e) for _, e in self._units]
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
        self._in_step = False
        self._grad_unused = True
        self.steps += 1
        self._reset_step()
        self._shut_all("between steps, after step %d" % self.steps)
        for slots in self._slots:
            for s in slots:
                s.grad_delivered(True)     # clip_grad_norm_(model.parameters()) refused
        for _, mp, g, _ in self._main:
            mp.grad = g if g.dtype == mp.dtype else g.to(mp.dtype)
        if self._carry:          # no zero_grad() since the last step: torch accumulates
            grads = {id(mp): g for _, mp, g, _ in self._main}
            with torch.no_grad():
                for mp, old in self._carry:
                    mp.grad.add_(old)
                    if mp.grad is not grads[id(mp)]:
                        grads[id(mp)].copy_(mp.grad)    # clip_grad_norm_ reads the runtime's
            self._carry = []

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
                    import warnings
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
            outs = [t for t in _tensors_in(output) if t.requires_grad]
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
            late = [w for w in range(u + 1, self.U) if self.pending[w]]
            if late:
                w = late[0]
                names = [v.name for p, v, _ in self._units[w][1] if p.grad is None]
                raise UsageError(
                    "unit %r's backward began while unit %r still waits for the gradients of %s: "
                    "every parameter of a unit must receive its gradient in each microbatch" % (
                        self._unit_name(u), self._unit_name(w), ", ".join(names[:8])))
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
            self.pending[u] -= 1
            if self.pending[u] == 0:
                self.bwd_open[u] = False
                self.runtime.backward_post(u, self.m)
                self._shut(u, "after its backward in microbatch %d" % self.m)
                if u == 0:
                    self._microbatch_done()
        return hook

    def _microbatch_done(self):
        self.m += 1
        self._reset_microbatch()
        if self.m == self.M:
            self._end_step()


def _not_traced(hook):
    """A hook that torch.compile runs as Python (a graph break), not traced:
    torch.compile(model) of a sharded model compiles the code between the
    unit hooks, which gather and free the weights as in eager mode."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(hook) if disable is not None else hook


def _built_on_meta(model):
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


def _materialised(p, data, holders):
    """A Parameter over the runtime's weight replacing meta parameter p in
    every module that holds it (a meta tensor's .data cannot be set)."""
    real = torch.nn.Parameter(data, requires_grad=p.requires_grad)
    for mod, attr in holders[id(p)]:
        mod._parameters[attr] = real
    holders[id(real)] = holders.pop(id(p))
    return real


def _refuse_torchrun(backend, world):
    """torchrun starts processes that MPI does not know: each is a world of one."""
    import os
    size = os.environ.get("WORLD_SIZE")
    mpi = any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                        "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS"))
    if backend == "mpi" and size and size.isdigit() and int(size) > 1 and not mpi:
        raise UsageError(
            "backend=\"mpi\" under torchrun (WORLD_SIZE=%s, no MPI launcher): the CPU backend "
            "takes its ranks from MPI, so each of the %s processes would be a world of one; "
            "launch with mpirun -np %d python SCRIPT instead (torchrun's MASTER_ADDR/PORT are "
            "not needed; torch.distributed, where used, can still be initialised), or use "
            "backend=\"nccl\" on GPUs under torchrun" % (size, size, world))


def _master(rt, view, role, whole):
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


def _refuse_module_state_dicts(model):
    """Hooks that make state_dict() and load_state_dict() of the sharded
    model (or of any of its modules) a UsageError naming the mfsdp call: its
    parameters are stand-ins outside the runtime's windows, so torch's own
    state dicts (and get/set_model_state_dict, which call them) cannot see
    the weights. Removed by close() (the stand-ins then refuse on their own)."""
    def saving(module, prefix, keep_vars):
        raise UsageError(
            "%sstate_dict() of a sharded model (%s): its weights live in the runtime's shards, "
            "not in the modules' parameters: take sm.full_state_dict() (whole tensors, as "
            "get_model_state_dict(..., full_state_dict=True)), sm.save_dcp(path, optimizer) (a "
            "DCP checkpoint, as dcp.save of get_model_state_dict) or sm.save_checkpoint(path, "
            "optimizer)" % (prefix, type(module).__name__))

    def loading(module, state_dict, prefix, *rest):
        raise UsageError(
            "%sload_state_dict() into a sharded model (%s): set the master weights with "
            "sm.load_full_state_dict(state_dict) (whole tensors), sm.load_dcp(path, optimizer) "
            "(a DCP checkpoint, FSDP2's included) or sm.load_checkpoint(path, optimizer)"
            % (prefix, type(module).__name__))

    handles = []
    for mod in model.modules():
        handles.append(mod.register_state_dict_pre_hook(saving))
        handles.append(mod.register_load_state_dict_pre_hook(loading))
    return handles


def _fewer_than_two_dims(name, shape):
    return len(shape) < 2


_HOOK = []     # the one global optimizer step pre-hook, once installed


def _watch_optimizers(sm):
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


def _check_optimizer(optimizer, args, kwargs):
    """Refuses a step over a sharded model's own parameters (its stand-ins or
    the real ones: they never hold a gradient, so nothing would train) and
    lets each ShardedModel whose main parameters it steps check its state."""
    owners = {}
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
                owners[id(owner)] = owner
    for owner in owners.values():
        sm = owner()
        if sm is None or sm._closed:
            raise UsageError("%s.step() over the main parameters of a closed ShardedModel: "
                             "their memory is gone; create the optimizer over the main "
                             "parameters of a new mt.shard" % type(optimizer).__name__)
        sm._optimizer_step()
    return None


def _replicated_weights(schedule, holders, units):
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


def _nccl_args(kw, backend, world):
    """torch's current device and stream as the runtime's compute stream; for
    a world of several processes, an NCCL unique id made on rank 0 and
    broadcast through torch.distributed (which must be initialised)."""
    kw = dict(kw)
    if not torch.cuda.is_available():
        raise MfsdpError(8, "the %s backend needs a CUDA device (torch.cuda.is_available() "
                            "is False)" % backend)
    kw.setdefault("device", torch.cuda.current_device())
    kw.setdefault("stream", torch.cuda.current_stream().cuda_stream)
    if backend == "nccl" and world > 1 and "nccl_unique_id" not in kw:
        import torch.distributed as dist
        if not dist.is_initialized():
            raise UsageError("the nccl backend on %d ranks needs torch.distributed initialised "
                             "(any backend, e.g. gloo) to share NCCL's unique id" % world)
        obj = [_lib.nccl_unique_id() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(obj, src=0)
        kw["nccl_unique_id"] = obj[0]
        kw.setdefault("rank", dist.get_rank())
    return kw


def shard(model: torch.nn.Module, schedule: Schedule, backend: str = "mpi",
          offload_policy: Any = None, **runtime_kw: Any) -> ShardedModel:
    """Drives `model` with `schedule` on `backend` ("local", "mpi", "nccl");
    extra keywords go to mfsdp.Runtime (timeout_ms, comm, group, rank, ...).
    offload_policy: torch's CPUOffloadPolicy() or True for FSDP2's CPU offload
    (GPU backends; a no-op that warns on CPU ones: docs/pytorch.md, "CPU offload")."""
    return ShardedModel(model, schedule, backend=backend, offload_policy=offload_policy,
                        **runtime_kw)
