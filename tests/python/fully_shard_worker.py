"""
fully_shard_worker: one MPI rank of test_fully_shard.py (mpirun -np 4, 2 x 2
mesh). Trains the GPT model through mt.fully_shard for each run named on the
command line, in one launch; rank 0 writes OUT/<run>.pt with the per-step
losses (mean over ranks), the full final parameters, the loss's dtype, the
spec, the compiled units' reshard_after_forward, the schedule's peak bytes,
the step's collectives per axis (mfsdp_stats, summed over the steps) and,
summed over the ranks, how each rank's schedule was found in the cache
(MFSDP_CACHE_DIR, set by the test to a fresh directory) and how many times
it compiled.

    mpirun -np 4 python fully_shard_worker.py OUT fp32 bf16 reshard_blocks reshard_all again

Runs: fp32 (HFSDP, fp32), bf16 (torch's MixedPrecisionPolicy: bf16 params,
fp32 reduce, fp32 output), reshard_blocks (fp32 with the blocks kept
unsharded from forward to backward), reshard_all (fp32, every unit
resharded, the last too), again (fp32 once more: the cache's second call).
With `fsdp2 PORT` last, FSDP2 itself trains the bf16 run on gloo in the same
processes (OUT/fsdp2_bf16.pt: rank 0's losses, the mean over ranks).
"""
import os
import sys

import torch

import gpt
import train

torch.set_num_threads(1)
STEPS, M, B = 5, 2, 2


def config(dtype="fp32"):
    return {"layout": "hfsdp", "M": M, "opt": "adamw", "dtype": dtype, "ckpt": (),
            "clip": 0.0, "steps": STEPS, "b": B}


def bf16_policy(output=True):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if output else None)


OPTIONS = {
    "fp32": {},
    "again": {},
    "bf16": {"mp_policy": "bf16"},
    "reshard_blocks": {"reshard_after_forward": {"blocks.*": False}},
    "reshard_all": {"reshard_after_forward": True},
}


def unit_flags(text):
    """{unit: reshard_after_forward} from the compiled schedule's units list."""
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("- {name: ") and "reshard_after_forward:" in line:
            name = line[len("- {name: "):].split(",")[0]
            out[name] = "reshard_after_forward: true" in line
    return out


def run(name, rank, out):
    import mfsdp._lib as lib
    import mfsdp.torch as mt
    from mfsdp.torch.fully_shard import cache_stats
    kw = dict(OPTIONS[name])
    if kw.get("mp_policy") == "bf16":
        kw["mp_policy"] = bf16_policy()
    compiles = cache_stats["compiles"]
    model = gpt.make_model()
    sm = mt.fully_shard(model, mesh=train.MESH, layout="hfsdp", microbatches=M,
                        backend="mpi", timeout_ms=60000, **kw)
    opt = train.make_optimizer(sm.main_parameters(), "adamw")
    X, Y = train.data(config())
    before = sm.stats()
    losses, dtypes = [], set()
    for s in range(STEPS):
        tot = 0.0
        for m in range(M):
            loss = sm(X[s, rank, m], Y[s, rank, m])
            dtypes.add(str(loss.dtype))
            (loss / M).backward()
            tot += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(sm.mean_over_ranks(tot / M))
    st = sm.stats() - before
    full = sm.full_state_dict()
    hits, compiled = sm.allreduce([float(sm.cache_status == "hit"),
                                   float(cache_stats["compiles"] - compiles)], "sum")
    facts = {(t.weight_dtype, t.grad_dtype, t.main_weight_dtype) for t in sm.schedule.tensors}
    res = {"losses": losses, "full": full, "dtypes": sorted(dtypes), "spec": sm.spec,
           "units": unit_flags(sm.schedule.text), "collectives": list(st.collectives),
           "peak": int(lib.load().mfsdp_schedule_peak_bytes(sm.schedule.handle)),
           "hits": int(hits), "compiles": int(compiled), "facts": sorted(facts)}
    sm.close()
    if rank == 0:
        torch.save(res, os.path.join(out, name + ".pt"))


def fsdp2_bf16(rank, port, out):
    """FSDP2 with the same MixedPrecisionPolicy on gloo: per block, then the root;
    output_dtype on the root only (FSDP2 casts every FSDP module's output, so a
    block's fp32 output would reach the root's bf16 ln_f), which is where mfsdp
    applies it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=train.WORLD)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_outer", "dp_inner"))
    model = gpt.make_model()
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, mp_policy=bf16_policy(output=False))
    fully_shard(model, mesh=mesh, mp_policy=bf16_policy())
    opt = train.make_optimizer(model.parameters(), "adamw")
    X, Y = train.data(config())
    losses = []
    for s in range(STEPS):
        tot = 0.0
        for m in range(M):
            loss = model(X[s, rank, m], Y[s, rank, m])
            (loss / M).backward()
            tot += loss.item()
        opt.step()
        opt.zero_grad()
        t = torch.tensor([tot / M], dtype=torch.float64)
        dist.all_reduce(t)
        losses.append(t.item() / train.WORLD)
    full = {n: p.full_tensor().detach().float() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"losses": losses, "full": full}, os.path.join(out, "fsdp2_bf16.pt"))
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    args = sys.argv[2:]
    if "fsdp2" in args:
        port = args[args.index("fsdp2") + 1]
        args = args[:args.index("fsdp2")]
    else:
        port = None
    for name in args:
        run(name, rank, out)
    if port:
        fsdp2_bf16(rank, port, out)


if __name__ == "__main__":
    main()
