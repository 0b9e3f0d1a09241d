"""
offload: FSDP2's CPU offload for mt.shard(..., offload_policy=).

With torch's `torch.distributed.fsdp.CPUOffloadPolicy()` (or `True`) on a GPU
backend (nccl, cuda_local) the runtime keeps every master weight shard in
pinned host memory and copies the delivered gradient into a pinned host
mirror at the end of each step (MFSDP_FLAG_OFFLOAD_MAIN): the main parameters
are CPU tensors over that memory and their .grad the host gradient, so a
torch optimizer over sm.main_parameters() keeps its state on the CPU and
steps there, as FSDP2's CPU offload does. On the CPU backends (local, mpi)
every buffer is host memory already: the policy is a no-op, said once per
process and backend with a UserWarning and by sm.offload (inactive, why).
`pin_memory=False` is refused on a GPU backend: the device reads the master
weights straight from host memory, which pageable memory does not allow.
See docs/pytorch.md, "CPU offload".
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Set

from .._lib import UsageError, load

if TYPE_CHECKING:
    from ..runtime import Runtime
    from ..schedule import Schedule

try:   # torch's own (torch >= 2.6); the same fields otherwise
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
except ImportError:   # pragma: no cover - depends on the torch build
    @dataclass
    class OffloadPolicy:  # type: ignore[no-redef]
        """No offload (FSDP2's default policy)."""

    @dataclass
    class CPUOffloadPolicy(OffloadPolicy):  # type: ignore[no-redef]
        """Master weights, gradients and optimizer state in (pinned) host memory."""
        pin_memory: bool = True

GPU_BACKENDS = ("nccl", "cuda_local")
_warned: Set[str] = set()   # backends whose no-op has been announced in this process


def requested(policy: Any, backend: str) -> bool:
    """Whether `policy` (shard's offload_policy=) asks for CPU offload; a
    policy that cannot mean anything here is a UsageError naming the fix."""
    if policy is None or policy is False:
        return False
    if policy is True:
        return True
    if isinstance(policy, type):
        raise UsageError("offload_policy=%s is the class: pass an instance, %s()"
                         % (policy.__name__, policy.__name__))
    if hasattr(policy, "offload_params"):   # FSDP1's torch.distributed.fsdp.CPUOffload
        raise UsageError("offload_policy=%r is FSDP1's CPUOffload: pass FSDP2's "
                         "torch.distributed.fsdp.CPUOffloadPolicy() (or mt.CPUOffloadPolicy(), "
                         "or True)" % (policy,))
    if not hasattr(policy, "pin_memory"):
        if type(policy).__name__ == "OffloadPolicy":   # FSDP2's default: no offload
            return False
        raise UsageError("offload_policy=%r: expected torch.distributed.fsdp.CPUOffloadPolicy() "
                         "(an object with pin_memory), True, or None" % (policy,))
    if not policy.pin_memory and backend in GPU_BACKENDS:
        raise UsageError("offload_policy=CPUOffloadPolicy(pin_memory=False) on the %s backend: "
                         "the GPU reads the master weights from host memory directly, which "
                         "pageable memory does not allow; use CPUOffloadPolicy() "
                         "(pin_memory=True)" % backend)
    return True


def refusing_op(schedule: Schedule) -> int:
    """The index of the schedule's first collective on a main_weight buffer
    (then a GPU backend refuses offload at create), or -1 (every schedule
    mfsdpc compiles)."""
    return int(load().mfsdp_schedule_offload_op(schedule.handle))


def host_resident(runtime: Runtime) -> bool:
    """True when the runtime keeps main_weight and the delivered gradient's
    mirror in pinned host memory (their tensors are then CPU tensors)."""
    return bool(load().mfsdp_offload_active(runtime.handle))


class OffloadReport:
    """What the runtime did with the offload policy (ShardedModel.offload):
    `requested`, `active` (also the truth value), `host_bytes` (pinned host
    memory the runtime allocated for it) and `reason` (the runtime's
    sentence: not requested, inactive and why, or active with its bytes)."""
    __slots__ = ("backend", "requested", "active", "host_bytes", "reason")

    def __init__(self, runtime: Runtime, requested_: bool) -> None:
        lib = load()
        self.backend = runtime.backend
        self.requested = requested_
        self.active = bool(lib.mfsdp_offload_active(runtime.handle))
        self.host_bytes = int(lib.mfsdp_offload_host_bytes(runtime.handle))
        self.reason = lib.mfsdp_offload_status(runtime.handle).decode()

    def __bool__(self) -> bool:
        return self.active

    def __repr__(self) -> str:
        return "OffloadReport(backend=%r, active=%r, host_bytes=%d, reason=%r)" % (
            self.backend, self.active, self.host_bytes, self.reason)


def _caller_level() -> int:
    """warnings' stacklevel of the first frame outside the mfsdp package
    (the caller of mt.shard or mt.fully_shard)."""
    import os
    import sys
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    f, level = sys._getframe(1), 1
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(pkg + os.sep):
        f, level = f.f_back, level + 1
    return level


def report(runtime: Runtime, requested_: bool) -> OffloadReport:
    """The report of a runtime created with (or without) the offload flag;
    warns once per process and backend when the request is a no-op."""
    r = OffloadReport(runtime, requested_)
    if requested_ and not r.active and r.backend not in _warned:
        _warned.add(r.backend)
        warnings.warn("offload_policy on the %s backend is a no-op: %s; sm.offload.active is "
                      "False" % (r.backend, r.reason), UserWarning, stacklevel=_caller_level())
    return r
