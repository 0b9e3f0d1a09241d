"""
fsdp2_worker: one rank of the same GPT training under PyTorch FSDP2
(fully_shard on a 2-D DeviceMesh over gloo: replicate on dp_outer, shard on
dp_inner = HSDP). Launched by mpirun -np 4 (ranks from Open MPI's
environment, rendezvous on 127.0.0.1). Writes OUT/fsdp2_<variant>_M<M>.rank<r>.pt
with this rank's per-step losses.

    mpirun -np 4 python fsdp2_worker.py OUT PORT VARIANT:M... (VARIANT hsdp | hsdp_nosync)
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import gpt
import train

torch.set_num_threads(1)


def build(mesh, ckpt=()):
    model = gpt.make_model(checkpoint=ckpt)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)    # the root holds the tied embedding / LM head
    return model


def main():
    out, port = sys.argv[1], sys.argv[2]
    steps = int(os.environ.get("MFSDP_TEST_STEPS", "10"))
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_outer", "dp_inner"))
    for arg in sys.argv[3:]:
        variant, M = arg.split(":")
        run(out, mesh, rank, variant, int(M), steps)
    dist.destroy_process_group()


def run(out, mesh, rank, variant, M, steps):
    model = build(mesh)
    opt = train.make_optimizer(model.parameters(), "adamw")
    c = {"steps": steps, "M": M, "b": 2}
    X, Y = train.data(c)
    losses = []
    t0 = time.perf_counter()
    for s in range(steps):
        tot = 0.0
        for m in range(M):
            if variant == "hsdp_nosync":
                model.set_requires_all_reduce(m == M - 1)
            loss = model(X[s, rank, m], Y[s, rank, m])
            (loss / M).backward()
            tot += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(tot / M)
    torch.save({"losses": losses, "seconds": time.perf_counter() - t0},
               os.path.join(out, "fsdp2_%s_M%d.rank%d.pt" % (variant, M, rank)))


if __name__ == "__main__":
    main()
