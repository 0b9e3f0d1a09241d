"""
test_package: the mfsdp package without torch's integration: importing it
needs no torch, schedules load from files and text and compile from specs,
their facts, a runtime on the local backend (hooks, zero-copy views with the
schedule's dtypes, stats), and every C failure as an MfsdpError carrying the
library's message and result code.
"""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import mfsdp
from mfsdp import _lib

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


def test_local_world_needs_group():
    s = mfsdp.Schedule.load(os.path.join(ROOT, "schedules", "hfsdp.yaml"))
    with pytest.raises(mfsdp.MfsdpError) as e:
        mfsdp.Runtime(s, backend="local")
    assert "LocalGroup" in str(e.value)
    with pytest.raises(mfsdp.MfsdpError) as e:
        mfsdp.Runtime(s, backend="carrier-pigeon")
    assert "unknown backend" in str(e.value)


@pytest.mark.skipif(not os.environ.get("MFSDP_ABI_LAYOUT"), reason="the build tree's ABI probe")
def test_ctypes_structs_match_the_c_layout():
    out = subprocess.run([os.environ["MFSDP_ABI_LAYOUT"]], capture_output=True, text=True,
                         check=True).stdout
    structs = {"mfsdp_tensor_info": _lib.TensorInfo, "mfsdp_tensor_view": _lib.TensorView,
               "mfsdp_config": _lib.Config, "mfsdp_stats": _lib.Stats,
               "mfsdp_nccl_config": _lib.NcclConfig}
    checked = 0
    for line in out.splitlines():
        sname, field, value = line.split()
        cls = structs[sname]
        got = ctypes.sizeof(cls) if field == "sizeof" else getattr(cls, field).offset
        assert got == int(value), (sname, field, got, value)
        checked += 1
    assert checked >= 40


def test_schedule_outlives_its_runtimes():
    s = mfsdp.Schedule.compile(SPEC_1)
    rt = mfsdp.Runtime(s, backend="local")
    s.close()                      # deferred: the runtime borrows the C schedule
    assert s._h is not None
    rt.step_begin()
    rt.close()
    assert s._h is None            # freed with its last runtime
