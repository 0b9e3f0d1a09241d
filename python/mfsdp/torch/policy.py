"""
policy: FSDP2's MixedPrecisionPolicy read as an mfsdp layout's dtypes and
the casts at module boundaries (docs/pytorch.md, "One call: fully_shard").

FSDP2 (torch.distributed.fsdp.MixedPrecisionPolicy, torch 2.15) defines:
  param_dtype          the unsharded parameters' dtype (compute and all-gather)
                       -> the layout's `weight` dtype; None: the parameters'
                       own dtype
  reduce_dtype         the gradient's dtype in reduction and accumulation
                       -> the layout's `grad` dtype; None: the parameters' own
                       dtype (torch >= 2.15; earlier FSDP2 used param_dtype)
  output_dtype         floating outputs of the forward cast to it
                       -> the root module's floating outputs
  cast_forward_inputs  floating inputs cast to param_dtype before each
                       FSDP module's forward -> the root's and each unit's
The master weights (`main_weight`) stay fp32, as FSDP2's sharded parameters
keep their original dtype. Any object with these attributes is accepted
(duck typing), so torch's own class works; MixedPrecisionPolicy here is
torch's when it exists, else an equivalent dataclass.
"""
from __future__ import annotations

import dataclasses
from typing import Any, List, NamedTuple, Optional

import torch

from .._lib import UsageError
from .tensors import DTYPE_NAMES

# torch dtype -> the spec's dtype name (docs/language.md)
SPEC_DTYPES = DTYPE_NAMES   # the dtypes a spec can hold (tensors.py)

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy
except ImportError:          # torch without FSDP2 (before 2.4) or without torch.distributed
    @dataclasses.dataclass(frozen=True)
    class MixedPrecisionPolicy:  # type: ignore[no-redef]
        """FSDP2's mixed precision policy, field for field (see the module comment)."""
        param_dtype: Optional[torch.dtype] = None
        reduce_dtype: Optional[torch.dtype] = None
        output_dtype: Optional[torch.dtype] = None
        cast_forward_inputs: bool = True


class Precision(NamedTuple):
    """A mixed precision policy resolved for one model."""
    weight: str                        # the layout's weight dtype: fp32, bf16, fp16
    grad: str                          # the layout's grad dtype
    inputs: Optional[torch.dtype]      # floating inputs of the root and units cast to it
    output: Optional[torch.dtype]      # floating outputs of the root cast to it


def refuse_first(checks: Any) -> None:
    """Raises a UsageError with the message of the first (condition, message)
    of `checks` whose condition is true; nothing when none is. The refusals of
    one call read as a table (resolve's policies, fully_shard's models)."""
    for condition, message in checks:
        if condition:
            raise UsageError(message)


def _spec_dtype(what, dt):
    if dt not in SPEC_DTYPES:
        raise UsageError("MixedPrecisionPolicy.%s=%r: mfsdp's weights and gradients are "
                         "torch.float32, torch.bfloat16 or torch.float16" % (what, dt))
    return SPEC_DTYPES[dt]


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The one dtype of the model's parameters; UsageError when they mix
    dtypes or have one mfsdp cannot hold."""
    found = {p.dtype for p in model.parameters()}
    if len(found) > 1:
        raise UsageError("the model's parameters have several dtypes (%s): give them one "
                         "(model.float()) and choose the compute dtype with mp_policy="
                         % ", ".join(sorted(str(d) for d in found)))
    dt = found.pop() if found else torch.float32
    _spec_dtype("param_dtype (None: the parameters' own dtype)", dt)
    return dt


def resolve(policy: Any, model: torch.nn.Module) -> Precision:
    """The Precision of `policy` (a MixedPrecisionPolicy, any object with its
    attributes, or None: the parameters' own dtype, no casts) for `model`."""
    own = model_dtype(model)
    if policy is None:
        return Precision(SPEC_DTYPES[own], SPEC_DTYPES[own], None, None)
    refuse_first([
        (not (hasattr(policy, "param_dtype") and hasattr(policy, "reduce_dtype")),
         "mp_policy=%r is not a MixedPrecisionPolicy: give "
         "torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...) or "
         "mfsdp.torch.MixedPrecisionPolicy" % (policy,)),
        (getattr(policy, "param_dtype_override_fn", None) is not None,
         "MixedPrecisionPolicy.param_dtype_override_fn is not supported: give the parameters "
         "that keep their dtype their own layout with overrides={pattern: {'name': ..., "
         "'weight': ('fp32', [...]), ...}}"),
        (getattr(policy, "buffer_dtype", None) is not None,
         "mp_policy has buffer_dtype (FSDP1's MixedPrecision): mfsdp does not cast buffers; "
         "use FSDP2's MixedPrecisionPolicy")])
    param = policy.param_dtype or own
    weight = _spec_dtype("param_dtype", param)
    grad = _spec_dtype("reduce_dtype", policy.reduce_dtype or own)
    out = getattr(policy, "output_dtype", None)
    if out is not None and not (isinstance(out, torch.dtype) and out.is_floating_point):
        raise UsageError("MixedPrecisionPolicy.output_dtype=%r: a floating torch dtype or None"
                         % (out,))
    cast = bool(getattr(policy, "cast_forward_inputs", True)) and policy.param_dtype is not None
    return Precision(weight, grad, param if cast else None, out)


def cast_floating(obj: Any, dtype: torch.dtype) -> Any:
    """obj with every floating tensor (in tuples, lists and dicts) cast to dtype."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):       # a NamedTuple
        return type(obj)(*(cast_floating(o, dtype) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast_floating(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_floating(v, dtype) for k, v in obj.items()}
    return obj


def install_casts(root: torch.nn.Module, units: List[torch.nn.Module],
                  precision: Precision) -> List[Any]:
    """The forward hooks of the policy's casts: inputs of the root and of
    each unit to precision.inputs, outputs of the root to precision.output.
    Returns the hook handles (remove them to undo)."""
    handles = []
    if precision.inputs is not None:
        def cast_inputs(module, args, kwargs, _dt=precision.inputs):
            return cast_floating(args, _dt), cast_floating(kwargs, _dt)
        seen = set()
        for mod in [root] + list(units):
            if id(mod) not in seen:
                seen.add(id(mod))
                handles.append(mod.register_forward_pre_hook(cast_inputs, with_kwargs=True))
    if precision.output is not None:
        def cast_output(module, args, output, _dt=precision.output):
            return cast_floating(output, _dt)
        handles.append(root.register_forward_hook(cast_output))
    return handles


def check_reshard(value: Any) -> Any:
    """reshard_after_forward as fully_shard takes it: None, a bool, or
    {unit name or pattern: bool}; FSDP2's int (reshard to a smaller mesh
    after forward) is a UsageError."""
    def one(v, where):
        if isinstance(v, bool):
            return
        if isinstance(v, int):
            raise UsageError(
                "reshard_after_forward%s=%d: FSDP2's int (reshard to a mesh of %d ranks after "
                "forward) is not supported; give True (free after forward, gather again in "
                "backward), False (keep from forward to backward), or a dict "
                "{unit pattern: bool}" % (where, v, v))
        raise UsageError("reshard_after_forward%s=%r: True, False, None or {unit pattern: bool}"
                         % (where, v))
    if value is None:
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            one(v, "[%r]" % (k,))
        return value
    one(value, "")
    return value

