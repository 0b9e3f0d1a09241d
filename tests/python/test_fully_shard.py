"""
test_fully_shard: mt.fully_shard, FSDP2's one call with its knobs by name
(docs/pytorch.md, "One call: fully_shard").

Under one mpirun -np 4 (2 x 2 mesh, GPT model, AdamW, 5 steps of 2
microbatches; fully_shard_worker.py): fp32 HFSDP against single-process
torch; torch's own MixedPrecisionPolicy (bf16 params, fp32 reduce, fp32
output) against FSDP2 itself with the same policy on gloo and against
single-process torch with the same casts; reshard_after_forward per unit in
the spec, the compiled schedule, the collectives and the peak bytes, with
bitwise the same training; the schedule cache shared by the 4 racing ranks
(each rank hits or compiles once; the second call hits on every rank).

In one process (local backend, a world of one): each FSDP2 habit refused at
its call naming the fix (an int reshard_after_forward, fully_shard per block
then on the root, a second call, set_requires_gradient_sync and the other
FSDPModule methods, sm.parameters() for the optimizer, an optimizer over
model.parameters(), clip_grad_norm_ over model.parameters(), dtypes mfsdp
cannot hold); the policy's casts against plain torch with the same casts;
the cache's corrupt, forged, changed-spec, new-compiler and unwritable cases.
"""
import os
import stat
import warnings

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import conftest
import fully_shard_worker as W
import gpt
import mfsdp
import mfsdp.compile
import mfsdp.torch as mt
import train
from mfsdp.compile import mfsdpc_path
from mfsdp.torch.fully_shard import FSDP_METHODS, cache_stats, compile_cached, schedule_key

FP32_TOL = 1e-5
# bf16 compute against single-process torch: docs/pytorch.md's bf16 bound
# (the microbatches and the one global batch sum in different orders in bf16)
BF16_LOSS_TOL, BF16_PARAM_TOL = 1.5e-2, 1.2e-1
RUNS = ["fp32", "bf16", "reshard_blocks", "reshard_all", "again"]

