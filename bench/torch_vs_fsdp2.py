"""
torch_vs_fsdp2: the GPT model of tests/python trained on a 2 x 2 mesh by 4
processes, through mfsdp (MPI backend, hsdp / hsdp_nosync layouts) or PyTorch
FSDP2 (fully_shard on a 2-D DeviceMesh over gloo = HSDP; "nosync" calls
set_requires_gradient_sync(False) on all but the last microbatch: no
reduce-scatter and no all-reduce until the last one, as mfsdp's hsdp_nosync
defers both). Both train with the same AdamW settings (one make_optimizer,
--foreach the same for both). One rank process of one framework;
bench/torch_vs_fsdp2 runs them all, in alternated rounds, and prints the
table. Per step (median over the measured steps, max over ranks):

  wall      the step's wall time (forward + backward of M microbatches + optimizer)
  cpu       the process's CPU time in the step (every thread: compute, the
            framework's and the communication library's), time.process_time
  hooks     host time inside the framework's hooks (mfsdp: mfsdp.torch's hooks,
            C calls included; FSDP2: FSDPParamGroup pre/post forward/backward,
            finalize_backward and the root pre-forward)
  blocked   of which waiting for communication (mfsdp: the compute stream's
            event waits, mfsdp_stats.wait_ns; FSDP2: time inside its
            synchronous gloo collectives)
  overhead  hooks - blocked: the host work a framework adds to a step
  launches, bytes per axis: collectives issued and bytes sent per rank
            (ring model: all-gather and reduce-scatter (g-1)/g * n bytes,
            all-reduce 2 (g-1)/g * n, n the full buffer), from mfsdp_stats
            and by counting FSDP2's torch.distributed calls per process group
  peak MiB  peak RSS growth of the process over its size before the model
            was built

    mpirun -np 4 python bench/torch_vs_fsdp2.py mfsdp|fsdp2 hsdp|hsdp_nosync OUT.json [--M 3 ...]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import gpt  # noqa: E402

MESH = {"dp_outer": 2, "dp_inner": 2}


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Counter:
    """Per step: launches and bytes per axis, seconds blocked in collectives."""

    def __init__(self):
        self.launches = [0, 0]
        self.bytes = [0, 0]
        self.blocked = 0.0


def make_optimizer(params, a):
    """The one optimizer both frameworks train with."""
    return torch.optim.AdamW(params, lr=1e-3, foreach=bool(a.foreach))


def step_clock():
    return time.perf_counter(), time.process_time()


def run_mfsdp(a, rank, X, Y):
    import mfsdp
    import mfsdp.torch as mt
    model = gpt.make_model(**a.model)
    spec = mt.spec_from_module(model, mesh=MESH, layout=a.layout, microbatches=a.M)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec), backend="mpi")
    opt = make_optimizer(sm.main_parameters(), a)
    rows = []
    for s in range(a.steps):
        st0, h0 = sm.stats(), sm.hook_seconds
        t0, c0 = step_clock()
        for m in range(a.M):
            (model(X[s, rank, m], Y[s, rank, m]) / a.M).backward()
        opt.step()
        opt.zero_grad()
        t1, c1 = step_clock()
        d = sm.stats() - st0
        rows.append({"wall": t1 - t0, "cpu": c1 - c0, "hooks": sm.hook_seconds - h0,
                     "blocked": d.wait_ns[0] / 1e9, "launches": d.collectives[:2],
                     "bytes": d.bytes[:2]})
    sm.close()
    return rows


def patch_fsdp2(counter, mesh):
    """Counts FSDP2's collectives per mesh axis and times its hooks."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
    from torch.distributed.fsdp._fully_shard import _fsdp_state as fs
    axis_of = {mesh.get_group("dp_outer"): 0, mesh.get_group("dp_inner"): 1}
    depth = [0]
    hook_time = [0.0]

    def coll(fn, factor, which):
        def wrapped(*args, **kw):
            t = kw.get(which) if which in kw else args[0 if which in ("output", "tensor") else 1]
            group = kw.get("group")
            g = dist.get_world_size(group)
            ax = axis_of.get(group)
            if ax is not None and g > 1:
                counter.launches[ax] += 1
                counter.bytes[ax] += int(factor * (g - 1) / g * t.numel() * t.element_size())
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                if depth[0]:
                    counter.blocked += time.perf_counter() - t0
        return wrapped
    dist.all_gather_single = coll(dist.all_gather_single, 1, "output")
    dist.reduce_scatter_single = coll(dist.reduce_scatter_single, 1, "input")
    dist.all_reduce = coll(dist.all_reduce, 2, "tensor")

    def timed(fn):
        def wrapped(*args, **kw):
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    hook_time[0] += time.perf_counter() - t0
        return wrapped
    for name in ("pre_forward", "post_forward", "pre_backward", "post_backward",
                 "finalize_backward"):
        setattr(pg.FSDPParamGroup, name, timed(getattr(pg.FSDPParamGroup, name)))
    fs.FSDPState._root_pre_forward = timed(fs.FSDPState._root_pre_forward)
    return hook_time


def run_fsdp2(a, rank, X, Y):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port, rank=rank,
                            world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_outer", "dp_inner"))
    counter = Counter()
    hook_time = patch_fsdp2(counter, mesh)
    model = gpt.make_model(**a.model)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = make_optimizer(model.parameters(), a)
    rows = []
    for s in range(a.steps):
        before = (list(counter.launches), list(counter.bytes), counter.blocked, hook_time[0])
        t0, c0 = step_clock()
        for m in range(a.M):
            if a.layout == "hsdp_nosync":
                model.set_requires_gradient_sync(m == a.M - 1)
            (model(X[s, rank, m], Y[s, rank, m]) / a.M).backward()
        opt.step()
        opt.zero_grad()
        t1, c1 = step_clock()
        rows.append({"wall": t1 - t0, "cpu": c1 - c0, "hooks": hook_time[0] - before[3],
                     "blocked": counter.blocked - before[2],
                     "launches": [x - y for x, y in zip(counter.launches, before[0])],
                     "bytes": [x - y for x, y in zip(counter.bytes, before[1])]})
    dist.destroy_process_group()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("framework", choices=["mfsdp", "fsdp2"])
    ap.add_argument("layout", choices=["hsdp", "hsdp_nosync"])
    ap.add_argument("out")
    ap.add_argument("--M", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--foreach", type=int, default=0, help="AdamW's foreach, for both frameworks")
    a = ap.parse_args()
    a.model = {"vocab": a.vocab, "d": a.d, "heads": 4, "layers": 4, "seq": a.seq}
    torch.set_num_threads(1)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    X, Y = gpt.make_data(a.steps, 4, a.M, a.b, seq=a.seq, vocab=a.vocab)
    base = rss_mib()
    rows = (run_mfsdp if a.framework == "mfsdp" else run_fsdp2)(a, rank, X, Y)
    rows = rows[a.warmup:]
    res = {k: statistics.median(r[k] for r in rows) for k in ("wall", "cpu", "hooks", "blocked")}
    res["launches"] = rows[-1]["launches"]
    res["bytes"] = rows[-1]["bytes"]
    res["peak_mib"] = peak_mib() - base
    res["rank"] = rank
    with open("%s.rank%d" % (a.out, rank), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
