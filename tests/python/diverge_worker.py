"""
diverge_worker: one MPI rank of test_diverge (mpirun -np 4, 2 x 2 mesh, M =
2). Step 1 runs on every rank alike. In step 2 the ranks' programs differ the
way a trainer's bug makes them differ: `short` has rank 1 end its step with
sm.finish_step() after one microbatch while the others run both; `eval` has
rank 2 run an evaluation forward (torch.no_grad) between steps while the
others start the next step. Every rank writes OUT/<case>.rank<R>.json: the
error it got (class, mfsdp code name, message), the step it got it in, and
how long the step took.

    mpirun -np 4 python diverge_worker.py OUT short|eval LAYOUT
"""
import json
import os
import sys
import time

import torch

import gpt
import mfsdp
import mfsdp.torch as mt
import train

torch.set_num_threads(1)
M = 2


def microbatch(model, X, Y, rank, m):
    (model(X[0, rank, m], Y[0, rank, m]) / M).backward()


def step_two(case, model, sm, X, Y, rank):
    if case == "short" and rank == 1:
        microbatch(model, X, Y, rank, 0)
        sm.finish_step()
        return
    if case == "eval" and rank == 2:
        with torch.no_grad():
            model(X[0, rank, 0], Y[0, rank, 0])
        return
    for m in range(M):
        microbatch(model, X, Y, rank, m)


def main():
    out, case, layout = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    model = gpt.make_model()
    spec = mt.spec_from_module(model, mesh=train.MESH, layout=layout, microbatches=M)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec), backend="mpi", timeout_ms=20000)
    X, Y = gpt.make_data(1, train.WORLD, M, 2)
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.1)
    res = {"error": None, "step": None}
    t0 = time.monotonic()
    try:
        for m in range(M):
            microbatch(model, X, Y, rank, m)
        opt.step()
        res["step"] = 2
        t0 = time.monotonic()
        step_two(case, model, sm, X, Y, rank)
        res["step"] = 3
        for m in range(M):                # the next step, which must not start silently
            microbatch(model, X, Y, rank, m)
        res["step"] = None
    except mfsdp.MfsdpError as e:
        res.update(error=type(e).__name__, code=e.code_name, message=e.message)
    res["seconds"] = time.monotonic() - t0
    with open(os.path.join(out, "%s.rank%d.json" % (case, rank)), "w") as f:
        json.dump(res, f)
    try:
        sm.close()
    except mfsdp.MfsdpError:
        pass


if __name__ == "__main__":
    main()
