"""
distinct_hf_worker: one MPI rank of test_distinct_hf.py: the Hugging Face
export and import (sm.export_hf / sm.import_hf) of models whose tensors are
Distinct on a mesh axis, under their global names (issue #42). The models,
meshes, global names and training are distinct_worker.py's (imported, not
changed): tp = TP 2 x DP 2 (w1 split along dim 0, w2 along dim 1), moe =
EP 2 x DP 2 (4 experts renamed, 2 per ep coordinate).

    mpirun -np 4 python distinct_hf_worker.py OUT PORT
    mpirun -np 2 python distinct_hf_worker.py OUT PORT two    (after the first)

On 4 ranks, per kind (rank 0 also writes the schedule, OUT/sched_<kind>.yaml):
  OUT/hf0_<kind>       exported before training (the initial weights)
  OUT/hf_<kind>        exported after STEPS steps, fp32, one file
  OUT/hfs_<kind>       the same, files of at most 1200 bytes (an index)
  OUT/hfm_<kind>       the same with maps {"model.": ""} (moe: and the tie
                       head.weight=embed.weight)
  then a fresh sharded model of other values (every tensor + 0.5) imports
  hf_<kind>, hfs_<kind> and hfm_<kind> (with the same rules) in turn, its
  master shards moved off again (+ 0.5) before each.
  OUT/<kind>.rank<r>.pt: the master shards after training ("shards"), its
  full_state_dict then ("full"), the shards after each import ("imported",
  "imported_sharded", "imported_maps"), the full_state_dict after the first
  import ("imported_full"), and its coordinates.
  The MoE without global names: export_hf's and import_hf's errors (type
  name, message: OUT/unnamed.rank<r>.pt).
On 2 ranks (dp = 1, the same tp / ep): hf_<kind> imported
(OUT/two_<kind>.rank<r>.pt: full_state_dict and shards) and exported
again (OUT/hf2_<kind>).
"""
import os
import sys

import torch
import torch.distributed as dist

import distinct_worker as dw
import mfsdp

MAPS = {"model.": ""}
TIES = {"moe": {"head.weight": "embed.weight"}, "tp": None}


def shards(sm):
    return {n: (off, p.detach().clone()) for n, off, p in sm.shards()}


def fresh(kind, rank, dp=2):
    """A sharded model of other values than any export (every tensor + 0.5)."""
    model = dw.local_model(kind, [rank // dp, rank % dp], None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    return dw.sharded(kind, model, dp=dp)


def imports(kind, rank, out):
    """One sharded model of other values imports hf_<kind>, hfs_<kind> and
    hfm_<kind> (with its rules) in turn, its master shards moved off (+ 0.5)
    before each: the shards after each, the full_state_dict after the first."""
    sm = fresh(kind, rank)
    res = {}
    for key, path, rules in (("imported", "hf", (None, None)), ("imported_sharded", "hfs", (None, None)),
                             ("imported_maps", "hfm", (MAPS, TIES[kind]))):
        with torch.no_grad():
            for _, _, p in sm.shards():
                p.add_(0.5)
        sm.import_hf(os.path.join(out, "%s_%s" % (path, kind)), *rules)
        res[key] = shards(sm)
        if key == "imported":
            res["imported_full"] = sm.full_state_dict(rank0_only=False)
    sm.close()
    return res


def run(out, rank, kind):
    model = dw.local_model(kind, [rank // 2, rank % 2], None)
    sm = dw.sharded(kind, model)
    sm.export_hf(os.path.join(out, "hf0_%s" % kind))
    if rank == 0:                    # for the offline tool (mfsdp-ckpt import / export)
        with open(os.path.join(out, "sched_%s.yaml" % kind), "wb") as f:
            f.write(sm.schedule.text)
    res = {"coords": list(sm.runtime.coords), "losses": [], "norms": [], "params": []}
    dw.train(sm, model, kind, rank, dw.STEPS, res)
    res["shards"] = shards(sm)
    res["full"] = sm.full_state_dict(rank0_only=False)
    sm.export_hf(os.path.join(out, "hf_%s" % kind), "fp32")
    sm.export_hf(os.path.join(out, "hfs_%s" % kind), max_file_bytes=1200)
    sm.export_hf(os.path.join(out, "hfm_%s" % kind), maps=MAPS, ties=TIES[kind])
    sm.close()
    res.update(imports(kind, rank, out))
    del res["params"]
    torch.save(res, os.path.join(out, "%s.rank%d.pt" % (kind, rank)))


def unnamed(out, rank):
    """The MoE without global names: both calls refused, creating nothing."""
    model = dw.local_model("moe", [rank // 2, rank % 2], None)
    sm = dw.sharded("moe", model, named=False)
    res = {}
    for what, call in (("export_hf", lambda: sm.export_hf(os.path.join(out, "never_hf"))),
                       ("import_hf", lambda: sm.import_hf(os.path.join(out, "hf_moe")))):
        try:
            call()
            res[what] = None
        except mfsdp.MfsdpError as e:
            res[what] = (type(e).__name__, str(e))
    res["never_exists"] = os.path.exists(os.path.join(out, "never_hf"))
    sm.close()
    torch.save(res, os.path.join(out, "unnamed.rank%d.pt" % rank))


def two(out, rank):
    """On 2 ranks (dp = 1): the 4-rank export imported, and exported again."""
    for kind in ("tp", "moe"):
        sm = fresh(kind, rank, dp=1)
        sm.import_hf(os.path.join(out, "hf_%s" % kind))
        res = {"shards": shards(sm), "full": sm.full_state_dict(rank0_only=False),
               "coords": list(sm.runtime.coords)}
        sm.export_hf(os.path.join(out, "hf2_%s" % kind), "fp32")
        sm.close()
        torch.save(res, os.path.join(out, "two_%s.rank%d.pt" % (kind, rank)))


def main():
    out, port = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "4")))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=world)
    if sys.argv[3:] == ["two"]:
        two(out, rank)
    else:
        for kind in ("tp", "moe"):
            run(out, rank, kind)
        unnamed(out, rank)
    if rank == 0:
        print("done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
