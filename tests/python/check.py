"""
check: reads one config's result (written by rank 0 of parity_worker.py) and
compares it with the single-process reference: per-step losses and gradient
norms (relative difference) and the full final parameters (per tensor
max|a - b| / max|b|, the worst tensor).
"""
import os

import torch

import train


def load(out, name):
    """(losses averaged over ranks, {tensor: full fp32 tensor}, seconds, norms)
    of a config; fails when the ranks' replicas differed or the rank-0-only
    gather disagreed with the all-ranks one."""
    path = os.path.join(out, name + ".pt")
    if not os.path.exists(path):
        raise AssertionError("%s: no result in %s" % (name, out))
    r = torch.load(path)
    if r["replica_mismatches"]:          # replicas must be bitwise equal
        raise AssertionError("%s: %d master-weight elements differ between replicas" % (
            name, r["replica_mismatches"]))
    if r["rank0_only_mismatches"]:
        raise AssertionError("%s: full_state_dict(rank0_only=True) differs from the all-ranks "
                             "gather in %d elements" % (name, r["rank0_only_mismatches"]))
    return r["losses"], r["full"], r["seconds"], r["norms"]


def rel_err(a, b):
    return max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=0.0)


def compare(c, out):
    """(worst loss rel. error, worst parameter rel. error, seconds, worst norm
    rel. error, reference norms)."""
    name = train.config_name(c)
    losses, full, seconds, norms = load(out, name)
    ref_losses, ref_params, ref_norms = train.reference_train(c)
    if len(losses) != len(ref_losses) or len(norms) != len(ref_norms):
        raise AssertionError("%s: %d losses and %d norms, the reference has %d and %d" % (
            name, len(losses), len(norms), len(ref_losses), len(ref_norms)))
    if set(full) != set(ref_params):
        raise AssertionError("%s: full_state_dict has %s, the reference %s" % (
            name, sorted(full), sorted(ref_params)))
    param_err = 0.0
    for tname, p in ref_params.items():
        ref = p.detach()
        got = full.get(tname)
        if got is None or got.shape != ref.shape:
            raise AssertionError("%s: tensor %s: %s delivered, shape %s expected" % (
                name, tname, None if got is None else list(got.shape), list(ref.shape)))
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        param_err = max(param_err, err)
    return (rel_err(losses, ref_losses), param_err, seconds, rel_err(norms, ref_norms),
            ref_norms)
