"""
test_fsdp2_flow: the FSDP2 way to build, launch and train a model works as
written (docs/pytorch.md, "Building on meta", "The units' order", "Same
start on every rank"), and each FSDP2 habit that cannot work names its
cause and fix.

Under one mpirun -np 4 (2 x 2 HFSDP, M = 2, fsdp2_flow_worker.py), against
single-process torch on the same global batch (losses and final parameters
within 1e-5 relative): a model built on meta and initialised after
fully_shard with HF's _init_weights (tinyllama, and transformers' Llama when
installed: the initial weights bit-equal to one process's init, at most one
unit whole at a time, the RSS growth of a 88 MB model's init about one unit);
a forward that calls its units in another order than registered and one
module three times; each decoder layer compiled before sharding; the default
units of a Llama (one per decoder layer); a loop without zero_grad (torch's
accumulation); nanoGPT's p.dim() grouping of the main parameters; ranks
seeded differently refused on every rank, also after a meta build.

In one process (local backend): the init and its refusals, loading weights
into a meta-built model (load_full_state_dict, import_hf), the order and a
repeated module, torch.compile of the whole sharded model, and the messages
of the habits: requires_grad_(False), .to(bf16), deepcopy (EMA), no_sync and
set_requires_gradient_sync on the model, a missing microbatches=, eval
without no_grad, torchrun on the CPU backend, units out of order with
mt.shard.
"""
import copy
import os

import pytest
import torch
import torch.nn as nn

import conftest
import fsdp2_flow_worker as W
import mfsdp
import mfsdp.torch as mt
import tinyllama

TOL = 1e-5
HAVE_HF = True
try:
    import transformers  # noqa: F401
except ImportError:
    HAVE_HF = False

MPI_RUNS = ["meta", "order", "nozero", "nanogpt", "compile", "seeds", "seeds_meta", "memory"]
HF_RUNS = ["meta_hf", "hf_units"]
mpi = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                         reason="libmfsdp built without the MPI backend")
hf = pytest.mark.skipif(not HAVE_HF, reason="transformers is not installed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("flow"))
    env = dict(os.environ, FLOW_COMPILE_BACKEND="aot_eager")   # inductor: by hand (docs)
    names = MPI_RUNS + (HF_RUNS if HAVE_HF else [])
    old = dict(os.environ)
    os.environ.update(env)
    try:
        p = conftest.run_ranks("fsdp2_flow_worker.py", [out] + names, timeout=840)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    errors = sorted(f for f in os.listdir(out) if f.endswith(".err"))
    got = {n: torch.load(os.path.join(out, n + ".pt")) for n in names
           if os.path.exists(os.path.join(out, n + ".pt"))}
    return got, errors, out


def result(runs, name):
    got, errors, out = runs
    mine = [e for e in errors if e.startswith(name + ".")]
    assert not mine, "\n".join(open(os.path.join(out, e)).read()[-2000:] for e in mine)
    return got[name]


def reference(model, hf_model=False, zero=True, groups=None, regression=False):
    """Single-process torch on the global batch (every rank's microbatches)."""
    opt = W.make_opt(groups if groups is not None else model.parameters())
    losses = []
    X, Y = W.regression_data() if regression else (W.data(), None)
    for s in range(W.STEPS):
        if regression:
            loss = model(X[s].reshape(-1, 16), Y[s].reshape(-1, 4))
        else:
            loss = W.loss_of(model, X[s].reshape(-1, W.SEQ), hf_model)
        loss.backward()
        opt.step()
        if zero:
            opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def errors(r, ref):
    losses, params = ref
    assert len(r["losses"]) == len(losses) == W.STEPS
    assert set(r["full"]) == set(params), (sorted(r["full"]), sorted(params))
    le = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], losses))
    pe = max(((r["full"][n] - p).abs().max() / p.abs().max()).item() for n, p in params.items())
    return le, pe


def check_meta(r, ref_model, hf_model):
    init = {n: p.detach().clone() for n, p in ref_model.named_parameters()}
    assert set(r["init"]) == set(init)
    assert all(torch.equal(r["init"][n], t) for n, t in init.items())   # bit for bit
    assert r["peak"] == r["unit"] < r["total"] / 2      # one unit whole at a time
    le, pe = errors(r, reference(ref_model, hf_model))
    print("meta: loss %.2e params %.2e, init peak %d of %d bytes" % (le, pe, r["peak"],
                                                                    r["total"]))
    assert le <= TOL and pe <= TOL


@mpi
def test_meta_init_trains_as_one_process(runs):
    r = result(runs, "meta")
    assert r["units"] == ["model.embed_tokens"] + ["model.layers.%d" % i for i in range(4)] + [
        "model.norm", "lm_head"]                  # per layer: the ModuleList below `model`
    check_meta(r, tinyllama.reference(), False)


