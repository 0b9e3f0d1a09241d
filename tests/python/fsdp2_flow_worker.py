"""
fsdp2_flow_worker: one MPI rank of test_fsdp2_flow.py (mpirun -np 4, 2 x 2
HFSDP, M = 2 microbatches, SGD with momentum, 3 steps). Runs each scenario named on the
command line in one launch; rank 0 writes OUT/<scenario>.pt (losses as the
mean over ranks, full parameters, and what the scenario measures); a
scenario that raises writes {"error": text} from every rank that raised
(OUT/<scenario>.rank<r>.err).

    mpirun -np 4 python fsdp2_flow_worker.py OUT meta order compile seeds ...

Scenarios (the test holds each against single-process torch, or checks its
refusal):
  meta        tinyllama built on meta, fully_shard, to_empty, apply(_init_weights):
              the initial full weights, the init's peak of whole bytes, training
  meta_hf     the same with Hugging Face's LlamaForCausalLM (transformers)
  memory      a 90 MB tinyllama built on meta: RSS growth during the init
  order       units called in another order than registered, a module called twice
  compile     tinyllama with each decoder layer compiled before sharding
  compile_hf  the same with LlamaForCausalLM
  hf_units    LlamaForCausalLM with default units: the spec's units, training
  seeds       each rank seeded with its rank: refused, on every rank
  seeds_meta  the same for a model built on meta (refused at the first forward)
  nozero      a loop without optimizer.zero_grad(): .grad accumulates as torch's
  nanogpt     nanoGPT's configure_optimizers grouping by p.dim() >= 2
"""
import os
import resource
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import tinyllama

torch.set_num_threads(1)
STEPS, M, B, SEQ = 3, 2, 2, 12
MESH = {"dp_outer": 2, "dp_inner": 2}


def make_opt(params):
    """SGD with momentum: linear in the gradient, so the parameters of two
    summation orders stay within rounding (AdamW divides near-zero gradients
    of tiny-init attention weights by their own noise: docs/pytorch.md)."""
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def hf_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       attn_implementation="eager")


def hf_meta(seed=0):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    with torch.device("meta"):
        return LlamaForCausalLM(hf_config())


def hf_reference(seed=0):
    m = hf_meta(seed)
    m.to_empty(device="cpu")
    m.apply(m._init_weights)
    return m


