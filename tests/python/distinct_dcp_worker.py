"""
distinct_dcp_worker: one MPI rank of test_distinct_dcp.py: DCP checkpoints
with the optimizer of models whose tensors are Distinct on a mesh axis
(issue #42 item 2), the models of distinct_worker.py (imported, not edited).

    mpirun -np 4 python distinct_dcp_worker.py OUT PORT          # "save"
    mpirun -np 2 python distinct_dcp_worker.py OUT PORT resume2  # dp = 1

save (4 ranks), for kind in tp (TP = 2 x DP = 2, w1 split 0, w2 split 1)
and moe (EP = 2 x DP = 2, experts renamed), an Adam optimizer (its 0-d
`step` and two moments per parameter) over sm.main_parameters():
  - K steps, then sm.save_dcp(OUT/dcp_<kind>, opt), global_state.gather
    (full_state_dict's assembly of whole global tensors) made to fail
    meanwhile (the ranks' own master and optimizer shards after them in
    OUT/<kind>.rank<r>.pt: "shards", "opt_shards"; "saved":
    full_state_dict), then R more steps: the
    uninterrupted run ("run": losses, master shards after each step,
    full_state_dict after the last);
  - a fresh sharded model of other values and a fresh Adam given the
    checkpoint by sm.load_dcp(path, opt), then R steps ("resumed");
  - the same checkpoint loaded into the model sharded with tp = 4 / ep = 4
    (dp = 1): load_dcp's refusal ("other_size": the message).
and moe_skip: moe whose global expert dw.MASKED no token reaches from the
first step on (skipped, so it never has a gradient nor Adam state): the
same save and resume, without the other size.
resume2 (2 ranks, tp = 2 / ep = 2, dp = 1): load_dcp(OUT/dcp_<kind>, opt)
into a fresh model, R steps on the same global batches (each microbatch
the two former data-parallel ranks' concatenated): OUT/resume2_<kind>.rank<r>.pt,
and save_dcp(OUT/dcp2_<kind>, opt) after them.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import distinct_worker as dw
import mfsdp
import mfsdp.torch as mt
from mfsdp.torch import global_state

torch.set_num_threads(1)
K, R = 2, 2          # steps before the save, steps after it
LR = 0.01
EPS = 1e-3


def data(kind):
    """X, Y of [K + R, data-parallel rank, M, TOKENS, D] (distinct_worker.data's
    layout: 2 dp coordinates for tp, 4 ranks for moe)."""
    g = torch.Generator().manual_seed(23)
    n = 2 if kind == "tp" else 4                 # moe, moe_skip: every rank its own
    x = torch.randn(K + R, n, dw.M, dw.TOKENS, dw.D, generator=g)
    return x, torch.randn(K + R, n, dw.M, dw.TOKENS, dw.D, generator=g)


def batch(kind, rank, world, s, m):
    """This rank's microbatch m of step s: on 4 ranks its own; on 2 (dp = 1)
    the two data-parallel ranks' it stands for, concatenated (the same mean)."""
    X, Y = data(kind)
    moe = kind.startswith("moe")
    if world == 4:
        d = rank if moe else rank % 2
        return X[s, d, m], Y[s, d, m]
    ds = [2 * rank, 2 * rank + 1] if moe else [0, 1]
    return torch.cat([X[s, d, m] for d in ds]), torch.cat([Y[s, d, m] for d in ds])


def adam_of(params):
    """Adam with eps above the gradients' scale: its step is then smooth in
    the gradient (m / (sqrt(v) + eps) of a near-zero gradient would turn the
    fp32 rounding of a sum into a whole lr-sized step, and no comparison
    with one process could hold at 1e-6)."""
    return torch.optim.Adam(params, lr=LR, eps=EPS, foreach=False)


def adam(sm):
    return adam_of(sm.main_parameters())


def steps(sm, model, opt, kind, rank, world, first, count, res):
    """Steps first .. first + count - 1: res' losses, master shards after
    each step ("params": name -> (offset, values)) and the full_state_dict
    after the last ("full")."""
    for s in range(first, first + count):
        tot = 0.0
        for m in range(dw.M):
            x, y = batch(kind, rank, world, s, m)
            loss = model(x, y) / dw.M
            loss.backward()
            tot += loss.item()
        opt.step()
        opt.zero_grad()
        res["losses"].append(sm.mean_over_ranks(tot))
        res["params"].append({n: (off, p.detach().clone()) for n, off, p in sm.shards()})
    res["full"] = sm.full_state_dict(rank0_only=False)