@mpi
@hf
def test_meta_init_of_a_hugging_face_llama(runs):
    r = result(runs, "meta_hf")
    assert r["units"] == ["model.embed_tokens", "model.layers.0", "model.layers.1",
                          "model.layers.2", "model.norm", "lm_head"]
    check_meta(r, W.hf_reference(), True)


@mpi
def test_meta_init_memory_is_one_unit(runs):
    r = result(runs, "memory")
    print("init of a %.1f MB model: RSS +%.1f MB at most on a rank (a unit %.1f MB)" % (
        r["total"] / 2**20, r["growth_kb_max_rank"][0] / 1024, r["unit"] / 2**20))
    assert r["peak"] == r["unit"]
    assert r["growth_kb_max_rank"][0] * 1024 <= 2 * r["unit"] + (4 << 20) < r["total"] / 2


@mpi
def test_forward_order_and_a_module_called_three_times(runs):
    r = result(runs, "order")
    assert r["units"] == ["blocks.0", "norms.0", "shared", "blocks.1", "norms.1", "blocks.2",
                          "norms.2", "head"]
    assert "shared" in r["note"] and '"weight" [16] layout tied' in r["spec"]
    le, pe = errors(r, reference(W.interleaved(), regression=True))
    print("order: loss %.2e params %.2e" % (le, pe))
    assert le <= TOL and pe <= TOL


@mpi
def test_layers_compiled_before_sharding(runs):
    le, pe = errors(result(runs, "compile"), reference(tinyllama.reference()))
    print("compiled layers: loss %.2e params %.2e" % (le, pe))
    assert le <= TOL and pe <= TOL


@mpi
@hf
def test_default_units_of_a_llama(runs):
    r = result(runs, "hf_units")
    assert r["units"] == ["model.embed_tokens", "model.layers.0", "model.layers.1",
                          "model.layers.2", "model.norm", "lm_head"]
    assert 'unit "model.layers.{i}" for i in 0..3' in r["spec"]
    le, pe = errors(r, reference(W.hf_reference(), True))
    assert le <= TOL and pe <= TOL


@mpi
def test_no_zero_grad_accumulates_as_torch(runs):
    r = result(runs, "nozero")
    le, pe = errors(r, reference(tinyllama.reference(), zero=False))
    print("no zero_grad: loss %.2e params %.2e" % (le, pe))
    assert le <= TOL and pe <= TOL
    assert errors(r, reference(tinyllama.reference(), zero=True))[1] > 1e-3   # it matters


@mpi
def test_nanogpt_grouping_trains_as_torch(runs):
    r = result(runs, "nanogpt")
    ref = tinyllama.reference()
    le, pe = errors(r, reference(ref, groups=W.nanogpt_groups(ref.named_parameters())))
    assert le <= TOL and pe <= TOL
    assert all(n.endswith("norm.weight") for n in r["groups"][1])      # 1-D: no decay
    assert any(n.endswith("proj.weight") for n in r["groups"][0])
    flat = tinyllama.reference()                  # every tensor without decay: differs
    groups = [{"params": list(flat.parameters()), "weight_decay": 0.0}]
    assert errors(r, reference(flat, groups=groups))[1] > 1e-3


@mpi
@pytest.mark.parametrize("name", ["seeds", "seeds_meta"])
def test_ranks_seeded_differently_are_refused(runs, name):
    got, errs, out = runs
    assert not [e for e in errs if e.startswith(name + ".")]
    for rank in range(4):
        with open(os.path.join(out, "%s.rank%d.refused" % (name, rank))) as f:
            text = f.read()
        assert "the ranks start from different values of" in text, text
        assert "torch.manual_seed(seed) on every rank" in text and "model.embed_tokens" in text
    assert ("after the init" in text) == (name == "seeds_meta")


# ---- one process ----

def one(model, **kw):
    kw.setdefault("mesh", {"dp": 1})
    kw.setdefault("layout", "zero3")
    return mt.fully_shard(model, backend="local", **kw)


def refused(fn, *needles):
    with pytest.raises(mfsdp.UsageError) as e:
        fn()
    text = str(e.value)
    for n in needles:
        assert n in text, (n, text)
    assert text.count("(MFSDP_ERR_INVALID_USAGE)") == 1, text
    return text


def ids(seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 96, (2, 10), generator=g)