def data(vocab=96, seed=1):
    """tokens[step][rank][m]: [B, SEQ] each."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (STEPS, 4, M, B, SEQ), generator=g)


def loss_of(model, ids, hf):
    return model(input_ids=ids, labels=ids).loss if hf else model(ids, ids)


class Interleaved(nn.Module):
    """Norms in one ModuleList, blocks in another, the forward alternating
    them (registration order: all norms, then all blocks), and one norm
    called after every block (a module called three times per forward)."""

    def __init__(self, d=16, n=3):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n))
        self.blocks = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.shared = nn.LayerNorm(d)
        self.head = nn.Linear(d, 4)

    def forward(self, x, y):
        for blk, norm in zip(self.blocks, self.norms):
            x = self.shared(norm(F.gelu(blk(x))))
        return F.mse_loss(self.head(x), y)


def interleaved(seed=0):
    torch.manual_seed(seed)
    m = Interleaved()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
    return m


def regression_data(seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(STEPS, 4, M, 4, 16, generator=g), torch.randn(STEPS, 4, M, 4, 4, generator=g)


def nanogpt_groups(named, weight_decay=0.1):
    """nanoGPT's configure_optimizers: weight decay for every tensor of 2 or more dims."""
    params = {n: p for n, p in named if p.requires_grad}
    decay = [p for p in params.values() if p.dim() >= 2]
    nodecay = [p for p in params.values() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": nodecay, "weight_decay": 0.0}]


def train(sm, model, rank, hf=False, opt=None, zero=True, regression=False):
    opt = opt or make_opt([{"params": sm.main_parameters()}])   # a rank may hold no shard
    losses = []
    if regression:
        X, Y = regression_data()
    else:
        X = data()
    for s in range(STEPS):
        tot = 0.0
        for m in range(M):
            if regression:
                loss = model(X[s, rank, m], Y[s, rank, m])
            else:
                loss = loss_of(model, X[s, rank, m], hf)
            (loss / M).backward()
            tot += loss.item()
        opt.step()
        if zero:
            opt.zero_grad()
        losses.append(sm.mean_over_ranks(tot / M))
    return losses


def shard(model, **kw):
    import mfsdp.torch as mt
    return mt.fully_shard(model, mesh=MESH, layout="hfsdp", microbatches=M, backend="mpi",
                          timeout_ms=60000, **kw)


def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def unit_bytes(sm):
    """(the largest unit's, the whole model's) bytes in fp32."""
    per = [sum(v.numel for v in sm.runtime.views if v.name.startswith(u + "."))
           for u in sm.schedule.units]
    return 4 * max(per), 4 * sum(v.numel for v in sm.runtime.views)


def meta(rank, hf=False):
    model = hf_meta() if hf else tinyllama.on_meta()
    sm = shard(model)
    model.to_empty(device="cpu")
    model.apply(model._init_weights)
    init = sm.full_state_dict()
    biggest, total = unit_bytes(sm)
    out = {"init": init, "peak": sm.init_peak_bytes, "unit": biggest, "total": total,
           "units": list(sm.schedule.units)}
    out["losses"] = train(sm, model, rank, hf=hf)
    out["full"] = sm.full_state_dict()
    sm.close()
    return out


def memory(rank):
    model = tinyllama.on_meta(vocab=1024, d=512, heads=8, ff=1024, layers=8)
    sm = shard(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in sm.main_parameters():
            p.zero_()                      # the shards' own pages counted before the init
    before, peak_before = rss_kb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model.apply(model._init_weights)
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    biggest, total = unit_bytes(sm)
    sm._between_steps("measure")           # the last unit given back to its shards
    out = {"growth_kb": max(0, peak_after - max(before, peak_before)),
           "rss_before_kb": before, "peak_before_kb": peak_before, "peak_after_kb": peak_after,
           "unit": biggest, "total": total, "peak": sm.init_peak_bytes}
    growth = sm.allreduce([out["growth_kb"]], "max")
    out["growth_kb_max_rank"] = growth
    sm.close()
    return out


def order(rank):
    model = interleaved()
    sm = shard(model)
    out = {"registered": [n for n, _ in model.named_children()]}
    out["losses"] = train(sm, model, rank, regression=True)
    out["units"], out["note"], out["spec"] = list(sm.schedule.units), sm.order_note, sm.spec
    out["full"] = sm.full_state_dict()
    sm.close()
    return out


def compile_layers(model, layers):
    for layer in layers:
        layer.compile(backend=os.environ.get("FLOW_COMPILE_BACKEND", "inductor"))
    return model


def compiled(rank, hf=False):
    if hf:
        model = hf_reference()
        layers = model.model.layers
    else:
        model = tinyllama.reference()
        layers = model.model.layers
    compile_layers(model, layers)
    sm = shard(model)
    out = {"losses": train(sm, model, rank, hf=hf), "units": list(sm.schedule.units)}
    out["full"] = sm.full_state_dict()
    sm.close()
    return out


def hf_units(rank):
    model = hf_reference()
    sm = shard(model)
    out = {"units": list(sm.schedule.units), "spec": sm.spec,
           "losses": train(sm, model, rank, hf=True)}
    out["full"] = sm.full_state_dict()
    sm.close()
    return out


def seeds(rank, on_meta=False):
    """Each rank seeded with its own rank: refused where mfsdp compares."""
    import mfsdp
    if on_meta:
        model = tinyllama.on_meta(seed=rank)
        sm = shard(model)
        model.to_empty(device="cpu")
        model.apply(model._init_weights)
    else:
        model = tinyllama.reference(seed=rank)
        sm = None
    try:
        if sm is None:
            sm = shard(model)
        train(sm, model, rank)
    except mfsdp.UsageError as e:
        if sm is not None:
            sm.close()
        return {"refused": str(e)}
    sm.close()
    return {"refused": None}


def nozero(rank):
    model = tinyllama.reference()
    sm = shard(model)
    out = {"losses": train(sm, model, rank, zero=False), "full": sm.full_state_dict()}
    sm.close()
    return out


def nanogpt(rank):
    model = tinyllama.reference()
    sm = shard(model)
    opt = make_opt(nanogpt_groups(sm.named_main_parameters()))
    out = {"groups": [sorted(p.full_name for p in g["params"]) for g in opt.param_groups]}
    out["losses"] = train(sm, model, rank, opt=opt)
    out["full"] = sm.full_state_dict()
    sm.close()
    return out


SCENARIOS = {
    "meta": meta, "meta_hf": lambda r: meta(r, hf=True), "memory": memory, "order": order,
    "compile": compiled, "compile_hf": lambda r: compiled(r, hf=True), "hf_units": hf_units,
    "seeds": seeds, "seeds_meta": lambda r: seeds(r, on_meta=True), "nozero": nozero,
    "nanogpt": nanogpt,
}


def main():
    import mfsdp.torch  # noqa: F401  (MPI is initialised by the first runtime)
    out = sys.argv[1]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    for name in sys.argv[2:]:
        try:
            result = SCENARIOS[name](rank)
        except Exception as e:          # reported by the test, with the rank
            import traceback
            with open(os.path.join(out, "%s.rank%d.err" % (name, rank)), "w") as f:
                f.write("%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()))
            continue
        if name.startswith("seeds"):
            with open(os.path.join(out, "%s.rank%d.refused" % (name, rank)), "w") as f:
                f.write(result["refused"] or "")
        if rank == 0:
            torch.save(result, os.path.join(out, name + ".pt"))


if __name__ == "__main__":
    main()
