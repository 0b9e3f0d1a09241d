"""
test_offload: mt.shard(..., offload_policy=) in one process (local backend,
a world of one rank; python/mfsdp/torch/offload.py). On a CPU backend the
policy is a no-op: one UserWarning per process naming the backend,
sm.offload inactive with the runtime's reason, and training bit-identical to
a run without it. The mistakes of a PyTorch FSDP user are refused with the
fix: FSDP1's CPUOffload, the class instead of an instance, an unrelated
object, pin_memory=False on a GPU backend. Every layout of docs/pytorch.md,
compiled as spec_from_module writes it, can be offloaded on a GPU (no
collective on main_weight). The parity of an offloaded mpi run is in
test_parity.py.
"""
import warnings

import pytest
import torch
from torch.distributed.fsdp import CPUOffload, OffloadPolicy

import gpt
import mfsdp
import mfsdp.torch as mt
from mfsdp.torch import offload

M, STEPS = 2, 3


def sharded(policy, layout="zero3"):
    model = gpt.make_model()
    spec = mt.spec_from_module(model, mesh={"dp": 1}, layout=layout, microbatches=M)
    return model, mt.shard(model, mfsdp.Schedule.compile(spec), backend="local",
                           offload_policy=policy)


def train(policy):
    """STEPS of AdamW on one rank: (losses, final master shards)."""
    torch.manual_seed(0)
    model, sm = sharded(policy)
    opt = torch.optim.AdamW(sm.main_parameters(), lr=3e-3, foreach=False)
    g = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(STEPS):
        for _ in range(M):
            x = torch.randint(0, 64, (2, 16), generator=g)
            loss = model(x[:, :-1], x[:, 1:])
            (loss / M).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    masters = [mp.detach().clone() for mp in sm.main_parameters()]
    assert all(mp.device.type == "cpu" for mp in sm.main_parameters())
    sm.close()
    return losses, masters


def test_noop_on_local_warns_once_and_says_why():
    offload._warned.discard("local")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, sm = sharded(mt.CPUOffloadPolicy())
        _, sm2 = sharded(True)                     # the same backend: said once
    mine = [w for w in seen if "offload_policy" in str(w.message)]
    assert len(mine) == 1 and mine[0].category is UserWarning
    assert str(mine[0].message).startswith("offload_policy on the local backend is a no-op: "
                                           "offload inactive: the local backend keeps every "
                                           "buffer in host memory already")
    assert mine[0].filename == __file__            # points at the caller's shard()
    for s in (sm, sm2):
        assert not s.offload and not s.offload.active and s.offload.requested
        assert s.offload.host_bytes == 0 and s.offload.backend == "local"
        assert "local backend keeps every buffer in host memory already" in s.offload.reason
        lib = mfsdp._lib.load()               # the arena is the plan, with the policy too
        assert lib.mfsdp_allocated_bytes(s.runtime.handle) == \
            lib.mfsdp_schedule_peak_bytes(s.schedule.handle)
        s.close()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for policy in (None, False, OffloadPolicy()):   # FSDP2's default: no offload
            _, sm = sharded(policy)
            assert not sm.offload.requested and not sm.offload.active
            assert sm.offload.reason == ("offload not requested (MFSDP_FLAG_OFFLOAD_MAIN is "
                                         "not set)")
            sm.close()
    assert not [w for w in seen if "offload_policy" in str(w.message)]


def test_training_bit_identical_with_the_policy():
    base_losses, base = train(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        losses, masters = train(mt.CPUOffloadPolicy(pin_memory=False))   # no-op on a CPU
    assert losses == base_losses
    assert len(masters) == len(base) > 0
    for a, b in zip(masters, base):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert base_losses[-1] < base_losses[0]       # it trained


def test_policy_mistakes_are_refused():
    assert mt.CPUOffloadPolicy is torch.distributed.fsdp.CPUOffloadPolicy
    cases = [(CPUOffload(offload_params=True), "is FSDP1's CPUOffload: pass FSDP2's "
                                               "torch.distributed.fsdp.CPUOffloadPolicy()"),
             (mt.CPUOffloadPolicy, "is the class: pass an instance, CPUOffloadPolicy()"),
             ("cpu", "expected torch.distributed.fsdp.CPUOffloadPolicy()")]
    for policy, msg in cases:
        with pytest.raises(mfsdp.UsageError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            sharded(policy)
    for backend in offload.GPU_BACKENDS:
        with pytest.raises(mfsdp.UsageError, match="pin_memory=False. on the %s backend: the "
                                                   "GPU reads the master weights" % backend):
            offload.requested(mt.CPUOffloadPolicy(pin_memory=False), backend)
        assert offload.requested(mt.CPUOffloadPolicy(), backend)
    assert offload.requested(mt.CPUOffloadPolicy(pin_memory=False), "mpi")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_pytorch_layout_can_offload(dtype):
    """No layout of docs/pytorch.md runs a collective on main_weight (each
    casts from it first), so a GPU backend accepts the policy for all."""
    for layout in mt.LAYOUT_NAMES:
        for mesh in ({"dp_outer": 2, "dp_inner": 2}, {"dp": 4}):
            if len(mesh) == 1 and layout in ("hsdp", "hsdp_nosync", "hfsdp", "fsdp2d"):
                continue
            spec = mt.spec_from_module(gpt.make_model(), mesh=mesh, layout=layout,
                                       microbatches=3, dtype=dtype)
            assert offload.refusing_op(mfsdp.Schedule.compile(spec)) == -1, (layout, mesh)
