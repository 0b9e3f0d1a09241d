"""
phases: the evaluation forwards and short steps of test_contract (one
process) and phases_worker (mpirun -np 4): a GPT trained through mfsdp with
steps of fewer microbatches than M (sm.finish_step) and evaluation forwards
between steps, and the same run in plain torch on the global batch.
"""
import torch

import gpt
import mfsdp
import mfsdp.torch as mt
import train as loops

PLAN = [3, 2, 3, 1]      # microbatches run per step (M = 3): short steps in the middle and at the end
EVALS = (-1, 0, 1, 3)    # evaluation forwards after these steps (-1: before the first)


def train(layout, M, plan, evals, rank=0, world=1, backend="local", **kw):
    """Trains the GPT through mfsdp: step s runs plan[s] microbatches (a step
    of fewer than M ends with finish_step), each loss scaled by 1/plan[s];
    after the steps in `evals` (and before the first, -1), an evaluation
    forward under no_grad (or inference_mode) on this rank's evaluation
    batch. Returns (per-step mean loss over the microbatches run, evaluation
    losses, sm)."""
    model = gpt.make_model()
    spec = mt.spec_from_module(model, mesh=kw.pop("mesh", {"dp": 1}), layout=layout,
                               microbatches=M)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec), backend=backend, **kw)
    opt = loops.make_optimizer(sm.param_groups(weight_decay=0.1), "adamw")
    X, Y = gpt.make_data(len(plan), world, M, 2)
    EX, EY = gpt.make_data(1, world, 1, 3, seed=7)
    losses, eval_losses = [], []

    def evaluate(mode):
        model.eval()
        with mode():
            eval_losses.append(model(EX[0, rank, 0], EY[0, rank, 0]).item())
        model.train()

    if -1 in evals:
        evaluate(torch.no_grad)
    for s, m_run in enumerate(plan):
        tot = 0.0
        for m in range(m_run):
            loss = model(X[s, rank, m], Y[s, rank, m])
            (loss / m_run).backward()
            tot += loss.item()
        if m_run < M:
            sm.finish_step()
        opt.step()
        opt.zero_grad()
        losses.append(tot / m_run)
        if s in evals:
            evaluate(torch.inference_mode if s % 2 else torch.no_grad)
    return losses, eval_losses, sm


def reference(M, plan, evals, world=1):
    """The same run in plain torch on the global batch (every rank's
    microbatches of the step); evaluation losses on the global evaluation
    batch."""
    model = gpt.make_model()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    opt = loops.make_optimizer([{"params": decay, "weight_decay": 0.1},
                                {"params": keep, "weight_decay": 0.0}], "adamw")
    X, Y = gpt.make_data(len(plan), world, M, 2)
    EX, EY = gpt.make_data(1, world, 1, 3, seed=7)
    losses, eval_losses = [], []

    def evaluate():
        with torch.no_grad():
            eval_losses.append(model(EX[0].reshape(-1, 16), EY[0].reshape(-1, 16)).item())

    if -1 in evals:
        evaluate()
    for s, m_run in enumerate(plan):
        x = X[s, :, :m_run].reshape(-1, 16)
        y = Y[s, :, :m_run].reshape(-1, 16)
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if s in evals:
            evaluate()
    return losses, eval_losses, dict(model.named_parameters())