def fresh(kind, rank, dp):
    """A sharded model of other values (every tensor + 0.5) and its Adam."""
    model = dw.local_model(kind, [rank // dp, rank % dp], None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    sm = dw.sharded(kind, model, dp=dp)
    mask(model, kind)
    return sm, model, adam(sm)


def mask(model, kind):
    """moe_skip: global expert dw.MASKED gets no token from the first step
    on (dw.MoEModel(skip=True) then skips it): no gradient, so no Adam state."""
    if kind == "moe_skip":
        model.moe.masked = (dw.MASKED,)


def shards_of(sm, opt):
    """{tensor name: (shard offset, master shard)}, {tensor name: {state key: value}}."""
    params = {n: (off, p.detach().clone()) for n, off, p in sm.shards()}
    state = {}
    for name, mp, _, _ in sm._main:
        if opt.state.get(mp):
            state[name] = {k: v.detach().clone().reshape(-1) if v.dim() else v.detach().clone()
                           for k, v in opt.state[mp].items()}
    return params, state


def other_size(kind, rank, path):
    """The checkpoint loaded into the model with tp = 4 / ep = 4 (dp = 1): the
    message of load_dcp's refusal, None if it loaded."""
    moe = kind == "moe"
    model = dw.MoEModel(4) if moe else dw.TPModel(4)
    names = ({"moe.experts.*": mt.expert_names("moe.experts.{}", dw.E // 4, "ep")} if moe
             else {"blocks.*.w1.*": mt.split(0), "blocks.*.w2.*": mt.split(1)})
    distinct = ({"moe.experts.*": "ep"} if moe
                else {"blocks.*.w1.*": "tp", "blocks.*.w2.*": "tp"})
    sm = mt.fully_shard(model, mesh={"ep" if moe else "tp": 4, "dp": 1},
                        layout="hfsdp" if moe else "fsdp2d", microbatches=dw.M,
                        distinct=distinct, global_names=names,
                        expert_axes=("ep",) if moe else (), tensor_axes=() if moe else ("tp",),
                        units=["embed", "moe", "head"] if moe else None,
                        timeout_ms=60000, cache=False)
    opt = adam(sm)
    try:
        sm.load_dcp(path, opt)
        msg = None
    except mfsdp.UsageError as e:
        msg = str(e)
    sm.close()
    return msg


def no_gather(*args, **kwargs):
    raise AssertionError("save_dcp gathered the Distinct tensors (global_state.gather)")


def save(out, rank, kind):
    path = os.path.join(out, "dcp_%s" % kind)
    model = dw.local_model(kind, [rank // 2, rank % 2], None)
    sm = dw.sharded(kind, model)
    mask(model, kind)
    opt = adam(sm)
    res = {"coords": list(sm.runtime.coords), "run": {"losses": [], "params": []}}
    steps(sm, model, opt, kind, rank, 4, 0, K, res["run"])
    gather, global_state.gather = global_state.gather, no_gather
    try:                      # the save assembles no global tensor anywhere
        sm.save_dcp(path, opt)
    finally:
        global_state.gather = gather
    res["saved"] = res["run"]["full"]              # the weights it saved
    res["shards"], res["opt_shards"] = shards_of(sm, opt)
    steps(sm, model, opt, kind, rank, 4, K, R, res["run"])
    sm.close()
    sm, model, opt = fresh(kind, rank, 2)
    sm.load_dcp(path, opt)
    res["resumed"] = {"losses": [], "params": []}
    steps(sm, model, opt, kind, rank, 4, K, R, res["resumed"])
    sm.close()
    if kind != "moe_skip":
        res["other_size"] = other_size(kind, rank, path)
    torch.save(res, os.path.join(out, "%s.rank%d.pt" % (kind, rank)))


def resume2(out, rank, kind):
    sm, model, opt = fresh(kind, rank, 1)
    sm.load_dcp(os.path.join(out, "dcp_%s" % kind), opt)
    res = {"losses": [], "params": []}
    steps(sm, model, opt, kind, rank, 2, K, R, res)
    sm.save_dcp(os.path.join(out, "dcp2_%s" % kind), opt)
    sm.close()
    torch.save(res, os.path.join(out, "resume2_%s.rank%d.pt" % (kind, rank)))


def main():
    out, port = sys.argv[1], sys.argv[2]
    what = sys.argv[3] if len(sys.argv) > 3 else "save"
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "4")))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=world)
    for kind in ("tp", "moe", "moe_skip") if what == "save" else ("tp", "moe"):
        t0 = time.time()
        (save if what == "save" else resume2)(out, rank, kind)
        if rank == 0:
            print("%s %s: done in %.1f s" % (what, kind, time.time() - t0), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
