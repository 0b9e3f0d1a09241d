"""
distinct_worker: one MPI rank of test_distinct.py (mpirun -np 4): models
whose tensors are Distinct on a mesh axis (issue #42), trained through
mt.fully_shard with the model's own collectives on sm.device_mesh()'s groups.

    mpirun -np 4 python distinct_worker.py OUT PORT

  tp   a Megatron-style MLP (TPModel) on {"tp": 2, "dp": 2}, layout fsdp2d:
       per block a LayerNorm (data parallel), a column-parallel w1 (each tp
       rank holds half the output features) and a row-parallel w2 (half the
       input features) whose output is all-reduced over mesh["tp"] (the f/g
       functions), w1 and w2 Distinct on tp; both tp ranks of a dp coordinate
       read the same microbatches.
  moe  a top-1 MoE (MoEModel) on {"ep": 2, "dp": 2}, layout hfsdp: E = 4
       experts, 2 per ep coordinate (local expert e of coordinate c is global
       expert 2c + e), tokens dispatched to their expert's ep rank and back
       with all_to_all_single over mesh["ep"]; the experts Distinct on ep,
       expert_axes=("ep",); every rank reads its own microbatches.
  moe_unscaled  moe with ep declared in tensor_axes instead, one step (its
       expert gradients are kept as computed: the ep group's sum, twice the mean).
  moe_skip  moe whose experts skip an empty token set (no gradient, as
       Hugging Face's MoEs loop over the experts hit only), global expert
       MASKED routed no token from step 1 on: the parameters that got no
       gradient in a microbatch count zero, and one that got none on any rank
       of its group in a step has .grad None (mask_step).
  bad_init  the ranks of one ep coordinate start from different experts:
       fully_shard's refusal (OUT/bad_init.rank<r>.pt).
  bad_axes  the ranks of dp coordinate 1 declare ep a tensor axis, the others
       an expert axis: fully_shard's refusal on every rank (OUT/bad_axes.rank<r>.pt).
  unnamed  the MoE without global names: the whole-model refusals.
  reshard  (mpirun -np 2, after the others) the tp and moe runs' DCP
       checkpoints loaded on dp = 1 and saved again.

STEPS steps of M microbatches (each loss scaled by 1/M), the gradient clipped
to CLIP (sm.clip_grad_norm_), SGD with momentum over sm.main_parameters().
Rank r writes OUT/<run>.rank<r>.pt: the losses (mean over ranks), the norms
clip_grad_norm_ returned, after every step its master shards (name -> (shard
offset, values)), its coordinates, the ranks of its device_mesh groups, its
full_state_dict after the steps (under the global names) and a DCP
checkpoint of it (OUT/dcp_<run>), the same initial weights given to a fresh
sharded model by load_full_state_dict and trained again, and the DCP
checkpoint loaded into a fresh sharded model. The single-process
references (the whole models on the union of the microbatches) are in
test_distinct.py; both build their weights with whole_model().
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import mfsdp
import mfsdp.torch as mt

torch.set_num_threads(1)
STEPS, M, TOKENS, D, H = 3, 2, 8, 16, 32     # TOKENS per rank per microbatch
E, EP = 4, 2
CLIP = 0.05          # below every step's norm: clipping happens
LR = 0.1
RUNS = {"tp": ({"tp": 2, "dp": 2}, "fsdp2d"), "moe": ({"ep": 2, "dp": 2}, "hfsdp"),
        "moe_unscaled": ({"ep": 2, "dp": 2}, "hfsdp"), "moe_skip": ({"ep": 2, "dp": 2}, "hfsdp")}
MASKED = 3           # moe_skip: the global expert no token is routed to from step 1 on


# ---- tensor parallelism: f and g (Megatron's names) ----

class CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient over the tp group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.group is None:
            return g, None
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce of the output over the tp group, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        if group is None:
            return x
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class TPBlock(nn.Module):
    def __init__(self, tp, group):
        super().__init__()
        self.group = group
        self.ln = nn.LayerNorm(D)
        self.w1 = nn.Linear(D, H // tp)              # column-parallel
        self.w2 = nn.Linear(H // tp, D, bias=False)  # row-parallel
        self.b2 = nn.Parameter(torch.zeros(D))       # after the all-reduce

    def forward(self, x):
        h = F.gelu(self.w1(CopyToTP.apply(self.ln(x), self.group)))
        return x + ReduceFromTP.apply(self.w2(h), self.group) + self.b2


class TPModel(nn.Module):
    def __init__(self, tp=1, group=None):
        super().__init__()
        self.blocks = nn.ModuleList([TPBlock(tp, group) for _ in range(2)])
        self.head = nn.Linear(D, D)

    def forward(self, x, y):
        for b in self.blocks:
            x = b(x)
        return F.mse_loss(self.head(x), y)


def tp_slice(name, full, c, tp=2):
    """The tp coordinate c's part of a whole TPModel tensor (the tensor itself
    when it is not tensor-parallel)."""
    k = H // tp
    if name.endswith("w1.weight") or name.endswith("w1.bias"):
        return full[c * k:(c + 1) * k]
    if name.endswith("w2.weight"):
        return full[:, c * k:(c + 1) * k]
    return full


# ---- expert parallelism ----

class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.args = (in_splits, out_splits, group)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        in_splits, out_splits, group = ctx.args
        out = g.new_empty((sum(in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(out, g.contiguous(), in_splits, out_splits, group=group)
        return out, None, None, None


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, H)
        self.w2 = nn.Linear(H, D)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    """Top-1 routing over E experts, E / ep of them here; group: the ep
    group (None: every expert local, no communication)."""

    def __init__(self, ep=1, group=None, skip=False):
        super().__init__()
        self.ep, self.group, self.skip = ep, group, skip
        self.masked = ()      # global experts the router never picks
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(E // ep)])

    def forward(self, x):
        logits = self.router(x)
        if self.masked:
            logits = logits.index_fill(1, torch.tensor(self.masked), float("-inf"))
        probs = F.softmax(logits, dim=-1)
        gate, idx = probs.max(dim=-1)
        local = E // self.ep
        dest = idx // local
        order = torch.argsort(dest, stable=True)
        xs, ids = x[order], (idx % local)[order]
        send = torch.bincount(dest, minlength=self.ep)
        if self.group is not None:
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=self.group)
            s, r = send.tolist(), recv.tolist()
            rid = ids.new_empty(sum(r))
            dist.all_to_all_single(rid, ids, r, s, group=self.group)
            xr = AllToAll.apply(xs, r, s, self.group)
        else:
            xr, rid = xs, ids
        out = torch.zeros_like(xr)
        for e, expert in enumerate(self.experts):     # every expert runs, even on no token,
            at = (rid == e).nonzero(as_tuple=True)[0]  # unless skip (as Hugging Face's MoEs)
            if self.skip and at.numel() == 0:
                continue
            out = out.index_copy(0, at, expert(xr[at]))
        back = AllToAll.apply(out, s, r, self.group) if self.group is not None else out
        y = torch.empty_like(back).index_copy(0, order, back)
        return x + gate.unsqueeze(-1) * y


class MoEModel(nn.Module):
    def __init__(self, ep=1, group=None, skip=False):
        super().__init__()
        self.embed = nn.Linear(D, D)
        self.moe = MoE(ep, group, skip)
        self.head = nn.Linear(D, D)

    def forward(self, x, y):
        return F.mse_loss(self.head(self.moe(torch.tanh(self.embed(x)))), y)


def moe_global_name(name, c, ep=EP):
    """The whole model's name of a local MoEModel tensor at ep coordinate c."""
    parts = name.split(".")
    if parts[:2] == ["moe", "experts"]:
        parts[2] = str(c * (E // ep) + int(parts[2]))
    return ".".join(parts)


# ---- shared by the workers and the references ----

def whole_model(kind):
    torch.manual_seed(7)
    return TPModel() if kind == "tp" else MoEModel(skip=kind == "moe_skip")


def data(kind):
    """X, Y of [STEPS, data-parallel rank, M, TOKENS, D]: 2 dp coordinates
    for tp (both tp ranks read them), 4 ranks for moe."""
    g = torch.Generator().manual_seed(11)
    n = 2 if kind == "tp" else 4
    x = torch.randn(STEPS, n, M, TOKENS, D, generator=g)
    return x, torch.randn(STEPS, n, M, TOKENS, D, generator=g)


def local_model(kind, coords, group):
    """This rank's model: the whole model's weights, its tp or ep coordinate's part."""
    full = dict(whole_model("tp" if kind == "tp" else "moe").named_parameters())
    c = coords[0]
    model = TPModel(2, group) if kind == "tp" else MoEModel(EP, group, kind == "moe_skip")
    with torch.no_grad():
        for n, p in model.named_parameters():
            src = tp_slice(n, full[n], c) if kind == "tp" else full[moe_global_name(n, c)]
            p.copy_(src)
    return model


def global_names(kind):
    """fully_shard's global_names of a run: the experts renamed (local expert e
    of ep coordinate c is 2c + e), TP's w1 split along its output features
    (dim 0), w2 along its input features (dim 1)."""
    if kind.startswith("moe"):
        return {"moe.experts.*": mt.expert_names("moe.experts.{}", E // EP, "ep")}
    return {"blocks.*.w1.*": ("tp", 0), "blocks.*.w2.*": mt.split(1)}


def sharded(kind, model, named=True, dp=2):
    """model through mt.fully_shard on its run's mesh, dp its data-parallel
    size (named: with global names), its modules given sm.device_mesh()'s ep
    or tp group."""
    mesh, layout = RUNS[kind]
    mesh = dict(mesh, dp=dp)
    moe = kind.startswith("moe")
    distinct = {"moe.experts.*": "ep"} if moe else {"blocks.*.w1.*": "tp", "blocks.*.w2.*": "tp"}
    sm = mt.fully_shard(model, mesh=mesh, layout=layout, microbatches=M, distinct=distinct,
                        global_names=global_names(kind) if named else None,
                        expert_axes=("ep",) if kind in ("moe", "moe_skip") else (),
                        tensor_axes=("tp",) if kind == "tp" else ("ep",) if kind == "moe_unscaled"
                        else (), units=(
                            ["embed", "moe", "head"] if moe else None),
                        timeout_ms=60000, cache=False)
    group = mt.device_mesh(sm)["ep" if moe else "tp"].get_group()
    for mod in model.modules():
        if hasattr(mod, "group"):
            mod.group = group
    return sm


def train(sm, model, kind, rank, steps, res):
    """steps steps of M microbatches; appends to res' losses, norms, params."""
    moe = kind.startswith("moe")
    coords = [rank // 2, rank % 2]
    X, Y = data("moe" if moe else "tp")
    d = rank if moe else coords[1]                   # the data-parallel index of its batch
    opt = torch.optim.SGD(sm.main_parameters(), lr=LR, momentum=0.9, foreach=False)
    for s in range(steps):
        mask_step(model, kind, s)
        tot = 0.0
        for m in range(M):
            loss = model(X[s, d, m], Y[s, d, m]) / M
            loss.backward()
            tot += loss.item()
        res["norms"].append(float(sm.clip_grad_norm_(CLIP)))
        opt.step()
        opt.zero_grad()
        res["losses"].append(sm.mean_over_ranks(tot))
        res["params"].append({n: (off, p.detach().clone()) for n, off, p in sm.shards()})
    return opt


def mask_step(model, kind, s):
    """moe_skip from step 1 on: global expert MASKED gets no token anywhere,
    so no rank computes its gradient (mfsdp's master gets .grad None, as the
    single-process model's: SGD's momentum leaves it alone), and ep
    coordinate 1's ranks complete the unit with its local expert's gradient
    missing in every microbatch."""
    if kind == "moe_skip":
        model.moe.masked = (MASKED,) if s >= 1 else ()


FULL = ("tp", "moe")     # the runs whose state dicts, checkpoints and reloads are checked


def run(out, rank, kind):
    mesh, _ = RUNS[kind]
    moe = kind.startswith("moe")
    steps = 1 if kind == "moe_unscaled" else STEPS
    coords = [rank // 2, rank % 2]                   # row-major, the innermost axis fastest
    # the model needs its group before sharding: take it from a DeviceMesh of the same
    # coordinates, then check sm.device_mesh() gives the same groups
    model = local_model(kind if moe else "tp", coords, None)
    sm = sharded(kind, model)
    dm = mt.device_mesh(sm)
    assert dm is sm.device_mesh()         # one mesh, made once
    res = {"coords": list(sm.runtime.coords), "mesh_coords": dm.get_coordinate(),
           "groups": {a: dist.get_process_group_ranks(dm[a].get_group()) for a in mesh},
           "distinct": dict(sm.distinct), "globals": dict(sm.globals), "spec": sm.spec,
           "losses": [], "norms": [], "params": []}
    train(sm, model, kind, rank, steps, res)
    if kind not in FULL:
        sm.close()
        torch.save(res, os.path.join(out, "%s.rank%d.pt" % (kind, rank)))
        return
    res["full"] = sm.full_state_dict(rank0_only=False)
    res["full0"] = sm.full_state_dict()              # rank 0's only
    sm.save_dcp(os.path.join(out, "dcp_%s" % kind))
    sm.close()
    res["reload"] = reload(kind, rank, steps)
    res["dcp_loaded"] = from_dcp(kind, rank, os.path.join(out, "dcp_%s" % kind), 2)
    torch.save(res, os.path.join(out, "%s.rank%d.pt" % (kind, rank)))


def reload(kind, rank, steps):
    """A fresh sharded model of other values (every tensor + 0.5) given the
    whole model's initial state dict by load_full_state_dict, then trained as
    run() trains: its full_state_dict before training, and the run."""
    model = local_model(kind, [rank // 2, rank % 2], None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    sm = sharded(kind, model)
    sm.load_full_state_dict(whole_model("tp" if kind == "tp" else "moe").state_dict())
    res = {"loaded": sm.full_state_dict(rank0_only=False), "losses": [], "norms": [],
           "params": []}
    train(sm, model, kind, rank, steps, res)
    res["full"] = sm.full_state_dict(rank0_only=False)
    sm.close()
    return res


def from_dcp(kind, rank, path, dp, save=None):
    """A fresh sharded model of other values (dp: its data-parallel size)
    given the DCP checkpoint at path by load_dcp: its full_state_dict (and,
    with save, its own save_dcp there)."""
    model = local_model(kind, [rank // dp, rank % dp], None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    sm = sharded(kind, model, dp=dp)
    sm.load_dcp(path)
    full = sm.full_state_dict(rank0_only=False)
    if save:
        sm.save_dcp(save)
    sm.close()
    return full


def reshard(out, rank):
    """On 2 ranks ({"ep": 2, "dp": 1}, {"tp": 2, "dp": 1}): the 4-rank runs' DCP
    checkpoints loaded (OUT/reshard_<kind>.rank<r>.pt: full_state_dict) and
    saved again (OUT/dcp2_<kind>)."""
    for kind in ("moe", "tp"):
        full = from_dcp(kind, rank, os.path.join(out, "dcp_%s" % kind), 1,
                        os.path.join(out, "dcp2_%s" % kind))
        torch.save(full, os.path.join(out, "reshard_%s.rank%d.pt" % (kind, rank)))


def unnamed(out, rank):
    """The MoE without global names: full_state_dict and load_full_state_dict
    refused naming the tensor and global_names= (OUT/unnamed.rank<r>.pt)."""
    model = local_model("moe", [rank // 2, rank % 2], None)
    sm = sharded("moe", model, named=False)
    res = {}
    for what, call in (("full_state_dict", sm.full_state_dict),
                       ("load_full_state_dict",
                        lambda: sm.load_full_state_dict(whole_model("moe").state_dict())),
                       ("save_dcp", lambda: sm.save_dcp(os.path.join(out, "never_unnamed")))):
        try:
            call()
            res[what] = None
        except mfsdp.UsageError as e:
            res[what] = str(e)
    sm.close()
    torch.save(res, os.path.join(out, "unnamed.rank%d.pt" % rank))


REFUSED = ["bad_init", "bad_axes"]


def refused(out, rank, kind):
    """The MoE sharded wrongly on the ranks of dp coordinate 1 (bad_init: one
    of their experts perturbed; bad_axes: ep declared a tensor axis there):
    the message fully_shard raises on this rank (None if none)."""
    coords = [rank // 2, rank % 2]
    model = local_model("moe", coords, None)
    axes = {"expert_axes": ("ep",)}
    if coords[1] == 1 and kind == "bad_init":
        with torch.no_grad():
            model.moe.experts[1].w2.bias.add_(1.0)
    if coords[1] == 1 and kind == "bad_axes":
        axes = {"tensor_axes": ("ep",)}
    try:
        mt.fully_shard(model, mesh=RUNS["moe"][0], layout="hfsdp", microbatches=M,
                       distinct={"moe.experts.*": "ep"}, units=["embed", "moe", "head"],
                       timeout_ms=60000, cache=False, **axes)
        msg = None
    except mfsdp.UsageError as e:
        msg = str(e)
    torch.save({"message": msg}, os.path.join(out, "%s.rank%d.pt" % (kind, rank)))


def main():
    out, port = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "4")))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=world)
    for kind in sys.argv[3:] or list(RUNS) + REFUSED + ["unnamed"]:
        if kind == "reshard":
            reshard(out, rank)
        elif kind in REFUSED:
            refused(out, rank, kind)
        elif kind == "unnamed":
            unnamed(out, rank)
        else:
            run(out, rank, kind)
        if rank == 0:
            print("%s: done" % kind, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
