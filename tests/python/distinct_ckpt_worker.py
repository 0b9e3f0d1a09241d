"""
distinct_ckpt_worker: one MPI rank of test_distinct_ckpt.py: native
checkpoints (sm.save_checkpoint / load_checkpoint) of models whose tensors
are Distinct on a mesh axis (issue #42 item 2), the models of
distinct_worker.py: the TP = 2 x DP = 2 column/row MLP (w1 global name split
0, w2 split 1) and the EP = 2 x DP = 2 top-1 MoE (experts renamed).

    mpirun -np 4 python distinct_ckpt_worker.py OUT PORT save
    mpirun -np 2 python distinct_ckpt_worker.py OUT PORT reload2

save (4 ranks), per kind (tp, moe): SAVE_AT steps with Adam, then
save_checkpoint(OUT/ckpt_<kind>, opt) (the master weights, exp_avg and
exp_avg_sq under global names), then one more step (the uninterrupted run);
a fresh sharded model of other values with a fresh Adam loads the checkpoint
and takes the same step. Rank r writes OUT/<kind>.rank<r>.pt: its master
shards and optimizer states at the save and after the load (name -> (offset,
tensor)), the last step's loss and shards of both runs, and the refusals:
the model without global names (save_checkpoint) and a TP = 4 model loading
the TP = 2 checkpoint (load_checkpoint).
reload2 (2 ranks: tp or ep = 2 x dp = 1): a fresh model loads each
checkpoint (tp's load staged, as on a GPU: MFSDP_CKPT_STAGE=1);
OUT/reload2_<kind>.rank<r>.pt: its shards and optimizer states.
"""
import os
import sys

import torch
import torch.distributed as dist

import distinct_worker as dw
import mfsdp
import mfsdp.torch as mt

torch.set_num_threads(1)
SAVE_AT = 2          # steps before the save; one more after it
LR = 0.01
STATES = ("exp_avg", "exp_avg_sq")


def fresh(kind, rank, dp, named=True):
    """This rank's model (other values than the saved ones: + 0.5) sharded on
    dp data-parallel ranks, and a fresh Adam over its main parameters."""
    model = dw.local_model(kind, [rank // dp, rank % dp], None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    sm = dw.sharded(kind, model, named=named, dp=dp)
    return sm, model, torch.optim.Adam(sm.main_parameters(), lr=LR, foreach=False)


def snapshot(sm, opt):
    """({name: (offset, master shard)}, {state: {name: (offset, state shard)}})."""
    shards = {n: (off, mp.detach().clone().reshape(-1)) for n, off, mp in sm.shards()}
    states = {key: {n: (off, opt.state[mp][key].detach().clone().reshape(-1))
                    for n, off, mp in sm.shards() if mp in opt.state} for key in STATES}
    return shards, states


def step(sm, model, opt, kind, rank, s):
    """Training step s (distinct_worker's data), clipped as distinct_worker
    does; returns the loss (mean over ranks)."""
    X, Y = dw.data(kind)
    d = rank if kind == "moe" else rank % 2
    tot = 0.0
    for m in range(dw.M):
        loss = model(X[s, d, m], Y[s, d, m]) / dw.M
        loss.backward()
        tot += loss.item()
    sm.clip_grad_norm_(dw.CLIP)
    opt.step()
    opt.zero_grad()
    return sm.mean_over_ranks(tot)


def refusal(call):
    try:
        call()
        return None
    except mfsdp.UsageError as e:
        return str(e)


def tp4_load(path, rank):
    """A TP = 4 MLP (w1, w2 split over tp = 4 x dp = 1) loading the TP = 2
    checkpoint: the message of its refusal."""
    model = dw.TPModel(4, None)
    sm = mt.fully_shard(model, mesh={"tp": 4, "dp": 1}, layout="fsdp2d", microbatches=dw.M,
                        distinct={"blocks.*.w1.*": "tp", "blocks.*.w2.*": "tp"},
                        global_names=dw.global_names("tp"), tensor_axes=("tp",),
                        timeout_ms=60000, cache=False)
    try:
        sm.load_checkpoint(path)
        return None
    except mfsdp.MfsdpError as e:
        return str(e)
    finally:
        sm.close()


def save(out, rank, kind):
    path = os.path.join(out, "ckpt_%s" % kind)
    model = dw.local_model(kind, [rank // 2, rank % 2], None)
    sm = dw.sharded(kind, model)
    opt = torch.optim.Adam(sm.main_parameters(), lr=LR, foreach=False)
    for s in range(SAVE_AT):
        step(sm, model, opt, kind, rank, s)
    res = {"coords": list(sm.runtime.coords)}
    sm.save_checkpoint(path, opt)
    res["saved"] = snapshot(sm, opt)
    res["loss"] = step(sm, model, opt, kind, rank, SAVE_AT)
    res["after"] = snapshot(sm, opt)
    sm.close()
    sm, model, opt = fresh(kind, rank, 2)
    res["load_step"] = sm.load_checkpoint(path, opt)[0]
    res["loaded"] = snapshot(sm, opt)
    res["loss2"] = step(sm, model, opt, kind, rank, SAVE_AT)
    res["after2"] = snapshot(sm, opt)
    sm.close()
    sm, _, opt = fresh(kind, rank, 2, named=False)
    res["unnamed"] = refusal(lambda: sm.save_checkpoint(os.path.join(out, "never_%s" % kind),
                                                        opt))
    sm.close()
    res["never_exists"] = os.path.exists(os.path.join(out, "never_%s" % kind))
    if kind == "tp":
        res["tp4"] = tp4_load(path, rank)
    torch.save(res, os.path.join(out, "%s.rank%d.pt" % (kind, rank)))


def reload2(out, rank, kind):
    """The tp load staged (MFSDP_CKPT_STAGE=1: the buffers touched only
    through the backend's stage hook, as on a GPU; every rank reads all it
    holds, w2's slice row by row), the moe load shared among replicas."""
    sm, _, opt = fresh(kind, rank, 1)
    os.environ["MFSDP_CKPT_STAGE"] = "1" if kind == "tp" else "0"
    try:
        sm.load_checkpoint(os.path.join(out, "ckpt_%s" % kind), opt)
    finally:
        del os.environ["MFSDP_CKPT_STAGE"]
    res = {"coords": list(sm.runtime.coords), "loaded": snapshot(sm, opt)}
    sm.close()
    torch.save(res, os.path.join(out, "reload2_%s.rank%d.pt" % (kind, rank)))


def main():
    out, port, what = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "4")))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=world)
    for kind in ("tp", "moe"):
        (save if what == "save" else reload2)(out, rank, kind)
        if rank == 0:
            print("%s %s: done" % (what, kind), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
