"""
whole_worker: one MPI rank of test_whole_muon.py and test_whole_checkpoint.py
(mpirun -np 4): the GPT model of the parity tests (or the GLU model below)
with the hidden matrices' grad and main_weight on `Whole`
(spec_from_module(..., matrix_optimizer="whole"): the blocks' 2-D weights,
not the embeddings nor the LM head).

    mpirun -np 4 python whole_worker.py OUT muon DOCS_MD zero3 hsdp hfsdp hfsdp:bf16 \
        glu/zero3 glu/hfsdp glu/hfsdp:node
    mpirun -np 4 python whole_worker.py OUT ckpt PORT

muon: per run tag [MODEL/]LAYOUT[:bf16][:node] (parse_tag; MODEL gpt or glu),
STEPS steps of M microbatches with torch.optim.Muon on sm.whole_parameters()
(the hidden matrices this rank owns) and AdamW on the rest, its Newton-Schulz
in fp32 (fp32_newton_schulz), or as torch ships it with :bf16; :node shards
with whole_owners="node". Each rank writes OUT/muon_<file_tag>.rank<r>.pt:
the losses (rank 0's mean over ranks), after
every step its master parameters (name -> (shard offset, value), full-shape
for a Whole main weight), what it holds of every tensor (whole flags, shard
offset and count, whether a main parameter exists), the global gradient norm
of each step (sm.grad_norm) and Muon's state (name -> momentum shape). Then
the python blocks of docs/pytorch.md's section on Muon run as written (rank 0
prints "example at line N: ok" after each).

ckpt: AdamW on every main parameter (a Whole main is a full-shape Parameter,
a Flat one a 1-D shard): a Whole HFSDP run saves a checkpoint, a DCP and a
Hugging Face export; a Flat HFSDP run of another seed loads the checkpoint,
trains a step and saves; a Whole run of another seed loads that. Rank 0 writes
OUT/ckpt.pt with every gathered master weight and moment at each point, and
OUT/dcp_fsdp2.pt with what FSDP2 (1-D mesh over gloo) loaded from the DCP.
Then two optimizers (several()): Muon on the owned matrices + AdamW on the
rest, 4 steps uninterrupted with save_checkpoint and save_dcp of both after
step 2; fresh runs of other seeds are refused the wrong lists (nothing
modified), then load each and take steps 3 and 4; OUT/several.pt.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import gpt
import train

torch.set_num_threads(1)
M, B, STEPS = 2, 2, 4
MESHES = {"zero3": {"dp": 4}, "hsdp": train.MESH, "hfsdp": train.MESH}
MUON_LR, ADAMW_LR = 0.02, 3e-3
DOCS_SECTION = "## Matrix optimizers: Muon on Whole main weights"
DOCS_MARKER = "# runs in tests/python/test_whole_muon.py (mpirun -np 4)"


def fp32_newton_schulz(grad, coefficients, steps, eps):
    """torch.optim.Muon's orthogonalisation (the quintic Newton-Schulz
    iteration X <- aX + (bA + cA^2)X, A = XX^T, on the matrix scaled to norm 1,
    the short side first) in fp32 instead of bf16: torch's bf16 rounding turns
    the 1e-7 differences of two summation orders of the same gradient into
    whole bf16 steps of single elements, which the iteration spreads (measured
    1.5e-3 relative after one step), so a 1e-5 comparison needs fp32."""
    a, b, c = coefficients
    x = grad.to(torch.float32, copy=True)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


class muon_precision:
    """with muon_precision("fp32"): torch.optim.Muon orthogonalises in fp32
    (fp32_newton_schulz); "bf16": as torch ships it."""

    def __init__(self, precision):
        self.precision = precision

    def __enter__(self):
        import torch.optim._muon as impl
        self.saved = impl._zeropower_via_newtonschulz
        if self.precision == "fp32":
            impl._zeropower_via_newtonschulz = fp32_newton_schulz
        return self

    def __exit__(self, *exc):
        import torch.optim._muon as impl
        impl._zeropower_via_newtonschulz = self.saved


class GluBlock(nn.Module):
    """Two matrices of different shapes: fc [4d, d] (gate and up, fused) and
    proj [d, 2d]; on 4 ranks a block has fewer matrices than ranks."""

    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.proj = nn.Linear(2 * d, d)

    def forward(self, x):
        gate, up = self.fc(self.ln(x)).chunk(2, dim=-1)
        return x + self.proj(F.silu(gate) * up)


class Glu(nn.Module):
    """A token embedding, GLU blocks, a final norm and an untied LM head."""

    def __init__(self, vocab=64, d=32, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(GluBlock(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_glu(seed=0):
    torch.manual_seed(seed)
    return Glu()


MODELS = {"gpt": gpt.make_model, "glu": make_glu}


def parse_tag(tag):
    """(model, layout, Newton-Schulz precision, whole_owners) of a run tag
    [MODEL/]LAYOUT[:bf16][:node]."""
    model, _, rest = tag.rpartition("/")
    layout, *opts = rest.split(":")
    return (model or "gpt", layout, "bf16" if "bf16" in opts else "fp32",
            "node" if "node" in opts else "mesh")


def file_tag(tag):
    return tag.replace("/", "_").replace(":", "_")


def is_matrix(name, shape):
    """Muon's share in both models, by name: the blocks' 2-D weights. The
    embeddings (GPT's tied to its LM head), the positions and Glu's untied
    head stay on AdamW, as in the reference Muon recipe."""
    return len(shape) == 2 and name.startswith("blocks.")


def whole_optimizers(named):
    """(Muon over the matrices, AdamW over the rest) of [(name, shape, param)];
    param-group lists, so that a rank holding none of a kind still builds both."""
    mats = [p for n, s, p in named if is_matrix(n, s)]
    rest = [p for n, s, p in named if not is_matrix(n, s)]
    return recipe(mats, rest)


def recipe(mats, rest):
    return (torch.optim.Muon([{"params": mats}], lr=MUON_LR, weight_decay=0.01),
            torch.optim.AdamW([{"params": rest}], lr=ADAMW_LR, weight_decay=0.1, foreach=False))


def adamw(params):
    return torch.optim.AdamW([{"params": params}], lr=ADAMW_LR, weight_decay=0.1, foreach=False)


def data(steps=STEPS):
    return gpt.make_data(steps, train.WORLD, M, B)


def shard_model(layout, seed=0, whole=True, model_name="gpt", owners="mesh"):
    import mfsdp
    import mfsdp.torch as mt
    model = MODELS[model_name](seed=seed)
    spec = mt.spec_from_module(model, mesh=MESHES[layout], layout=layout, microbatches=M,
                               matrix_optimizer="whole" if whole else None,
                               whole_owners=owners)
    sched = mfsdp.Schedule.compile(spec, name="whole_%s_%s" % (model_name, layout))
    return model, sched, mt.shard(model, sched, backend="mpi", timeout_ms=60000)


def run_step(sm, model, opts, rank, s, X, Y, norms=None):
    tot = 0.0
    for m in range(M):
        loss = model(X[s, rank, m], Y[s, rank, m])
        (loss / M).backward()
        tot += loss.item()
    if norms is not None:
        norms.append(sm.grad_norm())
    for o in opts:
        o.step()
    for o in opts:
        o.zero_grad()
    return sm.mean_over_ranks(tot / M)


def muon(out, rank, docs, tags):
    X, Y = data()
    for tag in tags:
        with muon_precision(parse_tag(tag)[2]):
            muon_run(out, rank, X, Y, tag)
    run_docs(docs, rank)


def muon_run(out, rank, X, Y, tag):
    """One run of the recipe: Muon over sm.whole_parameters(), AdamW over
    the other main parameters."""
    model_name, layout, _, owners = parse_tag(tag)
    model, sched, sm = shard_model(layout, model_name=model_name, owners=owners)
    mains = sm.main_parameters()
    mats = sm.whole_parameters()
    opts = recipe(mats, [p for p in mains if all(p is not q for q in mats)])
    held = {}
    mine = {n for n, _ in sm.named_main_parameters()}
    for t, v in zip(sched.tensors, sm.runtime.views):
        held[t.name] = {"whole": t.whole, "offset": v.shard_offset, "count": v.shard_count,
                        "main": t.name in mine, "coords": list(sm.runtime.coords)}
    shapes = {p.full_name: tuple(p.shape) for p in mains}
    losses, params, norms = [], [], []
    for s in range(STEPS):
        losses.append(run_step(sm, model, opts, rank, s, X, Y, norms))
        params.append({n: (off, mp.detach().clone()) for n, off, mp in sm.shards()})
    state = {p.full_name: tuple(st["momentum_buffer"].shape)
             for p, st in opts[0].state.items()}
    torch.save({"losses": losses, "params": params, "held": held, "shapes": shapes,
                "norms": norms,
                "muon_state": state,
                "muon_params": [p.full_name for p in opts[0].param_groups[0]["params"]]},
               os.path.join(out, "muon_%s.rank%d.pt" % (file_tag(tag), rank)))
    sm.close()


def run_docs(path, rank):
    """The docs' examples, as migration_worker runs its section's."""
    from migration_worker import run_examples
    run_examples(path, rank, DOCS_SECTION, DOCS_MARKER)


def gathered(sm, opt):
    """{name: {"main", "exp_avg", "exp_avg_sq"}} whole tensors on every rank, and
    the step count: the master weights (full_state_dict) and AdamW's moments
    gathered from every rank's shards (Runtime.gather_shard)."""
    full = sm.full_state_dict(rank0_only=False)
    by_name = {mp.full_name: mp for mp in sm.main_parameters()}
    out, steps = {}, set()
    for v in sm.runtime.views:
        mp = by_name.get(v.name)
        st = opt.state[mp] if mp is not None else None
        d = {"main": full[v.name]}
        for k in ("exp_avg", "exp_avg_sq"):
            d[k] = torch.from_numpy(sm.runtime.gather_shard(
                v.index, st[k].reshape(-1) if st is not None else None)).reshape(v.shape)
        if st is not None:
            steps.add(float(st["step"]))
        out[v.name] = d
    return out, steps


def ckpt(out, rank, port):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=train.WORLD)
    X, Y = data(3)
    res = {}
    # 1. Whole: 2 steps, then a checkpoint, a DCP and a Hugging Face export
    model, _, sm = shard_model("hfsdp")
    opt = adamw(sm.main_parameters())
    res["whole_losses"] = [run_step(sm, model, [opt], rank, s, X, Y) for s in range(2)]
    res["whole_shapes"] = {mp.full_name: tuple(mp.shape) for mp in sm.main_parameters()}
    res["whole_saved"], res["whole_steps"] = gathered(sm, opt)
    sm.save_checkpoint(os.path.join(out, "whole_ck"), opt)
    sm.save_dcp(os.path.join(out, "whole_dcp"), opt)
    sm.export_hf(os.path.join(out, "whole_hf"), dtype=torch.float32)
    sm.close()
    # 2. Flat, another seed: load the Whole checkpoint, one more step, save
    model, _, sm = shard_model("hfsdp", seed=5, whole=False)
    opt = adamw(sm.main_parameters())
    sm.load_checkpoint(os.path.join(out, "whole_ck"), opt)
    res["flat_loaded"], res["flat_loaded_steps"] = gathered(sm, opt)
    res["flat_loss"] = run_step(sm, model, [opt], rank, 2, X, Y)
    res["flat_saved"], _ = gathered(sm, opt)
    sm.save_checkpoint(os.path.join(out, "flat_ck"), opt)
    sm.close()
    # 3. Whole, another seed: load the Flat checkpoint
    model, _, sm = shard_model("hfsdp", seed=7)
    opt = adamw(sm.main_parameters())
    sm.load_checkpoint(os.path.join(out, "flat_ck"), opt)
    res["whole_loaded"], res["whole_loaded_steps"] = gathered(sm, opt)
    sm.close()
    # 4. FSDP2 (1-D mesh of 4) loads the Whole run's DCP
    model = gpt.make_model(seed=9)
    mesh = init_device_mesh("cpu", (train.WORLD,))
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    fopt = torch.optim.AdamW(model.parameters(), lr=ADAMW_LR, weight_decay=0.1, foreach=False)
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, fopt)}
    dcp.load(sd, checkpoint_id=os.path.join(out, "whole_dcp"))
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, fopt, sd["optim"])
    fsdp2 = {}
    for name, p in model.named_parameters():
        st = fopt.state[p]
        fsdp2[name] = {"main": p.full_tensor().detach().clone(),
                       "exp_avg": st["exp_avg"].full_tensor().clone(),
                       "exp_avg_sq": st["exp_avg_sq"].full_tensor().clone(),
                       "step": float(st["step"])}
    several(out, rank, dist)
    dist.destroy_process_group()
    if rank == 0:
        torch.save(res, os.path.join(out, "ckpt.pt"))
        torch.save(fsdp2, os.path.join(out, "dcp_fsdp2.pt"))


