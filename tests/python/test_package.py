"""
test_package: the mfsdp package without torch's integration: importing it
needs no torch, schedules load from files and text and compile from specs,
their facts, a runtime on the local backend (hooks, zero-copy views with the
schedule's dtypes, stats), and every C failure as an MfsdpError carrying the
library's message and result code.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import mfsdp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC_1 = """
mesh dp = 1;
microbatches 2;
layout mixed { weight bf16 [Replicate]; grad fp32 [Partial]; main_weight fp32 [Replicate]; }
layout half  { weight fp16 [Replicate]; grad fp32 [Partial]; main_weight fp32 [Replicate]; }
unit "a" layout mixed { tensor "w" [3, 4]; tensor "b" [4] layout half; }
unit "b" layout mixed { tensor "w" [5]; }
"""


def test_import_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None; "
            "import mfsdp; print(mfsdp.version())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "0.1.0"


def test_the_package_is_typed():
    # PEP 561: py.typed ships with the package (also as `pip install .` lays it out)
    assert os.path.isfile(os.path.join(os.path.dirname(mfsdp.__file__), "py.typed"))


def test_schedule_facts_from_file_and_text():
    path = os.path.join(ROOT, "schedules", "hfsdp.yaml")
    s = mfsdp.Schedule.load(path)
    assert s.mesh == {"dp_outer": 2, "dp_inner": 4} and s.world_size == 8
    assert s.units[:2] == ["embed", "layers.0"] and len(s.units) == 6
    assert s.microbatches == 2 and s.reduce == "avg"
    t = s.tensor("layers.3.attention.wo.weight")
    assert t.shape == (64, 64) and t.numel == 4096 and t.unit == 4
    assert t.weight_dtype == "bf16" and t.main_weight_dtype == "fp32"
    with open(path, "rb") as f:
        s2 = mfsdp.Schedule.from_text(f.read(), name="copy.yaml")
    assert s2.hash() == s.hash() and len(s2.tensors) == len(s.tensors)


def test_load_error_is_located():
    with pytest.raises(mfsdp.MfsdpError) as e:
        mfsdp.Schedule.from_text("version: [\n", name="broken.yaml")
    assert e.value.code == 3 and e.value.code_name == "MFSDP_ERR_LOAD"
    assert "broken.yaml:" in str(e.value)
    with pytest.raises(mfsdp.MfsdpError) as e:
        mfsdp.Schedule.load("/nonexistent/x.yaml")
    assert e.value.code == 3 and "/nonexistent/x.yaml" in e.value.message


def test_compile_spec_and_its_errors():
    s = mfsdp.Schedule.compile(SPEC_1)
    assert s.units == ["a", "b"] and s.world_size == 1
    assert [t.weight_dtype for t in s.tensors] == ["bf16", "fp16", "bf16"]
    with pytest.raises(mfsdp.CompileError) as e:
        mfsdp.Schedule.compile(SPEC_1.replace("layout half;", "layout hlaf;"), name="bad")
    assert "bad.mfsdp:6:" in e.value.diagnostics and "did you mean 'half'" in e.value.diagnostics


def test_python_m_compile(tmp_path):
    spec = tmp_path / "one.mfsdp"
    spec.write_text(SPEC_1)
    out = tmp_path / "one.yaml"
    p = subprocess.run([sys.executable, "-m", "mfsdp.compile", "compile", str(spec), "-o",
                        str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert mfsdp.Schedule.load(str(out)).units == ["a", "b"]
    p = subprocess.run([sys.executable, "-m", "mfsdp.compile", "check", str(tmp_path / "no")],
                       capture_output=True, text=True)
    assert p.returncode == 2


def _run_step(rt, s, fill):
    rt.step_begin()
    for m in range(s.microbatches):
        for u in range(len(s.units)):
            rt.forward_pre(u, m)
            rt.forward_post(u, m)
        for u in reversed(range(len(s.units))):
            rt.backward_pre(u, m)
            for v in rt.views:
                if v.unit == u:
                    rt.array(v.name, "grad_local")[...] = fill(v, m)
            rt.backward_post(u, m)
    rt.step_end()


def test_runtime_views_hooks_and_stats():
    s = mfsdp.Schedule.compile(SPEC_1)
    with mfsdp.Runtime(s, backend="local") as rt:
        assert (rt.rank, rt.world_size) == (0, 1)
        w = rt.view("a.w")
        assert w.shape == (3, 4) and w.dtype["weight"] == "bf16" and w.shard_count == 12
        main = rt.array("a.w", "main_weight")
        assert main.dtype == np.float32 and main.shape == (12,)
        main[...] = np.arange(12, dtype=np.float32) * 0.5     # exact in bf16
        rt.array("a.b", "main_weight")[...] = [1.0, -2.0, 0.25, 3.0]
        _run_step(rt, s, lambda v, m: (m + 1) * np.ones(v.shape, np.float32))
        # the delivered gradient: the sum over the 2 microbatches (1 + 2) of
        # the single rank's gradient (avg over 1 rank)
        assert (rt.array("a.w", "grad") == 3.0).all()
        weight = rt.array("a.w", "weight")
        assert weight.shape == (3, 4)
        if weight.dtype == np.uint16:   # no ml_dtypes: the raw bf16 bits
            weight = (weight.astype(np.uint32) << 16).view(np.float32)
        assert [float(x) for x in weight.reshape(-1)] == [i * 0.5 for i in range(12)]
        half = rt.array("a.b", "weight")
        assert half.dtype == np.float16 and half.tolist() == [1.0, -2.0, 0.25, 3.0]
        st = rt.stats()
        assert st.steps == 1 and st.ops > 0
        with pytest.raises(KeyError):
            rt.view("a.nope")


def test_hook_out_of_order_raises_with_message():
    s = mfsdp.Schedule.compile(SPEC_1)
    with mfsdp.Runtime(s, backend="local") as rt:
        rt.step_begin()
        with pytest.raises(mfsdp.MfsdpError) as e:
            rt.forward_pre(1, 0)
        assert e.value.code == 2
        assert e.value.code_name == "MFSDP_ERR_INVALID_USAGE"
        assert "mfsdp_forward_pre(unit 0" in e.value.message
        rt.forward_pre(0, 0)           # the right call still works
        with pytest.raises(mfsdp.MfsdpError) as e:
            rt.forward_post(7, 0)
        assert e.value.code_name == "MFSDP_ERR_INVALID_ARGUMENT"


def test_errors_copy_and_pickle_with_one_code_name():
    import copy
    import pickle
    from mfsdp._lib import UsageError
    for err in (UsageError("bad call"), mfsdp.MfsdpError(5, "peer gone", "mfsdp_create")):
        for again in (copy.copy(err), copy.deepcopy(err), pickle.loads(pickle.dumps(err))):
            assert type(again) is type(err)
            assert str(again) == str(err)
            assert str(again).count("(MFSDP_ERR_") == 1
            assert (again.code, again.message, again.call) == (err.code, err.message, err.call)


def test_local_world_needs_group():
    s = mfsdp.Schedule.load(os.path.join(ROOT, "schedules", "hfsdp.yaml"))
    with pytest.raises(mfsdp.MfsdpError) as e:
        mfsdp.Runtime(s, backend="local")
    assert "LocalGroup" in str(e.value)
    with pytest.raises(mfsdp.MfsdpError) as e:
        mfsdp.Runtime(s, backend="carrier-pigeon")
    assert "unknown backend" in str(e.value)


def test_schedule_outlives_its_runtimes():
    s = mfsdp.Schedule.compile(SPEC_1)
    rt = mfsdp.Runtime(s, backend="local")
    s.close()                      # deferred: the runtime borrows the C schedule
    assert s._h is not None
    rt.step_begin()
    rt.close()
    assert s._h is None            # freed with its last runtime


def _on_threads(world, fn):
    """Runs fn(rank) on `world` threads (the local backend's thread-ranks);
    returns the results by rank and re-raises the first failure."""
    import threading
    res, errs = [None] * world, []

    def body(r):
        try:
            res[r] = fn(r)
        except BaseException as e:       # noqa: B902 - re-raised in the caller
            errs.append(e)
    ts = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if errs:
        raise errs[0]
    return res


def test_helpers_on_eight_thread_ranks():
    """unit_find, scatter and gather of master weights, all-reduce, grad norm
    and clip on the hfsdp example (2 x 4 mesh, replicated main weights across
    dp_outer), checked against hand-worked values."""
    s = mfsdp.Schedule.load(os.path.join(ROOT, "schedules", "hfsdp.yaml"))
    assert s.unit_find("layers.2") == 3 and s.unit_find("nope") == -1
    assert s.unit_index("layers.2") == 3
    total = sum(t.numel for t in s.tensors)
    g = mfsdp.LocalGroup(8)

    def full(t):    # exact in fp32 and (integers below 256) in bf16
        return (np.arange(t.numel, dtype=np.float32) % 251).reshape(t.shape) - 125

    def rank(r):
        with mfsdp.Runtime(s, backend="local", group=g, rank=r, timeout_ms=60000) as rt:
            out = {"unit": rt.unit_find("head"), "none": rt.unit_find("")}
            for t in s.tensors:
                rt.scatter(t.name, full(t))
            out["sum"] = rt.allreduce([r, 1.5])
            out["max"] = rt.allreduce([r, -1.0], "max")
            out["min"] = rt.allreduce(np.float32(r), "min")     # a scalar: a float back
            out["all"] = {t.name: rt.gather(t.name) for t in s.tensors}
            out["root3"] = rt.gather(s.tensors[0].name, root=3)
            out["bf16"] = rt.gather(s.tensors[-1].name, dtype="bf16")
            # rank r's grad_local is (r + 1)(m + 1): the delivered grad is the
            # sum over m of the mean over the 8 ranks, 4.5 * (1 + 2) = 13.5
            _run_step(rt, s, lambda v, m: (r + 1) * (m + 1) * np.ones(v.shape, np.float32))
            out["norm"] = rt.grad_norm()
            out["clip_noop"] = rt.clip_grad_norm(1e9)
            out["grad_noop"] = [rt.array(v.name, "grad").copy() for v in rt.views]
            out["clip"] = rt.clip_grad_norm(100.0)
            out["grad"] = [rt.array(v.name, "grad").copy() for v in rt.views]
            out["norm_after"] = rt.grad_norm()
            return out
    try:
        res = _on_threads(8, rank)
    finally:
        g.close()
    norm = 13.5 * np.sqrt(total)
    scale = 100.0 / (norm + 1e-6)
    for r, o in enumerate(res):
        assert o["unit"] == 5 and o["none"] == -1
        assert o["sum"] == [28.0, 12.0] and o["max"] == [7.0, -1.0] and o["min"] == 0.0
        for t in s.tensors:
            assert o["all"][t.name].shape == t.shape
            assert (o["all"][t.name] == full(t)).all(), t.name
        assert (o["root3"] is not None) == (r == 3)
        bits = o["bf16"].view(np.uint16).astype(np.uint32) << 16
        assert (bits.view(np.float32) == full(s.tensors[-1])).all()
        assert o["norm"] == pytest.approx(norm, rel=1e-6)
        assert o["clip_noop"] == o["norm"] == res[0]["norm"]        # same bits everywhere
        assert all((gr == 13.5).all() for gr in o["grad_noop"])
        assert o["clip"] == o["norm"]
        assert all(np.allclose(gr, 13.5 * scale, rtol=1e-6) for gr in o["grad"])
        assert o["norm_after"] == pytest.approx(100.0, rel=1e-5)
    assert res[3]["root3"].tolist() == full(s.tensors[0]).tolist()


def test_helper_misuse_raises():
    s = mfsdp.Schedule.compile(SPEC_1)
    with mfsdp.Runtime(s, backend="local") as rt:
        with pytest.raises(mfsdp.UsageError, match="12 elements given, the tensor has 4"):
            rt.scatter("a.b", np.zeros(12, np.float32))
        with pytest.raises(mfsdp.UsageError, match="out= must be"):
            rt.gather("a.w", out=np.zeros(12, np.float64))
        with pytest.raises(mfsdp.UsageError, match="one of sum, max, min"):
            rt.allreduce([1.0], "mean")
        with pytest.raises(mfsdp.MfsdpError) as e:
            rt.clip_grad_norm(-1.0)
        assert e.value.code_name == "MFSDP_ERR_INVALID_ARGUMENT"
        rt.scatter("a.b", [1.0, 2.0, 3.0, 4.0])                  # a list: taken as fp32
        assert rt.gather("a.b").tolist() == [1.0, 2.0, 3.0, 4.0]


def test_convert_is_round_to_nearest_even():
    x = np.array([1.0, -2.5, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 65520.0, np.nan], np.float32)
    bf = mfsdp.convert(x, "bf16").view(np.uint16)
    # 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to the even 1.0;
    # 1 + 3 * 2^-8 ties to the even 1 + 2^-6; 65520 = 0x477FF000 rounds up to 2^16
    assert bf[:5].tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x4780] and bf[5] & 0x7F80 == 0x7F80
    # fp16 has 10 fraction bits: the ties are 1 + 2^-11 (to 1.0) and 1 + 3 * 2^-11
    # (to 1 + 2^-9); 65520 is halfway between 65504 (the largest) and 2^16: infinity
    y = np.array([1.0, -2.5, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 65520.0, np.nan], np.float32)
    h = mfsdp.convert(y, "fp16")
    assert h.dtype == np.float16 and h[:4].tolist() == [1.0, -2.5, 1.0, 1.0 + 2.0 ** -9]
    assert np.isinf(h[4]) and np.isnan(h[5])
    back = mfsdp.convert(h, "fp32")
    assert back.dtype == np.float32 and back[:2].tolist() == [1.0, -2.5]


def test_check_mode_refuses_an_unwritten_gradient():
    s = mfsdp.Schedule.compile(SPEC_1)
    with mfsdp.Runtime(s, backend="local", check=True) as rt:
        rt.step_begin()
        for u in range(2):
            rt.forward_pre(u, 0)
            rt.forward_post(u, 0)
        rt.backward_pre(1, 0)
        rt.array("b.w", "grad_local")[:4] = 1.0     # element 4 of 5 left unwritten
        with pytest.raises(mfsdp.MfsdpError) as e:
            rt.backward_post(1, 0)
        assert e.value.code_name == "MFSDP_ERR_INVALID_USAGE"
        assert "check mode" in e.value.message and "element 4 of 5" in e.value.message
        rt.array("b.w", "grad_local")[4] = 1.0
        rt.backward_post(1, 0)                       # fixed: the hook goes through
    with mfsdp.Runtime(s, backend="local") as rt:    # without check mode: not noticed
        rt.step_begin()
        for u in range(2):
            rt.forward_pre(u, 0)
            rt.forward_post(u, 0)
        rt.backward_pre(1, 0)
        rt.backward_post(1, 0)
