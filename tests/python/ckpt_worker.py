"""
ckpt_worker: one MPI rank of the checkpoint tests (test_checkpoint.py,
mpirun -np 4). Trains the GPT model through mfsdp.torch with AdamW from step
START to STOP of a TOTAL-step run, optionally resuming from a checkpoint
first (in this fresh process, from a model initialised with another seed, so
only the load can make it right) and saving one at the end, then writes
OUT/rank<r>.pt: the per-step losses and, per tensor, this rank's shard
offset, master shard, Adam moments and step.

    mpirun -np 4 python ckpt_worker.py OUT LAYOUT MESH START STOP TOTAL [--load DIR] [--save DIR]
                                       [+ OUT LAYOUT MESH ...]...

MESH is "dp_outer=2,dp_inner=2" or "dp=4". The user blob saved on each rank
is {"next": STOP, "rank": r}; a resume checks it came back. Several runs
separated by "+" run one after the other in the same processes (each with
its own model, runtime and optimizer: one launch, as process start and torch's
import cost seconds); a resume from a checkpoint saved by the same launch
would not be in fresh processes, so the test saves in one launch and loads in
the next.
"""
import json
import os
import sys

import torch

import gpt
import train

torch.set_num_threads(1)
M, B = 2, 2


def main(argv):
    import mfsdp
    import mfsdp.torch as mt
    out, layout, mesh_arg, start, stop, total = argv[:6]
    start, stop, total = int(start), int(stop), int(total)
    opts = dict(zip(argv[6::2], argv[7::2]))
    mesh = {k: int(v) for k, v in (kv.split("=") for kv in mesh_arg.split(","))}
    model = gpt.make_model(seed=7 if "--load" in opts else 0)
    spec = mt.spec_from_module(model, mesh=mesh, layout=layout, microbatches=M)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec), backend="mpi", timeout_ms=60000)
    opt = train.make_optimizer(sm.main_parameters(), "adamw")
    rank = sm.runtime.rank
    if "--load" in opts:
        step, blob = sm.load_checkpoint(opts["--load"], opt)
        assert step == start, (step, start)
        assert json.loads(blob) == {"next": start, "rank": rank}, blob
    X, Y = gpt.make_data(total, train.WORLD, M, B)
    losses = []
    for s in range(start, stop):
        tot = 0.0
        for m in range(M):
            loss = model(X[s, rank, m], Y[s, rank, m])
            (loss / M).backward()
            tot += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(sm.mean_over_ranks(tot / M))
    if "--save" in opts:
        sm.save_checkpoint(opts["--save"], opt, step=stop,
                           user_blob=json.dumps({"next": stop, "rank": rank}).encode())
    dump = {"losses": losses, "tensors": {}}
    for name, off, mp in sm.shards():
        st = opt.state.get(mp, {})
        dump["tensors"][name] = {"offset": off, "main": mp.detach().clone(),
                                 "exp_avg": st["exp_avg"].clone(),
                                 "exp_avg_sq": st["exp_avg_sq"].clone(),
                                 "step": st["step"].clone()}
    torch.save(dump, os.path.join(out, "rank%d.pt" % rank))
    sm.close()


def runs(argv):
    """The argument lists of the runs, split at "+"."""
    out, cur = [], []
    for a in argv:
        if a == "+":
            out.append(cur)
            cur = []
        else:
            cur.append(a)
    return out + [cur]


if __name__ == "__main__":
    for run in runs(sys.argv[1:]):
        main(run)