mpi = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                         reason="libmfsdp built without the MPI backend")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fully_shard"))
    old = os.environ.get("MFSDP_CACHE_DIR")
    os.environ["MFSDP_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))   # empty: ranks race
    try:
        p = conftest.run_ranks("fully_shard_worker.py",
                               [out] + RUNS + ["fsdp2", str(conftest.free_port())], timeout=300)
    finally:
        if old is None:
            del os.environ["MFSDP_CACHE_DIR"]
        else:
            os.environ["MFSDP_CACHE_DIR"] = old
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return {n: torch.load(os.path.join(out, n + ".pt")) for n in RUNS + ["fsdp2_bf16"]}


def param_err(full, ref):
    assert set(full) == set(ref), (sorted(full), sorted(ref))
    return max(((full[n] - p.detach()).abs().max() / p.detach().abs().max()).item()
               for n, p in ref.items())


def loss_err(a, b):
    assert len(a) == len(b) == W.STEPS
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@mpi
def test_fp32_matches_single_process_torch(runs):
    losses, ref, _ = train.reference_train(W.config("fp32"))
    le, pe = loss_err(runs["fp32"]["losses"], losses), param_err(runs["fp32"]["full"], ref)
    print("fp32: loss %.2e, params %.2e" % (le, pe))
    assert le <= FP32_TOL and pe <= FP32_TOL


@mpi
def test_bf16_policy_matches_fsdp2_and_torch(runs):
    r = runs["bf16"]
    assert r["facts"] == [("bf16", "fp32", "fp32")]       # weight, grad, main_weight
    assert r["dtypes"] == ["torch.float32"]               # output_dtype on the root's output
    f = runs["fsdp2_bf16"]
    le, pe = loss_err(r["losses"], f["losses"]), param_err(r["full"], f["full"])
    print("bf16 vs FSDP2: loss %.2e, params %.2e" % (le, pe))
    assert le <= FP32_TOL and pe <= FP32_TOL      # the same casts; only fp32 sums' order differs
    losses, ref, _ = train.reference_train(W.config("bf16"))
    le, pe = loss_err(r["losses"], losses), param_err(r["full"], ref)
    print("bf16 vs single-process torch: loss %.2e, params %.2e" % (le, pe))
    assert le <= BF16_LOSS_TOL and pe <= BF16_PARAM_TOL
    assert param_err(r["full"], {n: t for n, t in runs["fp32"]["full"].items()}) > 1e-3  # bf16 ran


@mpi
def test_reshard_after_forward_per_unit(runs):
    base, blocks, every = runs["fp32"], runs["reshard_blocks"], runs["reshard_all"]
    assert 'unit "blocks.{i}" for i in 0..4 layout hfsdp {\n  reshard_after_forward false;' \
        in blocks["spec"]
    assert "reshard_after_forward false" not in every["spec"]
    names = ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f"]
    assert base["units"] == dict(zip(names, [True] * 6 + [False]))
    assert blocks["units"] == dict(zip(names, [True, True] + [False] * 5))
    assert every["units"] == dict(zip(names, [True] * 7))
    # dp_inner all-gathers: a unit kept from forward to backward is not gathered again
    mb = W.STEPS * W.M
    assert blocks["collectives"][1] == base["collectives"][1] - 4 * mb
    assert every["collectives"][1] == base["collectives"][1] + mb
    assert blocks["collectives"][0] == base["collectives"][0] == every["collectives"][0]
    assert blocks["peak"] > base["peak"]          # four blocks' weights live across the turn
    for r in (blocks, every):                     # the same numbers, bit for bit
        assert r["losses"] == base["losses"]
        assert all(torch.equal(r["full"][n], base["full"][n]) for n in base["full"])


@mpi
def test_cache_shared_by_racing_ranks(runs):
    for name in ("fp32", "bf16", "reshard_blocks"):     # a new spec: each rank hits or compiles
        r = runs[name]
        assert r["compiles"] >= 1 and r["hits"] + r["compiles"] == 4, (name, r["hits"],
                                                                      r["compiles"])
    assert (runs["again"]["hits"], runs["again"]["compiles"]) == (4, 0)   # the second call


# ---- one process ----

def one(model=None, **kw):
    model = model or gpt.make_model()
    kw.setdefault("mesh", {"dp": 1})
    kw.setdefault("layout", "zero3")
    return model, mt.fully_shard(model, backend="local", **kw)


def refused(fn, *needles):
    with pytest.raises(mfsdp.UsageError) as e:
        fn()
    for n in needles:
        assert n in str(e.value), (n, str(e.value))
    return str(e.value)


def step(sm, model, s=0):
    X, Y = gpt.make_data(s + 1, 1, 1, 2)
    loss = sm(X[s, 0, 0], Y[s, 0, 0])
    loss.backward()
    return loss


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MFSDP_CACHE_DIR", str(tmp_path / "cache"))


def test_int_reshard_after_forward_refused():
    model = gpt.make_model()
    refused(lambda: mt.fully_shard(model, mesh={"dp": 1}, reshard_after_forward=2,
                                   backend="local"), "reshard_after_forward=2", "not supported")
    refused(lambda: mt.fully_shard(model, mesh={"dp": 1}, reshard_after_forward={"blocks.*": 2},
                                   backend="local"), "reshard_after_forward['blocks.*']=2")
    refused(lambda: mt.fully_shard(model, mesh={"dp": 1}, reshard_after_forward={"nope": False},
                                   backend="local"), "'nope'")


def test_per_block_then_root_refused():
    model = gpt.make_model()
    blk = mt.fully_shard(model.blocks[0], mesh={"dp": 1}, layout="zero3", backend="local")
    msg = refused(lambda: mt.fully_shard(model, mesh={"dp": 1}, backend="local"),
                  "fully_shard(model.blocks.0)", "units=")
    assert "close()" in msg
    blk.close()
    refused(lambda: mt.fully_shard([model.blocks[1], model.blocks[2]], mesh={"dp": 1}),
            "units=")


def test_second_call_refused():
    model, sm = one()
    refused(lambda: mt.fully_shard(model, mesh={"dp": 1}, backend="local"), "already sharded")
    refused(lambda: mt.fully_shard(sm, mesh={"dp": 1}, backend="local"), "sharded already")
    sm.close()
    refused(lambda: mt.fully_shard(model, mesh={"dp": 1}, backend="local"), "fresh model")


def test_fsdp_module_methods():
    model, sm = one()
    msg = refused(lambda: sm.set_requires_gradient_sync(False), "microbatches=M", "hsdp_nosync",
                  "[Partial, Partial]", "set_requires_all_reduce(False)")
    assert "last microbatch" in msg
    for name in FSDP_METHODS:
        refused(lambda: getattr(sm, name)(False), name)
    refused(lambda: sm.set_reshard_after_forward(False), "reshard_after_forward=")
    refused(lambda: sm.set_modules_to_forward_prefetch([]), "prefetch=N")
    refused(lambda: sm.set_custom_all_gather(None), "no mfsdp counterpart")
    with pytest.raises(AttributeError):
        sm.no_such_method
    sm.reshard()                                   # between steps: everything is sharded
    X, Y = gpt.make_data(1, 1, 1, 2)
    loss = sm(X[0, 0, 0], Y[0, 0, 0])
    refused(sm.reshard, "inside a step")
    loss.backward()
    assert sm.module is model and sm.spec.startswith("# generated by mfsdp.torch")
    assert "mesh dp = 1;" in sm.spec and sm.schedule.units[0] == "wte"
    sm.close()


def test_optimizer_over_model_parameters_refused():
    model, sm = one()
    refused(sm.parameters, "sm.main_parameters()")
    refused(sm.named_parameters, "sm.named_main_parameters()")
    refused(sm.state_dict, "sm.full_state_dict()")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)    # model is sharded in place
    step(sm, model)
    refused(opt.step, "AdamW.step() over parameter", "sm.main_parameters()")
    sm.close()