def test_meta_init_one_process_bit_equal():
    ref = tinyllama.reference()
    model = tinyllama.on_meta()
    sm = one(model, microbatches=1)
    model.to_empty(device="cpu")
    model.apply(model._init_weights)
    full = sm.full_state_dict()
    assert all(torch.equal(full[n], p.detach()) for n, p in ref.named_parameters())
    assert torch.equal(model.model.inv_freq, ref.model.inv_freq)      # the buffer, by the init
    x = ids()
    assert model(x, x).item() == ref(x, x).item()
    sm.close()


def test_meta_model_without_init_is_refused():
    model = tinyllama.on_meta()
    sm = one(model)
    model.to_empty(device="cpu")
    x = ids()
    refused(lambda: model(x, x), "never initialised", "model.apply(model._init_weights)",
            "sm.load_dcp")
    sm.close()
    model = tinyllama.on_meta()
    sm = one(model)
    model.apply(model._init_weights)          # no to_empty: the buffer is still on meta
    refused(lambda: model(x, x), "buffer 'model.inv_freq'", "still on meta",
            "model.to_empty(device=...)")
    sm.close()


def test_weights_loaded_into_a_meta_build(tmp_path):
    """load_full_state_dict and import_hf write the shards straight away: no init."""
    from safetensors.torch import save_file
    ref = tinyllama.reference(seed=7)
    save_file({n: p.detach().contiguous() for n, p in ref.named_parameters()},
              str(tmp_path / "model.safetensors"))
    x = ids()
    for how in ("full", "hf"):
        model = tinyllama.on_meta()
        sm = one(model)
        model.to_empty(device="cpu")
        model.model.inv_freq.copy_(ref.model.inv_freq)
        if how == "full":
            sm.load_full_state_dict(ref.state_dict())
        else:
            sm.import_hf(str(tmp_path))
        assert model(x, x).item() == ref(x, x).item(), how
        sm.close()


def test_half_on_meta_is_refused():
    model = tinyllama.reference()
    model.lm_head.weight = nn.Parameter(torch.empty(96, 32, device="meta"))
    refused(lambda: one(model), "on meta", "build it wholly on meta")


def test_order_and_repeated_module_one_process():
    model, ref = W.interleaved(), W.interleaved()
    sm = one(model, microbatches=2)
    opt = W.make_opt(sm.main_parameters())
    X, Y = W.regression_data()
    rl = ref(X[0, 0, 0], Y[0, 0, 0]) + ref(X[0, 0, 1], Y[0, 0, 1])
    (rl / 2).backward()
    got = 0.0
    for m in range(2):
        loss = model(X[0, 0, m], Y[0, 0, m])
        (loss / 2).backward()
        got += loss.item()
    assert abs(got - rl.item()) <= 1e-6 * abs(rl.item())
    assert sm.schedule.units[:3] == ["blocks.0", "norms.0", "shared"]
    opt.step()
    sm.close()


def test_units_out_of_order_with_shard_name_units():
    model = W.interleaved()
    sched = mfsdp.Schedule.compile(mt.spec_from_module(model, {"dp": 1}, layout="zero3"))
    sm = mt.shard(model, sched, backend="local")
    X, Y = W.regression_data()
    refused(lambda: model(X[0, 0, 0], Y[0, 0, 0]), "unit 'blocks.0' began its forward",
            "expects unit 'norms.0' next", "units=[...]")
    sm.close()


def test_torch_compile_of_the_sharded_model_trains_as_torch():
    model, ref = tinyllama.reference(), tinyllama.reference()
    sm = one(model)
    compiled = torch.compile(model, backend="aot_eager")   # graph breaks at the unit hooks
    opt, ropt = W.make_opt(sm.main_parameters()), W.make_opt(ref.parameters())
    for s in range(2):
        x = ids(s)
        loss, rloss = compiled(x, x), ref(x, x)
        loss.backward()
        rloss.backward()
        assert abs(loss.item() - rloss.item()) <= 1e-6 * rloss.item()
        opt.step(); opt.zero_grad(); ropt.step(); ropt.zero_grad()
    sm.close()


def test_habits_name_their_cause_and_fix():
    model = tinyllama.reference()
    sm = one(model, microbatches=1)
    refused(lambda: model.lm_head.weight.requires_grad_(False),
            "requires_grad_(False) on parameter 'lm_head.weight'", "frozen parameters",
            "lr=0.0")
    refused(lambda: model.requires_grad_(False), "frozen parameters")
    refused(lambda: model.to(torch.bfloat16), "from torch.float32 to torch.bfloat16",
            "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)")
    refused(model.half, "mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16)")
    refused(lambda: copy.deepcopy(model), "copy.deepcopy of a sharded model", "For an EMA",
            "sm.main_parameters()", "lerp_")
    for call in (lambda: sm.no_sync(), lambda: model.no_sync(),
                 lambda: model.set_requires_gradient_sync(False)):
        refused(call, "microbatches=M")
    assert model.to("cpu") is model and model.to_empty(device="cpu") is model   # no-ops
    x = ids()
    model(x, x).backward()                        # a step of M = 1
    refused(lambda: model(x, x), "microbatches=N to mt.fully_shard", "optimizer.step()")
    torch.optim.SGD(sm.main_parameters(), lr=0.1).zero_grad()
    model.eval()
    with pytest.warns(UserWarning, match="eval mode with grad enabled begins a training step"):
        model(x, x)                               # eval mode, grad on: a training forward
    refused(lambda: model(x, x), "no loss.backward() followed", "torch.no_grad()",
            "model.eval() alone does not turn off autograd")
    sm.close()
    sm = one(tinyllama.reference())
    sm.close()
    refused(lambda: model.parameters().__next__().add(1), "closed")


