"""
dead_rank_worker: one MPI rank of the dead-rank test. Every rank trains the
GPT model through mfsdp (hfsdp, timeout 2 s); rank 2 stops calling hooks after
the first step (it sleeps, as a hung or dead peer would look to the others).
Each rank writes OUT/rank<r>.txt: "ok" or "<code name>: <message>" of the
MfsdpError it got (rank 2 may be ended by mpirun before it reports).
"""
import os
import sys
import time

import torch

import gpt
import mfsdp
import mfsdp._mpi
import mfsdp.torch as mt
import train

torch.set_num_threads(1)


def main():
    out = sys.argv[1]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    model = gpt.make_model()
    spec = mt.spec_from_module(model, mesh=train.MESH, layout="hfsdp", microbatches=1)
    sched = mfsdp.Schedule.compile(spec)
    X, Y = gpt.make_data(3, 4, 1, 2)
    result = "ok"
    sm = None
    mfsdp._mpi.barrier()     # the ranks start together: create's own wait is 2 s too
    try:
        sm = mt.shard(model, sched, backend="mpi", timeout_ms=2000)
        opt = train.make_optimizer(sm.main_parameters(), "sgd")
        for s in range(3):
            if rank == 2 and s == 1:
                time.sleep(6)          # the stopped rank: its peers must not hang
            model(X[s, rank, 0], Y[s, rank, 0]).backward()
            opt.step()
            opt.zero_grad()
    except mfsdp.MfsdpError as e:
        result = "%s: %s" % (e.code_name, e.message)
    with open(os.path.join(out, "rank%d.txt" % rank), "w") as f:
        f.write(result)
    if sm is not None:
        sm.close()


if __name__ == "__main__":
    main()
