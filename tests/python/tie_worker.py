"""
tie_worker: one MPI rank of test_ties.py's parity runs (mpirun -np 4, the
2 x 2 mesh of train.py). Each config trains a tied model of tied_models.py
through mfsdp hsdp for STEPS steps and rank 0 writes OUT/<name>.pt with the
per-step losses (mean over ranks) and the full final parameters;
test_ties.py compares them with single-process torch (reference() below).
The optimizer is SGD with momentum, whose step is proportional to the
gradient (AdamW turns rounding noise in near-zero gradients into lr-sized
steps, 4e-4 relative here). A run refused with mfsdp.UsageError writes
{"error": message} instead.

    mpirun -np 4 python tie_worker.py OUT byuse:traced init:SPEC:CKPT byuse:untraced

  byuse:traced    ByUse, spec_from_module(..., example=first microbatch)
  byuse:untraced  ByUse, spec_from_module without it (the tie is not found)
  init:SPEC:CKPT  GPT2, the spec file SPEC (from `mfsdpc init CKPT`), the
                  weights loaded from the safetensors file CKPT
"""
import os
import sys

import torch

import gpt
import tied_models
import train

torch.set_num_threads(1)
STEPS, M, B = 4, 1, 2
OPT = "sgd"     # its step is proportional to the gradient: a wrong one shows


def data():
    return gpt.make_data(STEPS, train.WORLD, M, B)


def reference(kind, weights=None):
    """Single-process training on the global batch: (losses, {name: parameter})."""
    model = tied_models.make(kind)
    if weights:
        from safetensors.torch import load_model
        load_model(model, weights)
    opt = train.make_optimizer(model.parameters(), OPT)
    X, Y = data()
    x, y = X.reshape(STEPS, -1, X.shape[-1]), Y.reshape(STEPS, -1, Y.shape[-1])
    losses = []
    for s in range(STEPS):
        loss = model(x[s], y[s])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, dict(model.named_parameters())


def build(arg, X, Y):
    """(model, spec text) of a config."""
    import mfsdp.torch as mt
    kind, how, *rest = arg.split(":")
    if kind == "byuse":
        model = tied_models.make("byuse")
        example = (X[0, 0, 0], Y[0, 0, 0]) if how == "traced" else None
        return model, mt.spec_from_module(model, mesh=train.MESH, layout="hsdp", microbatches=M,
                                          example=example)
    from safetensors.torch import load_model
    model = tied_models.make("gpt2", seed=7)      # other values: the checkpoint's must win
    load_model(model, rest[0])
    with open(how) as f:
        return model, f.read()


def run(arg, rank):
    import mfsdp
    import mfsdp.torch as mt
    X, Y = data()
    model, spec = build(arg, X, Y)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec, name="ties"), backend="mpi",
                  timeout_ms=60000)
    opt = train.make_optimizer(sm.main_parameters(), OPT)
    losses = []
    try:
        for s in range(STEPS):
            loss = model(X[s, rank, 0], Y[s, rank, 0])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(sm.mean_over_ranks(loss.item()))
    except mfsdp.UsageError as e:    # every rank reads the same weight outside its window
        sm.close()
        return {"error": str(e)}
    full = sm.full_state_dict(rank0_only=True)
    sm.close()
    return {"losses": losses, "full": full}


def result_name(arg):
    return arg.split(":")[0] + ("_" + arg.split(":")[1] if arg.startswith("byuse") else "")


def main():
    out = sys.argv[1]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    for arg in sys.argv[2:]:
        res = run(arg, rank)
        if rank == 0:
            torch.save(res, os.path.join(out, result_name(arg) + ".pt"))


if __name__ == "__main__":
    main()
