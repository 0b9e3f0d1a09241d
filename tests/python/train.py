"""
train: the training loops the Python tests compare, one module so that the
mfsdp run, the single-process reference and FSDP2 run the same steps.

A config is a dict: layout, M (microbatches), opt ("adamw" | "sgd"), dtype
("fp32" | "bf16"), ckpt (block indices under activation checkpointing),
clip (> 0: clip the global gradient norm to it before each optimizer step,
else 0), steps, b (samples per rank per microbatch). The global batch of a step is
every rank's M microbatches of b samples.
"""
import torch

import gpt

MESH = {"dp_outer": 2, "dp_inner": 2}
WORLD = 4
LR = {"adamw": 3e-3, "sgd": 0.05}


def config_name(c):
    return "%s_M%d_%s_%s%s%s" % (c["layout"], c["M"], c["opt"], c["dtype"],
                                 "_ckpt" if c.get("ckpt") else "",
                                 "_clip%g" % c["clip"] if c.get("clip") else "") + (
                                     "_offload" if c.get("offload") else "")


def make_optimizer(params, opt):
    if opt == "adamw":
        return torch.optim.AdamW(params, lr=LR[opt], weight_decay=0.1, foreach=False)
    return torch.optim.SGD(params, lr=LR[opt], momentum=0.9, foreach=False)


def data(c):
    return gpt.make_data(c["steps"], WORLD, c["M"], c["b"])


def mfsdp_train(c, rank, backend="mpi", timeout_ms=60000):
    """Trains on this rank; returns (per-step loss: the mean over microbatches
    and ranks, per-step gradient norm before clipping (empty without clip),
    sharded model)."""
    import mfsdp
    import mfsdp.torch as mt
    model = gpt.make_model(checkpoint=c.get("ckpt", ()))
    spec = mt.spec_from_module(model, mesh=MESH, layout=c["layout"], microbatches=c["M"],
                               dtype=c["dtype"])
    sm = mt.shard(model, mfsdp.Schedule.compile(spec, name=config_name(c)), backend=backend,
                  timeout_ms=timeout_ms,
                  offload_policy=mt.CPUOffloadPolicy() if c.get("offload") else None)
    opt = make_optimizer(sm.main_parameters(), c["opt"])
    X, Y = data(c)
    losses, norms = [], []
    for s in range(c["steps"]):
        tot = 0.0
        for m in range(c["M"]):
            loss = model(X[s, rank, m], Y[s, rank, m])
            (loss / c["M"]).backward()
            tot += loss.item()
        if c.get("clip"):
            norms.append(sm.clip_grad_norm_(c["clip"]).item())
        opt.step()
        opt.zero_grad()
        losses.append(sm.mean_over_ranks(tot / c["M"]))
    return losses, norms, sm


def reference_train(c):
    """Single-process training on the global batch; bf16 compute casts a copy
    of the fp32 master weights each step, as mfsdp's T1 does. Returns (losses,
    {name: parameter}, per-step gradient norms before clipping)."""
    master = gpt.make_model(checkpoint=c.get("ckpt", ()))
    opt = make_optimizer(master.parameters(), c["opt"])
    X, Y = data(c)
    x = X.reshape(c["steps"], -1, X.shape[-1])
    y = Y.reshape(c["steps"], -1, Y.shape[-1])
    losses, norms = [], []
    for s in range(c["steps"]):
        if c["dtype"] == "fp32":
            loss = master(x[s], y[s])
            loss.backward()
        else:
            work = gpt.make_model(checkpoint=c.get("ckpt", ()))
            with torch.no_grad():
                for pw, pm in zip(work.parameters(), master.parameters()):
                    pw.data = pm.detach().to(torch.bfloat16)
            loss = work(x[s], y[s])
            loss.backward()
            for pw, pm in zip(work.parameters(), master.parameters()):
                pm.grad = pw.grad.float()
        losses.append(loss.item())
        if c.get("clip"):
            norms.append(torch.nn.utils.clip_grad_norm_(master.parameters(), c["clip"]).item())
        opt.step()
        opt.zero_grad()
    return losses, dict(master.named_parameters()), norms