def test_clip_grad_norm_over_model_parameters_refused():
    model, sm = one()
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.1)
    for s in range(2):
        step(sm, model, s)
        refused(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0),
                "sm.clip_grad_norm_", "'wte.weight'")
        norm = sm.clip_grad_norm_(1.0)             # the fix: the global norm over the shards
        assert norm.item() > 0.0
        model.zero_grad(set_to_none=(s == 0))      # both forms still work
        sm.zero_grad()
        opt.step()
        opt.zero_grad()
    sm.close()


def test_dtypes_mfsdp_cannot_hold_refused():
    model = gpt.make_model()

    def fs(**kw):
        return lambda: mt.fully_shard(model, mesh={"dp": 1}, backend="local", **kw)
    refused(fs(mp_policy=MixedPrecisionPolicy(param_dtype=torch.float64)),
            "param_dtype=torch.float64", "torch.bfloat16")
    refused(fs(mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.int8)), "reduce_dtype")
    refused(fs(mp_policy=MixedPrecisionPolicy(output_dtype=torch.int32)), "output_dtype")
    refused(fs(mp_policy="bf16"), "not a MixedPrecisionPolicy")
    refused(fs(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                              param_dtype_override_fn=lambda p: None)),
            "param_dtype_override_fn")
    refused(fs(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16), dtype="bf16"),
            "give one of them")
    refused(fs(timeout=5), "unknown option 'timeout'", "timeout_ms")
    refused(lambda: mt.fully_shard(gpt.make_model().double(), mesh={"dp": 1}), "float64")
    assert mt.MixedPrecisionPolicy is MixedPrecisionPolicy


