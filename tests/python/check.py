"""
check: merges the ranks' results of one config and compares them with the
single-process reference: per-step losses (relative difference) and the full
final parameters (per tensor max|a - b| / max|b|, the worst tensor).
"""
import glob
import os

import torch

import train


def merge(out, name):
    """(losses averaged over ranks, {tensor: full flat fp32}, seconds) of a config."""
    files = sorted(glob.glob(os.path.join(out, name + ".rank*.pt")))
    if len(files) != train.WORLD:
        raise AssertionError("%s: %d rank results of %d in %s" % (name, len(files), train.WORLD, out))
    runs = [torch.load(f) for f in files]
    steps = len(runs[0]["losses"])
    losses = [sum(r["losses"][s] for r in runs) / len(runs) for s in range(steps)]
    full = {}
    for r in runs:
        for tname, (off, shard) in r["shards"].items():
            if tname not in full:
                full[tname] = {}
            for i, v in enumerate(shard.tolist()):
                prev = full[tname].get(off + i)
                if prev is not None and prev != v:   # replicas must be bitwise equal
                    raise AssertionError("%s: replicas of %s[%d] differ: %r vs %r" % (
                        name, tname, off + i, prev, v))
                full[tname][off + i] = v
    return losses, full, max(r["seconds"] for r in runs)


def compare(c, out):
    """(worst loss rel. error, worst parameter rel. error, seconds)."""
    name = train.config_name(c)
    losses, full, seconds = merge(out, name)
    ref_losses, ref_params = train.reference_train(c)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    param_err = 0.0
    for tname, p in ref_params.items():
        ref = p.detach().reshape(-1)
        got = full.get(tname)
        if got is None or len(got) != ref.numel():
            raise AssertionError("%s: tensor %s: %s of %d elements delivered" % (
                name, tname, 0 if got is None else len(got), ref.numel()))
        t = torch.tensor([got[i] for i in range(ref.numel())], dtype=torch.float32)
        err = ((t - ref).abs().max() / ref.abs().max()).item()
        param_err = max(param_err, err)
    return loss_err, param_err, seconds
