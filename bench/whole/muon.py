"""
muon: Muon on a sharded model three ways, on the same model in the same run
(any number of MPI ranks; ZeRO-3 on a 1-D mesh or HFSDP on a 2-D one, the GPT
model of tests/python, bigger):

  whole   mfsdp with matrix_optimizer="whole": each block matrix's grad and
          main_weight are Whole, so torch.optim.Muon runs on the owners only,
          on the delivered gradient, with no communication of its own
  gather  FSDP2's recipe on Flat shards: the momentum per shard, the
          Nesterov update all-gathered to every rank (Runtime.gather_shard),
          Newton-Schulz on every rank for every matrix, each keeps its shard
  a2a     Flat shards sent to one owner per matrix (all_to_all_single over
          gloo, owners balanced by bytes), Newton-Schulz there, the
          orthogonalised shards sent back

AdamW takes the rest (embeddings, norms, biases) in all three. Per step
(median over the measured steps, max over ranks): the schedule's bytes per
rank (mfsdp_stats, ring model), the optimizer's own bytes per rank (gather:
the all-gather's ring bytes (n-1)/n of each matrix; a2a: the shards sent
out and back), the optimizer's wall time, and the largest difference of the
final matrices from the first form's (gather and a2a compute the same bits;
whole differs by torch's bf16 Newton-Schulz on gradients summed in another order,
see tests/python/test_whole_muon.py).

    mpirun -np 4 python bench/whole/muon.py [--d 256 --layers 4 --steps 6 --M 2]
    mpirun -np 8 python bench/whole/muon.py --mesh 2x4      # HFSDP, 2 x 4

--mesh N (1-D, zero3; default the MPI world size) or OxI (dp_outer x dp_inner,
hfsdp; main_weight is Flat on both axes, so the gather and a2a forms see one
1-D shard per rank and "whole" owners are single ranks); O x I must be the
world size. The library and the compiler are found as the Python tests find
them (MFSDP_LIBRARY, MFSDPC, PYTHONPATH=python: tests/python/conftest.py);
gloo's rendezvous is MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29533).
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import gpt  # noqa: E402
import mfsdp  # noqa: E402
import mfsdp.torch as mt  # noqa: E402

LR, WD, MOMENTUM, ADAMW_LR = 0.02, 0.01, 0.95, 3e-3
NS = ((3.4445, -4.7750, 2.0315), 5, 1e-7)     # torch.optim.Muon's defaults


def is_matrix(name, shape):
    return len(shape) == 2 and name.startswith("blocks.")


class ShardedMuon:
    """Muon over Flat 1-D master shards: momentum per shard, the update
    assembled by `assemble(name, u_shard) -> full update or None`, Newton-Schulz
    where it is full, the orthogonalised shard back by `scatter`."""

    def __init__(self, sm, mode, owners, layout):
        self.sm, self.mode, self.owners, self.layout = sm, mode, owners, layout
        self.mats = [(n, mp) for n, mp in sm.named_main_parameters() if is_matrix(n, mp.full_shape)]
        self.buf = {n: torch.zeros_like(mp) for n, mp in self.mats}
        self.bytes = 0

    def step(self):
        rt, world = self.sm.runtime, self.sm.runtime.world_size
        upd = {}
        for n, mp in self.mats:
            b = self.buf[n]
            b.mul_(MOMENTUM).add_(mp.grad)
            upd[n] = mp.grad.add(b, alpha=MOMENTUM)
        names = [v.name for v in rt.views if is_matrix(v.name, v.shape)]
        if self.mode == "gather":
            full = {}
            for t in names:
                v = rt.view(t)
                g = rt.gather_shard(v.index, upd.get(t), dtype="fp32")
                self.bytes += (world - 1) * v.numel * 4 // world
                o = _zeropower_via_newtonschulz(torch.from_numpy(g).reshape(v.shape), *NS)
                full[t] = o.reshape(-1)
        else:
            full = self._a2a(names, upd)
        with torch.no_grad():
            for n, mp in self.mats:
                v = rt.view(n)
                o = full[n][v.shard_offset:v.shard_offset + v.shard_count]
                mp.mul_(1 - LR * WD)
                mp.add_(o.to(mp.dtype), alpha=-_adjust_lr(LR, None, torch.Size(v.shape)))

    def _a2a(self, names, upd):
        """Shards to each matrix's owner, Newton-Schulz there, shards back:
        {name: full orthogonalised update, NaN outside this rank's shard}."""
        rt, world, me = self.sm.runtime, self.sm.runtime.world_size, self.sm.runtime.rank
        lay = self.layout                          # {name: [(offset, count) per rank]}
        send = [[] for _ in range(world)]
        for t in names:
            if lay[t][me][1]:
                send[self.owners[t]].append(upd[t])
        recv_counts = [sum(lay[t][r][1] for t in names if self.owners[t] == me)
                       for r in range(world)]
        got = self._exchange(send, recv_counts)
        mine = {}
        for t in (t for t in names if self.owners[t] == me):
            v = rt.view(t)
            mine[t] = torch.empty(v.numel)
        pos = [0] * world
        for t in names:
            if self.owners[t] != me:
                continue
            for r in range(world):
                off, cnt = lay[t][r]
                mine[t][off:off + cnt] = got[r][pos[r]:pos[r] + cnt]
                pos[r] += cnt
        for t in mine:
            v = rt.view(t)
            mine[t] = _zeropower_via_newtonschulz(mine[t].reshape(v.shape), *NS).float().reshape(-1)
        back = [[] for _ in range(world)]
        for t in names:
            if self.owners[t] == me:
                for r in range(world):
                    off, cnt = lay[t][r]
                    if cnt:
                        back[r].append(mine[t][off:off + cnt])
        counts = [sum(lay[t][me][1] for t in names if self.owners[t] == r) for r in range(world)]
        ret = self._exchange(back, counts)
        full = {}
        pos = [0] * world
        for t in names:
            off, cnt = lay[t][me]
            if cnt:
                r = self.owners[t]
                f = torch.full((rt.view(t).numel,), float("nan"))
                f[off:off + cnt] = ret[r][pos[r]:pos[r] + cnt]
                pos[r] += cnt
                full[t] = f
        return full

    def _exchange(self, send, recv_counts):
        world, me = len(send), self.sm.runtime.rank
        flat = [torch.cat(s) if s else torch.empty(0) for s in send]
        out = torch.empty(sum(recv_counts))
        dist.all_to_all_single(out, torch.cat(flat), recv_counts, [f.numel() for f in flat])
        self.bytes += sum(f.numel() * 4 for r, f in enumerate(flat) if r != me)
        return list(out.split(recv_counts))


def parse_mesh(text, world):
    """--mesh: "N" -> ({"dp": N}, "zero3"), "OxI" -> ({"dp_outer": O, "dp_inner": I},
    "hfsdp"); exits with a message when it is malformed or not the world size."""
    try:
        sizes = [int(x) for x in text.lower().split("x")]
    except ValueError:
        sizes = []
    if len(sizes) not in (1, 2) or min(sizes) < 1:
        sys.exit("muon.py: --mesh %r: N (1-D, zero3) or OxI (dp_outer x dp_inner, hfsdp)" % text)
    if math.prod(sizes) != world:
        sys.exit("muon.py: --mesh %s has %d ranks, and MPI runs %d (mpirun -np)"
                 % (text, math.prod(sizes), world))
    if len(sizes) == 1:
        return {"dp": sizes[0]}, "zero3"
    return {"dp_outer": sizes[0], "dp_inner": sizes[1]}, "hfsdp"


def run(mode, args, X, Y):
    model = gpt.make_model(vocab=args.vocab, d=args.d, heads=4, layers=args.layers, seq=args.seq)
    spec = mt.spec_from_module(model, mesh=args.mesh_axes, layout=args.layout, microbatches=args.M,
                               matrix_optimizer="whole" if mode == "whole" else None)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec, name="muon_" + mode), backend="mpi",
                  timeout_ms=120000)
    rank, world = sm.runtime.rank, sm.runtime.world_size
    mains = sm.main_parameters()
    rest = [p for p in mains if not is_matrix(p.full_name, p.full_shape)]
    adamw = torch.optim.AdamW([{"params": rest}], lr=ADAMW_LR, weight_decay=0.1, foreach=False)
    if mode == "whole":
        mats = [p for p in mains if is_matrix(p.full_name, p.full_shape)]
        muon = torch.optim.Muon([{"params": mats}], lr=LR, weight_decay=WD, momentum=MOMENTUM)
    else:
        views = sm.runtime.views
        ranges = [(v.shard_offset, v.shard_count) for v in views]
        every = [None] * world
        dist.all_gather_object(every, ranges)
        lay = {v.name: [every[r][v.index] for r in range(world)] for v in views}
        load, owners = [0] * world, {}
        for v in sorted((v for v in views if is_matrix(v.name, v.shape)),
                        key=lambda v: (-v.numel, v.index)):
            owners[v.name] = min(range(world), key=lambda r: (load[r], r))
            load[owners[v.name]] += v.numel
        muon = ShardedMuon(sm, mode, owners, lay)
    sched_bytes, opt_bytes, opt_s = [], [], []
    for s in range(args.steps):
        before = sm.stats()
        for m in range(args.M):
            (model(X[s, rank, m], Y[s, rank, m]) / args.M).backward()
        sched_bytes.append(sum((sm.stats() - before).bytes))
        b0 = getattr(muon, "bytes", 0)
        t0 = time.perf_counter()
        muon.step()
        adamw.step()
        opt_s.append(time.perf_counter() - t0)
        opt_bytes.append(getattr(muon, "bytes", 0) - b0)
        for o in (muon, adamw):
            if hasattr(o, "zero_grad"):
                o.zero_grad()
        if mode != "whole":
            for p in mains:
                p.grad = None
    full = sm.full_state_dict(rank0_only=False)
    warm = slice(1, None)     # the first step builds state
    res = {k: sm.allreduce([statistics.median(v[warm])], "max")[0]
           for k, v in (("sched_bytes", sched_bytes), ("opt_bytes", opt_bytes), ("opt_s", opt_s))}
    sm.close()
    return res, {n: t for n, t in full.items() if is_matrix(n, t.shape)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--M", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--modes", default="whole,gather,a2a")
    ap.add_argument("--mesh", default=None,
                    help="N (1-D, zero3) or OxI (dp_outer x dp_inner, hfsdp); default: "
                         "the world size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    args.mesh = args.mesh or str(world)
    args.mesh_axes, args.layout = parse_mesh(args.mesh, world)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    X, Y = gpt.make_data(args.steps, world, args.M, 2, seq=args.seq, vocab=args.vocab)
    rows, finals = [], {}
    modes = args.modes.split(",")
    for mode in modes:
        res, finals[mode] = run(mode, args, X, Y)
        rows.append((mode, res))
    if rank == 0:
        sizes = list(args.mesh_axes.values())
        shape = " x ".join(str(n) for n in ([1] + sizes if len(sizes) == 1 else sizes))
        print("Muon on %d ranks, %s %s (%s), GPT d=%d layers=%d, M=%d, median of steps 2..%d, "
              "max over ranks" % (world, "ZeRO-3" if args.layout == "zero3" else "HFSDP", shape,
                                  args.layout, args.d, args.layers, args.M, args.steps))
        print("%-7s %16s %16s %14s %18s" % ("form", "schedule B/rank", "optimizer B/rank",
                                            "optimizer ms", "max |dW| vs " + modes[0]))
        for mode, res in rows:
            diff = max(((finals[mode][n] - t).abs().max() / t.abs().max()).item()
                       for n, t in finals[modes[0]].items())
            print("%-7s %16d %16d %14.2f %18.2e" % (mode, res["sched_bytes"], res["opt_bytes"],
                                                    1e3 * res["opt_s"], diff))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