class Net(nn.Module):
    """Two units on a float input; each records the dtype it receives."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.seen = []

    def forward(self, x):
        self.seen.append(("root", x.dtype))
        return self.b(torch.tanh(self.a(x)))


def record(net):
    for name in ("a", "b"):
        getattr(net, name).register_forward_pre_hook(
            lambda mod, args, name=name: net.seen.append((name, args[0].dtype)))


def test_policy_casts_match_torch():
    x = torch.randn(5, 8)
    with torch.no_grad():                          # plain torch: bf16 weights, bf16 input
        want = Net().to(torch.bfloat16)(x.bfloat16()).float()
    for out_dt in (None, torch.float32):
        net = Net()
        record(net)           # registered before the casts: sees what the unit's forward gets
        pol = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                   output_dtype=out_dt)
        _, sm = one(net, mp_policy=pol, layout="zero3")
        with torch.no_grad():
            sm(x)             # the first call also runs the forward on meta (order.py)
        net.seen.clear()
        y = sm(x)
        assert y.dtype == (out_dt or torch.bfloat16)
        assert net.seen == [("root", torch.bfloat16), ("a", torch.bfloat16),
                            ("b", torch.bfloat16)]
        assert torch.equal(y.float(), want)        # the same casts as plain torch
        y.float().sum().backward()
        sm.close()
    net = Net()                                    # no input cast: the unit gets fp32
    _, sm = one(net, mp_policy=MixedPrecisionPolicy(cast_forward_inputs=False))
    with torch.no_grad():
        sm(x)
    net.seen.clear()
    assert sm(x).dtype == torch.float32 and net.seen == [("root", torch.float32)]
    sm.close()


def test_cache_hits_and_changed_spec_misses(tmp_path):
    model, sm = one()
    first, c0 = sm.cache_status, cache_stats["compiles"]
    sm.close()
    model, sm = one()
    assert (first, sm.cache_status, cache_stats["compiles"]) == ("miss", "hit", c0)
    sm.close()
    model, sm = one(microbatches=2)                 # another spec
    assert sm.cache_status == "miss" and cache_stats["compiles"] == c0 + 1
    sm.close()
    model, sm = one(cache=False)
    assert sm.cache_status == "off" and cache_stats["compiles"] == c0 + 2
    sm.close()


def test_cache_corrupt_or_forged_entry_recompiled(tmp_path):
    spec = mt.spec_from_module(gpt.make_model(), {"dp": 1}, layout="zero3")
    good, status = compile_cached(spec)
    assert status == "miss"
    path = os.path.join(os.environ["MFSDP_CACHE_DIR"], schedule_key(spec) + ".yaml")
    data = open(path, "rb").read()
    import hashlib
    body = b"format: mfsdp-schedule/4\nnot a schedule\n"
    forged = b"mfsdp-schedule-cache 1 " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    other = mfsdp.compile.compile_text(
        mt.spec_from_module(gpt.make_model(), {"dp": 1}, layout="zero2"))
    swapped = (b"mfsdp-schedule-cache 1 " + hashlib.sha256(other).hexdigest().encode() + b"\n" +
               other)                                         # a valid schedule of another spec
    for bad in (data[:len(data) // 2],                        # truncated
                data.replace(b"numel: 2048", b"numel: 2047"),  # altered: checksum differs
                b"", forged, swapped):                        # checks out, does not load / fit
        with open(path, "wb") as f:
            f.write(bad)
        c0 = cache_stats["compiles"]
        sched, status = compile_cached(spec)
        assert (status, cache_stats["compiles"]) == ("replaced", c0 + 1)
        assert sched.hash() == good.hash() and open(path, "rb").read() == data
    assert compile_cached(spec)[1] == "hit"


def test_cache_new_compiler_misses(tmp_path, monkeypatch):
    spec = mt.spec_from_module(gpt.make_model(), {"dp": 1}, layout="zero3")
    assert compile_cached(spec)[1] == "miss"
    wrapper = tmp_path / "mfsdpc"
    wrapper.write_text("#!/bin/sh\nexec %s \"$@\"\n" % mfsdpc_path())
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    old_key = schedule_key(spec)
    monkeypatch.setenv("MFSDPC", str(wrapper))
    assert schedule_key(spec) != old_key
    assert compile_cached(spec)[1] == "miss"
    assert compile_cached(spec)[1] == "hit"


def test_cache_unwritable_dir_warns_once(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MFSDP_CACHE_DIR", str(blocker / "cache"))     # under a file: not creatable
    spec = mt.spec_from_module(gpt.make_model(), {"dp": 1}, layout="zero3")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert compile_cached(spec)[1] == "uncached"
        assert compile_cached(spec)[1] == "uncached"
        model, sm = one()
        assert sm.cache_status == "uncached"
        sm.close()
    msgs = [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and str(blocker / "cache") in msgs[0] and "MFSDP_CACHE_DIR" in msgs[0]


def test_cache_dir_order(monkeypatch):
    from mfsdp.torch.fully_shard import cache_dir
    monkeypatch.setenv("MFSDP_CACHE_DIR", "/a")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert cache_dir() == "/a"
    monkeypatch.delenv("MFSDP_CACHE_DIR")
    assert cache_dir() == "/x/mfsdp"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/h")
    assert cache_dir() == "/h/.cache/mfsdp"


def test_offload_policy_passed_to_shard():
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # the local backend's no-op, said once
        model, sm = one(offload_policy=CPUOffloadPolicy())
    assert sm.offload.requested and not sm.offload.active    # host memory already
    assert "local" in sm.offload.reason
    sm.close()
    model, sm = one()
    assert not sm.offload.requested
    sm.close()
    refused(lambda: one(offload_policy=CPUOffload(offload_params=True)), "FSDP1")