def test_torchrun_on_the_cpu_backend_names_mpirun(monkeypatch):
    for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE",
              "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    model = tinyllama.reference()
    refused(lambda: mt.fully_shard(model, mesh={"dp": 4}, layout="zero3", backend="mpi"),
            "under torchrun (WORLD_SIZE=4", "mpirun -np 4")


def test_reset_parameters_of_a_tied_model_on_meta():
    """torch's own init (each module's reset_parameters) on a model built on
    meta whose LM head shares the embedding's weight: the tie is initialised
    twice, as in one process (its unit made whole again from the shards)."""
    import gpt

    def build():
        torch.manual_seed(4)
        with torch.device("meta"):
            return gpt.GPT()

    def init(m):
        for mod in m.modules():
            if hasattr(mod, "reset_parameters"):
                mod.reset_parameters()
    ref = build()
    ref.to_empty(device="cpu")
    ref.lm_head.weight = ref.wte.weight       # to_empty unties a meta model (mfsdp's stays tied)
    init(ref)
    model = build()
    sm = one(model)
    model.to_empty(device="cpu")
    init(model)
    full = sm.full_state_dict()
    assert all(torch.equal(full[n], p.detach()) for n, p in ref.named_parameters())
    x, y = gpt.make_data(1, 1, 1, 2)
    assert model(x[0, 0, 0], y[0, 0, 0]).item() == ref(x[0, 0, 0], y[0, 0, 0]).item()
    sm.close()


def test_dcp_loaded_into_a_meta_build(tmp_path):
    ref = tinyllama.reference(seed=9)
    sm = one(ref)
    sm.save_dcp(str(tmp_path / "ck"))
    sm.close()
    want = tinyllama.reference(seed=9)
    model = tinyllama.on_meta()
    sm = one(model)
    model.to_empty(device="cpu")
    model.model.inv_freq.copy_(want.model.inv_freq)
    sm.load_dcp(str(tmp_path / "ck"))
    full = sm.full_state_dict()
    assert all(torch.equal(full[n], p.detach()) for n, p in want.named_parameters())
    x = ids()
    assert model(x, x).item() == want(x, x).item()
    sm.close()


@pytest.mark.parametrize("how", ["model", "sm", "none"])
def test_zero_grad_of_the_model_or_none_as_torch(how):
    """HF Trainer's model.zero_grad() (or sm.zero_grad()) clears the master
    shards' gradient as FSDP2's clears its sharded parameters'; no zero_grad
    at all accumulates, as torch does."""
    model, ref = tinyllama.reference(), tinyllama.reference()
    sm = one(model)
    opt, ropt = W.make_opt(sm.main_parameters()), W.make_opt(ref.parameters())
    for s in range(3):
        x = ids(s)
        loss, rloss = model(x, x), ref(x, x)
        assert abs(loss.item() - rloss.item()) <= 1e-6 * rloss.item(), (how, s)
        loss.backward()
        rloss.backward()
        opt.step()
        ropt.step()
        if how != "none":
            (model if how == "model" else sm).zero_grad()
            ref.zero_grad()
    sm.close()


def test_a_parameter_replaced_after_sharding_is_refused():
    """An init that sets a new nn.Parameter instead of writing in place."""
    model = tinyllama.on_meta()
    sm = one(model)
    model.to_empty(device="cpu")
    model.apply(model._init_weights)
    model.lm_head.weight = nn.Parameter(torch.zeros(96, 32))   # while its unit is whole
    x = ids()
    refused(lambda: model(x, x), "parameter 'lm_head.weight' was replaced after sharding",
            "initialise in place")
    sm.close()
    model = tinyllama.reference()                  # not on meta: the stand-in replaced
    sm = one(model)
    model.model.norm.weight = nn.Parameter(torch.ones(32))
    refused(lambda: model(x, x), "parameter 'model.norm.weight' was replaced after sharding")
    sm.close()
