"""
phases_worker: one MPI rank of test_phases (mpirun -np 4, 2 x 2 mesh). For
each layout named on the command line it trains the GPT with short steps and
evaluation forwards between steps (phases.train; M = 3, steps of 3, 2, 3 and
1 microbatches) and rank 0 writes OUT/<layout>.pt: the per-step losses and
the evaluation losses averaged over the ranks, and the full final
parameters. `lifecycle` closes a runtime in the middle of a step, then
another after a refused call inside a step (`lifecycle_runtime_error`: and
one after a hook the runtime refused), then shards a fresh model in the same
processes and trains one step: OUT/lifecycle*.pt holds its full parameters.

    mpirun -np 4 python phases_worker.py OUT hsdp hfsdp zero3 lifecycle
"""
import os
import sys

import torch

import gpt
import mfsdp
import mfsdp.torch as mt
import phases
import train

torch.set_num_threads(1)
MESH, WORLD, M = train.MESH, train.WORLD, 3


def run_layout(layout, rank):
    losses, evals, sm = phases.train(layout, M, phases.PLAN, phases.EVALS, rank=rank,
                                     world=WORLD, backend="mpi", mesh=MESH, timeout_ms=60000)
    mean = [x / WORLD for x in sm.allreduce(losses + evals, "sum")]
    full = sm.full_state_dict()
    sm.close()
    return {"losses": mean[:len(losses)], "evals": mean[len(losses):], "full": full}


def shard(layout, M):
    model = gpt.make_model()
    spec = mt.spec_from_module(model, mesh=MESH, layout=layout, microbatches=M)
    return model, mt.shard(model, mfsdp.Schedule.compile(spec), backend="mpi", timeout_ms=60000)


def lifecycle(rank, runtime_error):
    X, Y = gpt.make_data(1, WORLD, 2, 2)
    model, sm = shard("hfsdp", 2)
    (model(X[0, rank, 0], Y[0, rank, 0]) / 2).backward()
    sm.close()                                           # in the middle of a step
    model, sm = shard("zero3", 2)
    (model(X[0, rank, 0], Y[0, rank, 0]) / 2).backward()
    try:
        torch.optim.SGD(sm.main_parameters(), lr=0.1).step()
        raise AssertionError("an optimizer step inside a step was not refused")
    except mfsdp.UsageError:
        pass
    sm.close()                                           # after a refused call
    if runtime_error:
        model, sm = shard("hfsdp", 2)
        try:        # a hook out of order; a peer that destroys first aborts this rank's step
            (model(X[0, rank, 0], Y[0, rank, 0]) / 2).backward()
            sm.runtime.backward_post(0, 0)
            raise AssertionError("a hook out of order was not refused")
        except mfsdp.MfsdpError:
            pass
        sm.close()                                       # after the runtime's error
    model, sm = shard("hsdp", 2)
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.1)
    for m in range(2):
        (model(X[0, rank, m], Y[0, rank, m]) / 2).backward()
    opt.step()
    full = sm.full_state_dict()
    sm.close()
    return {"full": full}


def main():
    out = sys.argv[1]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    for arg in sys.argv[2:]:
        if arg.startswith("lifecycle"):
            res = lifecycle(rank, runtime_error=arg == "lifecycle_runtime_error")
        else:
            res = run_layout(arg, rank)
        if rank == 0:
            torch.save(res, os.path.join(out, "%s.pt" % arg))


if __name__ == "__main__":
    main()
