"""
shard: mfsdp.torch.shard(model, schedule, backend) and ShardedModel, the
model driven by an mfsdp runtime: what users call (the master parameters
for the optimizer, the step helpers, state dicts, checkpoints, close).

What ShardedModel() does, in order:
  1. checks the schedule against the model (units.match: every mismatch in
     one ModelMismatchError);
  2. creates the runtime and copies each parameter's current value into this
     rank's main_weight shard (so training starts from torch's init), after
     comparing every rank's values (init.agree: a checksum per tensor, one
     all-reduce); a model built on meta gets its values from the init that
     follows sharding, replayed unit by unit (init.DeferredInit);
  3. makes each parameter's .data a view of the runtime's unsharded weight
     (units.bind; valid inside its unit's windows, as FSDP2's unsharded
     parameters are);
  4. installs the per-unit forward and backward hooks (hooks.py, the layer
     below: phases, microbatches, windows, step_begin/step_end), hooks that
     refuse torch's own state_dict()/load_state_dict() on the sharded
     modules, and model.zero_grad() clearing the master shards' .grad.

The master shards (guard.MainParameter) answer dim() with their whole
tensor's. Module conversions (to_empty, .to(dtype)) go through
init.apply_guard. Checkpoints are delegated up: save_checkpoint and
load_checkpoint to checkpoint.py, save_dcp and load_dcp to dcp.py, each
imported inside the method (those modules take a ShardedModel: the layer
above this one, docs/design.md §5.1).

Distinct tensors (docs/semantics.md §4.7; `distinct` {tensor name: axes},
read from the schedule's YAML): their initial values are compared among the
ranks sharing their coordinates only; with expert_axes their delivered
gradient is divided by those axes' sizes at every step end (hooks.py); every
whole-model read or write by name (checkpoints, HF) is refused;
full_state_dict, load_full_state_dict and DCP (weights only) use their global names (`globals`
{tensor name: the schedule's global key}, global_state.py) and refuse a
Distinct tensor without one. device_mesh() gives the torch
DeviceMesh of the same coordinates for the model's own TP/EP collectives.
"""
from __future__ import annotations

import zlib
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import torch

from .. import _lib
from .._lib import MfsdpError, UsageError
from ..runtime import Runtime
from . import init as _init
from . import naming as _naming
from . import offload as _offload
from . import units as _units
from .guard import holders_of
from .hooks import UnitHooks, watch_optimizers
from .tensors import DTYPE_NAMES
from .units import ModelMismatchError   # noqa: F401  (mfsdp.torch.shard.ModelMismatchError)

if TYPE_CHECKING:
    from ..checkpoint import Rules
    from .checkpoint import Optimizers
    from ..runtime import Stats
    from ..schedule import Schedule


