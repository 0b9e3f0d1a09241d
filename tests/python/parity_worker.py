"""
parity_worker: one MPI rank of the parity runs (mpirun -np 4). For each
config named on the command line it trains through mfsdp; rank 0 writes
OUT/<config>.pt with the per-step losses averaged over the ranks
(ShardedModel.mean_over_ranks), the gradient norms of clipped configs, the
full final parameters gathered from every rank's shards (full_state_dict) and
two checks made on the ranks: replicas (every rank's master shards against
the gathered tensors, bitwise) and the rank-0-only gather. The checker
(test_parity.py) compares that with the single-process reference.

    mpirun -np 4 python parity_worker.py OUT hfsdp:3:adamw:fp32 roundtrip ...

A config is layout:M:opt:dtype[:ckpt blocks[:clip[:offload]]]; `roundtrip` is the
state-dict round trip across two layouts (no training; OUT/roundtrip.pt).
"""
import os
import sys
import time

import torch

import gpt
import train

torch.set_num_threads(1)


def parse(arg):
    layout, M, opt, dtype, *rest = arg.split(":")
    ckpt = tuple(int(i) for i in rest[0].split(",")) if rest and rest[0] else ()
    clip = float(rest[1]) if len(rest) > 1 and rest[1] else 0.0
    offload = len(rest) > 2 and rest[2] == "offload"   # offload_policy=CPUOffloadPolicy()
    return {"layout": layout, "M": int(M), "opt": opt, "dtype": dtype, "ckpt": ckpt,
            "clip": clip, "steps": int(os.environ.get("MFSDP_TEST_STEPS", "10")), "b": 2,
            "offload": offload}


def _bitwise_diffs(a, b):
    """Number of elements where tensors a and b differ bitwise (NaN-safe)."""
    return int((a.reshape(-1).view(torch.int32) != b.reshape(-1).view(torch.int32)).sum())


def gathered(sm):
    """(full parameters on rank 0 else None, replica mismatches over the world,
    rank-0-only gather mismatches over the world)."""
    full = sm.full_state_dict(rank0_only=False)
    bad = 0
    for n, off, mp in sm.shards():      # this rank's shards must be what the gather chose
        bad += _bitwise_diffs(full[n].reshape(-1)[off:off + mp.numel()], mp.detach())
    root = sm.full_state_dict(rank0_only=True)
    if sm.runtime.rank == 0:
        bad0 = int(set(root) != set(full)) + sum(_bitwise_diffs(root[n], full[n]) for n in full)
    else:
        bad0 = len(root)                # the other ranks receive nothing
    bad, bad0 = sm.allreduce([bad, bad0], "sum")
    return (full if sm.runtime.rank == 0 else None), int(bad), int(bad0)


def roundtrip(rank):
    """A full state dict of random values (with the tied LM head's alias key)
    loaded into an HFSDP model, gathered, loaded into a ZeRO-3 model, gathered
    again: returns the bitwise mismatches at each stage (summed over ranks)."""
    import mfsdp
    import mfsdp.torch as mt
    ref = gpt.make_model()
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    sd = ref.state_dict()
    out = {}
    for layout in ("hfsdp", "zero3"):
        model = gpt.make_model()
        spec = mt.spec_from_module(model, mesh=train.MESH, layout=layout, microbatches=1)
        sm = mt.shard(model, mfsdp.Schedule.compile(spec, name="rt_" + layout), backend="mpi",
                      timeout_ms=60000)
        sm.load_full_state_dict(sd)
        shard_bad = sum(_bitwise_diffs(sd[n].reshape(-1)[off:off + mp.numel()], mp.detach())
                        for n, off, mp in sm.shards())
        full, replica_bad, root_bad = gathered(sm)
        full = sm.full_state_dict(rank0_only=False)
        bad = sum(_bitwise_diffs(full[n], sd[n]) for n in full)
        out[layout] = [int(x) for x in sm.allreduce([shard_bad, bad], "sum")] + [
            replica_bad, root_bad, len(full)]
        sd = full                           # the next layout loads what this one gathered
        sm.close()
    return out


def main():
    out = sys.argv[1]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    for arg in sys.argv[2:]:
        if arg == "roundtrip":
            res = roundtrip(rank)
            if rank == 0:
                torch.save(res, os.path.join(out, "roundtrip.pt"))
            continue
        c = parse(arg)
        t0 = time.perf_counter()
        losses, norms, sm = train.mfsdp_train(c, rank)
        full, replica_bad, root_bad = gathered(sm)
        seconds = sm.allreduce(time.perf_counter() - t0, "max")
        offload = (sm.offload.active, sm.offload.host_bytes, sm.offload.reason)
        sm.close()
        if rank == 0:
            torch.save({"config": c, "losses": losses, "norms": norms, "full": full,
                        "replica_mismatches": replica_bad, "rank0_only_mismatches": root_bad,
                        "seconds": seconds, "offload": offload},
                       os.path.join(out, "%s.pt" % train.config_name(c)))


if __name__ == "__main__":
    main()