def main():
    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    if mode == "muon":
        muon(out, rank, sys.argv[3], sys.argv[4:])
    else:
        ckpt(out, rank, sys.argv[3])



def mains(sm):
    return {n: mp.detach().clone() for n, mp in sm.named_main_parameters()}


def diffs(a, b):
    """Elements of a and b (name -> tensor) that differ bitwise, and the names
    only one side has."""
    bad = sorted(set(a) ^ set(b))
    return bad, sum(int((a[n].view(torch.int32) != b[n].view(torch.int32)).sum())
                    for n in set(a) & set(b))


def refusals(sm, load, bad_lists):
    """{case: message} of load(optimizers) refused for each list, and the
    master weights' bitwise differences across the refused calls (0: untouched)."""
    from mfsdp import UsageError
    before, got = mains(sm), {}
    for case, opts in bad_lists.items():
        try:
            load(opts)
            got[case] = None
        except UsageError as e:
            got[case] = str(e)
    return got, diffs(before, mains(sm))


def several(out, rank, dist):
    """Muon + AdamW: resumes through save_checkpoint and save_dcp equal to
    the uninterrupted run, bit for bit; the refusals."""
    X, Y = data(4)

    def build(seed):
        model, _, sm = shard_model("hfsdp", seed=seed)
        mp = [(p.full_name, p.full_shape, p) for p in sm.main_parameters()]
        return model, sm, list(whole_optimizers(mp)), mp

    model, sm, opts, _ = build(0)
    losses = [run_step(sm, model, opts, rank, s, X, Y) for s in range(2)]
    muon_mats = {n: tuple(st["momentum_buffer"].shape) for n, st in
                 ((p.full_name, st) for p, st in opts[0].state.items())}
    sm.save_checkpoint(os.path.join(out, "two_ck"), opts)
    sm.save_dcp(os.path.join(out, "two_dcp"), tuple(opts))
    losses += [run_step(sm, model, opts, rank, s, X, Y) for s in range(2, 4)]
    want = mains(sm)
    sm.close()
    res = {"muon_mats": muon_mats, "losses": losses}
    for kind in ("ck", "dcp"):
        model, sm, opts, mp = build(5 if kind == "ck" else 7)
        load = (lambda o: sm.load_checkpoint(os.path.join(out, "two_ck"), o)) if kind == "ck" \
            else (lambda o: sm.load_dcp(os.path.join(out, "two_dcp"), o))
        moved = [p for n, s, p in mp if is_matrix(n, s)][:1]    # this rank's first matrix
        mats = [p for n, s, p in mp if is_matrix(n, s) and all(p is not q for q in moved)]
        vecs = [p for n, s, p in mp if not is_matrix(n, s)]
        rest = moved + vecs
        bad = {"count": opts + [torch.optim.SGD([{"params": []}], lr=0.1)]
               if kind == "ck" else opts[:1],
               "one": opts[0],
               "class": [opts[0], torch.optim.SGD([{"params": vecs}], lr=ADAMW_LR)],
               "swapped": [opts[1], opts[0]],
               "moved": [torch.optim.Muon([{"params": mats}], lr=MUON_LR, weight_decay=0.01),
                         torch.optim.AdamW([{"params": rest}], lr=ADAMW_LR, weight_decay=0.1,
                                           foreach=False)],
               "twice": [opts[0], torch.optim.AdamW([{"params": rest + mats[:1]}], lr=ADAMW_LR)]}
        if kind == "dcp":
            del bad["one"]       # a DCP does not say how many optimizers wrote it
        res[kind + "_refused"], res[kind + "_untouched"] = refusals(sm, load, bad)
        load(opts)
        res[kind + "_losses"] = [run_step(sm, model, opts, rank, s, X, Y) for s in range(2, 4)]
        res[kind + "_diffs"] = diffs(mains(sm), want)
        sm.close()
    every = [None] * train.WORLD
    dist.all_gather_object(every, res)
    if rank == 0:
        torch.save(every, os.path.join(out, "several.pt"))


if __name__ == "__main__":
    main()