class ShardedModel(UnitHooks):
    """The model driven by an mfsdp runtime (returned by shard())."""

    def __init__(self, model: torch.nn.Module, schedule: Schedule, backend: str = "mpi",
                 offload_policy: Any = None, expert_axes: Sequence[str] = (),
                 tensor_axes: Sequence[str] = (), **runtime_kw: Any) -> None:
        self._probing = False      # a forward on meta finding the units' order (fully_shard.py)
        for key, axes in (("expert_axes", expert_axes), ("tensor_axes", tensor_axes)):
            if isinstance(axes, str):
                raise UsageError("%s=%r: give a tuple of axis names, e.g. (%r,)" % (key, axes, axes))
        self.expert_axes = tuple(expert_axes)     # Distinct axes the model dispatches tokens over
        self.tensor_axes = tuple(tensor_axes)     # Distinct axes whose gradients are each rank's own
        self._device_mesh = None
        self._build(model, schedule, backend, offload_policy, runtime_kw, True)

    def _build(self, model, schedule, backend, offload_policy, runtime_kw, check):
        """Everything of __init__ (the module comment's steps 1-4); `check`:
        compare the ranks' initial values (False when a FullyShardedModel
        rebuilds itself for the forward's unit order: its masters are copied)."""
        self.model = model
        self.schedule = schedule
        self._how = (backend, offload_policy, dict(runtime_kw))
        units = _units.match(model, schedule)
        meta = _units.built_on_meta(model)
        offload = _offload.requested(offload_policy, backend)   # CPU offload (offload.py)
        if backend in ("nccl", "cuda_local"):
            runtime_kw = _nccl_args(runtime_kw, backend, schedule.world_size)
        _refuse_torchrun(backend, schedule.world_size)
        self.distinct = distinct_axes_of(schedule)    # {tensor name: its Distinct axes}
        self.globals = _naming.global_names_of(schedule.text, schedule.name)   # their global names
        _check_distinct_axes(schedule, self.distinct, self.expert_axes, self.tensor_axes)
        self.runtime = rt = Runtime(schedule, backend=backend, offload=offload, **runtime_kw)
        self.offload = _offload.report(rt, offload)   # active, host_bytes, reason
        self.M = schedule.microbatches
        self.U = len(schedule.units)
        self._units = []       # per unit: (module, [(param, view, grad_local tensor)])
        self._main = []        # (name, master Parameter, grad tensor, view)
        self._slots = []       # per unit: [ParamSlot] (guard.py)
        holders = holders_of(model)
        whole_step = _units.replicated_weights(schedule, holders, units)
        hashes, dtypes = _units.bind(rt, schedule, units, holders, whole_step, meta,
                                     self._units, self._main, self._slots)
        self._grad_scales = _expert_scales(self, self.expert_axes)
        self._start_hooks()
        self._handles += _refuse_module_state_dicts(model)
        watch_optimizers(self)
        self._applies = _init.guard_applies(self, model)   # to_empty, .to(dtype): init.py
        model.__dict__["zero_grad"] = self._model_zero_grad(model)
        self._carry = []       # (master, .grad kept from the last step: no zero_grad() since)
        self._init = _init.DeferredInit(self, dtypes) if meta else None
        self.init_peak_bytes = getattr(self, "init_peak_bytes", 0)   # most bytes whole at once in it
        if check and self.distinct:
            self._agree_axis_kinds()
        if not meta and check:
            hashes.update(_init.buffer_hashes(model))
            own = {n: hashes.pop(n) for n in list(hashes) if n in self.distinct}
            try:
                _init.agree(self, hashes, "at sharding")
                _agree_per_coordinate(self, own)
            except UsageError:
                self.close()
                raise

    def _agree_axis_kinds(self) -> None:
        """Every rank declares the Distinct axes alike (expert_axes,
        tensor_axes): a rank that divided its expert gradients while a replica
        did not would drift from it with no error. UsageError on every rank."""
        kinds = repr((sorted(self.expert_axes), sorted(self.tensor_axes))).encode()
        if _init.differing(self, {"axes": zlib.crc32(kinds) | (zlib.adler32(kinds) << 32)}):
            self.close()
            raise UsageError("the ranks declare the Distinct axes differently: this rank has "
                             "expert_axes=%r, tensor_axes=%r, some other rank not; pass the "
                             "same to mt.shard / mt.fully_shard on every rank"
                             % (self.expert_axes, self.tensor_axes))

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

    def whole_parameters(self) -> List[torch.nn.Parameter]:
        """The main_parameters() whose main_weight is Whole, each full-shape
        on this owner rank: a matrix optimizer's share
        (torch.optim.Muon([{"params": sm.whole_parameters()}], ...)). With
        spec_from_module's matrix_optimizer="whole" these are exactly the
        hidden matrices this rank owns; "whole_all" adds the embeddings and
        the output head. Possibly empty (a rank may own none): give optimizers
        a param-group list."""
        return [mp for _, mp, _, v in self._main
                if self.schedule.tensors[v.index].whole_main_weight]

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
        every rank: take them from the model). A Distinct tensor is under its
        global names (the whole model's tensors: each coordinate's, or their
        concatenation for a split; exchanged with torch.distributed), one
        without global names is refused. Between steps; collective."""
        from . import global_state
        self._between_steps("full_state_dict")
        global_state.refuse_unnamed(self, "full_state_dict", self.distinct)
        name = DTYPE_NAMES.get(dtype)
        if name is None:
            raise UsageError("full_state_dict: dtype %r (float32, bfloat16 or float16)" % (dtype,))
        root = _lib.ALL_RANKS if not rank0_only else 0
        keep = root < 0 or self.runtime.rank == 0
        out = {}
        for v in self.runtime.views:
            if v.name in self.distinct:
                continue
            t = torch.empty(v.shape, dtype=dtype) if keep else None
            if self.runtime.gather(v.index, root=root, dtype=name, out=t) is not None:
                out[v.name] = t
        if self.distinct:
            out.update(global_state.gather(self, set(self.distinct), dtype, root))
        return out

    def load_full_state_dict(self, state_dict: Mapping[str, torch.Tensor],
                             strict: bool = True) -> None:
        """Sets the master weights from whole tensors (a full_state_dict(), or
        the model's own state_dict() of a single-process run): each rank copies
        its shard (mfsdp_main_weight_scatter, no communication; every rank passes
        the same values). strict: every parameter must be present and no other
        key (the model's buffers and the other names of tied weights are
        ignored). A Distinct tensor is read from its global names (each rank
        takes its coordinate's tensor or slice). The optimizer state is not
        touched. Between steps."""
        from . import global_state
        self._between_steps("load_full_state_dict")
        global_state.refuse_unnamed(self, "load_full_state_dict", self.distinct)
        params = {v.name: v for v in self.runtime.views if v.name not in self.distinct}
        named = set(self.distinct)
        known_global = set(global_state.expected(self, named))
        known = {n for n, _ in self.model.named_buffers()}    # and tied weights' other names
        known |= {n for n, _ in self.model.named_parameters(remove_duplicate=False)}
        problems = global_state.problems(self, named, state_dict, strict)
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
                         if k not in params and k not in known and k not in known_global]
        if problems:
            raise UsageError("load_full_state_dict: %s" % "; ".join(problems))
        for n, v in params.items():
            if n in state_dict:
                self.runtime.scatter(v.index, state_dict[n])
        for v in self.runtime.views:
            t = global_state.local_of(self, v.name, state_dict) if v.name in named else None
            if t is not None:
                self.runtime.scatter(v.index, t)
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
        only its own unique bytes; committed by rename. Distinct tensors
        (fully_shard distinct=) are written under their global names
        (global_names=: a renamed tensor per coordinate, or the split form's
        whole tensor, each coordinate its slice), with their optimizer
        states; one without global names is refused. Between steps;
        collective."""
        if self.distinct:
            from . import global_state
            global_state.refuse_unnamed(self, "save_checkpoint", self.distinct)
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
        none) and sets self.steps to the step. Distinct tensors are read
        under their global names: any data-parallel sizes, the same sizes of
        their Distinct axes (tp, ep) and the same global names. Between
        steps; collective."""
        if self.distinct:
            from . import global_state
            global_state.refuse_unnamed(self, "load_checkpoint", self.distinct)
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
        Needs torch.distributed initialised on more than one rank. Distinct
        tensors are written under their global names (the whole model's
        tensors), without optimizer (refused). Between steps; collective
        (python/mfsdp/torch/dcp.py)."""
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
        anything is written. Distinct tensors are read from their global names
        (this rank's coordinate's tensor or slice), without optimizer.
        Between steps (python/mfsdp/torch/dcp.py)."""
        from . import dcp
        dcp.load_dcp(self, path, optimizer, batch_bytes)
        self._loaded()

    def import_hf(self, path: str, maps: Optional[Rules] = None,
                  ties: Optional[Rules] = None) -> None:
        """Sets the master weights from a Hugging Face safetensors checkpoint
        (model.safetensors, its .index.json or a directory with either), each
        rank reading only its shards, converted to fp32 (Runtime.import_hf).
        maps: {HF prefix: parameter prefix}; ties: {name: source}. Distinct
        tensors are read from their global names (fully_shard global_names=):
        this rank's coordinate's tensor, or its slice of a split one; one
        without global names is a UsageError naming it. Between steps;
        collective."""
        self._between_steps("import_hf")
        if self.distinct:
            from . import global_state
            global_state.refuse_unnamed(self, "import_hf", self.distinct)
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
        Distinct tensors are written as the whole model's tensors under their
        global names (fully_shard global_names=): a renamed one once per
        coordinate, a split one whole, each coordinate writing its slice; one
        without global names is a UsageError naming it. Between steps;
        collective."""
        self._between_steps("export_hf")
        if self.distinct:
            from . import global_state
            global_state.refuse_unnamed(self, "export_hf", self.distinct)
        self.runtime.export_hf(path, DTYPE_NAMES.get(dtype, dtype), maps, ties, max_file_bytes)

    def device_mesh(self) -> Any:
        """A torch.distributed DeviceMesh with this schedule's mesh axes (names
        and sizes, outermost first) and the same rank coordinates (row-major,
        the innermost axis fastest: docs/semantics.md §2), for the model's own
        collectives: mesh["tp"].get_group() for TP's all-reduces,
        mesh["ep"].get_group() for the experts' all-to-all. Device type
        "cuda" on the nccl backend, else "cpu" (the default group's backend,
        e.g. gloo, must handle it). Needs torch.distributed initialised on
        every rank as the same world in the same order (init_process_group);
        made once (collective: every rank calls it the first time), then
        cached."""
        self._refuse_if_closed("device_mesh")
        if self._device_mesh is not None:
            return self._device_mesh
        backend = self._how[0]
        world = self.runtime.world_size
        if backend in ("local", "cuda_local") and world > 1:
            raise UsageError("device_mesh() on the %s backend: its %d ranks are threads of one "
                             "process, torch.distributed needs one process per rank (use "
                             "backend=\"mpi\" or \"nccl\")" % (backend, world))
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise UsageError("device_mesh() needs torch.distributed: call "
                             "torch.distributed.init_process_group(\"%s\", ...) on every rank "
                             "first, with rank = the mfsdp rank (%d) and world_size = %d"
                             % ("nccl" if backend == "nccl" else "gloo", self.runtime.rank, world))
        if dist.get_world_size() != world or dist.get_rank() != self.runtime.rank:
            raise UsageError("device_mesh(): torch.distributed has rank %d of %d, the mfsdp "
                             "runtime rank %d of %d: the two must be the same world in the same "
                             "order" % (dist.get_rank(), dist.get_world_size(),
                                        self.runtime.rank, world))
        from torch.distributed.device_mesh import DeviceMesh
        names, sizes = tuple(self.schedule.mesh), tuple(self.schedule.mesh.values())
        ranks = torch.arange(world, dtype=torch.int64).reshape(sizes)
        self._device_mesh = DeviceMesh("cuda" if backend in ("nccl", "cuda_local") else "cpu",
                                       ranks, mesh_dim_names=names)
        return self._device_mesh

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


def distinct_axes_of(schedule: Schedule) -> Dict[str, Tuple[str, ...]]:
    """{tensor name: the mesh axes on which its bucket is Distinct} of a
    compiled schedule, read from its YAML (the buckets' weight placement:
    docs/schedule.md); tensors with none are left out. The text is the
    schedule's own (Schedule.from_text, compile) or its file (Schedule.load)."""
    import os
    import re
    text = schedule.text
    if text is None and os.path.isfile(schedule.name):
        with open(schedule.name, "rb") as f:
            text = f.read()
    if text is None:
        return {}
    axes = list(schedule.mesh)
    out: Dict[str, Tuple[str, ...]] = {}
    mine: Tuple[str, ...] = ()
    in_buckets = False
    for line in (text.decode("utf-8") if isinstance(text, bytes) else text).splitlines():
        if line and not line[0].isspace() and not line.startswith("-"):
            in_buckets = line.startswith("buckets:")
            continue
        if not in_buckets:
            continue
        m = re.match(r"^  weight: \{.*placement: \[([^\]]*)\]", line)
        if m:
            places = [p.strip() for p in m.group(1).split(",")]
            mine = tuple(a for a, p in zip(axes, places) if p == "Distinct")
            continue
        m = re.match(r'^  - \{name: ("(?:[^"\\]|\\.)*"|[^,]+),', line)
        if m and mine:
            name = m.group(1)
            if name.startswith('"'):
                name = re.sub(r"\\(.)", r"\1", name[1:-1])
            out[name] = mine
    return out


def _check_distinct_axes(schedule: Schedule, distinct: Mapping[str, Tuple[str, ...]],
                         expert_axes: Sequence[str], tensor_axes: Sequence[str]) -> None:
    """UsageError unless every Distinct axis of the schedule is declared in
    exactly one of expert_axes (the model dispatches tokens over it: each
    tensor's gradient is its group's sum, divided here) and tensor_axes (each
    coordinate's gradient is its own: tensor parallelism), and both name only
    Distinct axes. Undeclared, an expert gradient would be off by the axis
    size without a sign."""
    mesh = schedule.mesh
    used = {a for axes in distinct.values() for a in axes}
    for key, axes in (("expert_axes", expert_axes), ("tensor_axes", tensor_axes)):
        for a in axes:
            if a not in used:
                raise UsageError("%s names %r, which is %s: expert_axes and tensor_axes are the "
                                 "Distinct axes (give spec_from_module or fully_shard "
                                 "distinct={pattern: %r})"
                                 % (key, a, "not an axis of the mesh (%s)" % ", ".join(mesh)
                                    if a not in mesh else "Distinct for no tensor", a))
    for a in sorted(used, key=list(mesh).index):
        if (a in expert_axes) == (a in tensor_axes):
            tensor = next(n for n, axes in distinct.items() if a in axes)
            raise UsageError(
                "axis %r is Distinct (e.g. %r) and %s: say how its tensors get their gradient, "
                "in exactly one of expert_axes=(%r,) (the model dispatches tokens over it, "
                "e.g. an all-to-all to the experts: each expert's gradient sums its %s group's "
                "tokens, and mfsdp divides it by %d to the batch mean) and tensor_axes=(%r,) "
                "(each coordinate computes its own shard's gradient from the same tokens: "
                "tensor parallelism)"
                % (a, tensor, "in both" if a in expert_axes else "in neither", a, a, mesh[a], a))


def _expert_scales(sm: ShardedModel, expert_axes: Sequence[str]) -> List[Tuple[torch.Tensor, float]]:
    """[(delivered gradient tensor, factor)]: with reduce avg, the gradient of
    a tensor Distinct on expert axes is divided by their sizes' product after
    each step (the model's all-to-all already summed it over those axes'
    tokens: the mean over the whole batch, as the dense tensors')."""
    mesh = sm.schedule.mesh
    out = []
    if sm.schedule.reduce != "avg":
        return out
    for name, _, g, _ in sm._main:
        n = 1
        for a in sm.distinct.get(name, ()):
            if a in expert_axes:
                n *= mesh[a]
        if n > 1:
            out.append((g, 1.0 / n))
    return out


def _agree_per_coordinate(sm: ShardedModel, hashes: Dict[str, int]) -> None:
    """init.agree for Distinct tensors: the ranks that share a tensor's
    coordinates on its Distinct axes must start from the same values (one
    all-reduce of max over a slot per coordinate combination)."""
    rt = sm.runtime
    if rt.world_size <= 1 or not hashes:
        return
    names = sorted(hashes)
    axes = list(sm.schedule.mesh)
    hi, lo = [], []
    slots = []
    for n in names:
        dims = [axes.index(a) for a in sm.distinct[n]]
        combos = 1
        mine = 0
        for j in dims:
            combos *= sm.schedule.mesh[axes[j]]
            mine = mine * sm.schedule.mesh[axes[j]] + rt.coords[j]
        h = hashes[n]
        parts = [float(h & 0x3FFFFF), float((h >> 22) & 0x3FFFFF), float(h >> 44)]
        for c in range(combos):
            own = c == mine
            hi += parts if own else [-1.0] * 3
            lo += [-x for x in parts] if own else [-float(1 << 23)] * 3
            slots.append((n, c))
    try:
        got = rt.allreduce(hi + lo, "max")
    except MfsdpError as e:
        if e.code != _lib.ERR_UNSUPPORTED:
            raise
        return      # the nccl backend has no helpers: not compared
    k = len(hi)
    differ = sorted({slots[i // 3][0] for i in range(0, k, 3)
                     if any(got[j] != -got[k + j] for j in range(i, i + 3))})
    if differ:
        raise UsageError(
            "the ranks that share a Distinct coordinate start from different values of %s "
            "at sharding: each coordinate's replicas must hold the same tensor (seed every rank "
            "the same and take each coordinate's slice the same way on all its ranks)"
            % ", ".join(differ[:8]))


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


def device_mesh(sm: ShardedModel) -> Any:
    """sm.device_mesh(): the torch DeviceMesh with mfsdp's axes and rank
    coordinates (the model's own TP and expert collectives)."""
    if not isinstance(sm, ShardedModel):
        raise UsageError("device_mesh(sm) takes the ShardedModel that mt.shard or mt.fully_shard "
                         "returned, not a %s" % type(sm).__name__)
    return sm.device_mesh()


def shard(model: torch.nn.Module, schedule: Schedule, backend: str = "mpi",
          offload_policy: Any = None, expert_axes: Sequence[str] = (),
          tensor_axes: Sequence[str] = (), **runtime_kw: Any) -> ShardedModel:
    """Drives `model` with `schedule` on `backend` ("local", "mpi", "nccl");
    extra keywords go to mfsdp.Runtime (timeout_ms, comm, group, rank, ...).
    offload_policy: torch's CPUOffloadPolicy() or True for FSDP2's CPU offload
    (GPU backends; a no-op that warns on CPU ones: docs/pytorch.md, "CPU offload")."""
    return ShardedModel(model, schedule, backend=backend, offload_policy=offload_policy,
                        expert_axes=expert_axes, tensor_axes=tensor_axes, **runtime_kw)
