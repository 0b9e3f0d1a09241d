"""
test_gpu_glue: what the PyTorch glue hands the C side on a GPU, with
torch.cuda mocked (no GPU needed). torch's default stream has cuda_stream 0,
and 0 (NULL) in mfsdp_nccl_config.compute_stream means "no stream: the
runtime creates its own", which nothing orders with torch's kernels; so the
glue must pass cudaStreamLegacy (0x1) for it, any other stream as it is, and
blocking communicators (the C default, mfsdp_nccl_config_init), as C does.

Each case runs in a worker process (this file run as a script) on the
library with the GPU backends, libmfsdp_nccl (next to MFSDP_LIBRARY), since
the CPU library has no mfsdp_nccl_* at all:
  - the config the C side receives: mfsdp_create wrapped so it reads the
    very ctypes struct it is handed, then called for real;
  - the C side's own reading, without a device: host compute with a stream
    is refused at create before any CUDA call, and the message names the
    handle the C side read (0x1, cudaStreamLegacy, or the given one);
  - with the CPU model of CUDA and NCCL (tests/gpumodel, when built next to
    the library: <build>/tests/gpumodel/lib): mfsdp_create on the nccl
    backend succeeds and mfsdp_nccl_stream(COMPUTE) is the stream the C side
    uses: cudaStreamLegacy for handle 0 (torch's default stream), a created
    stream as it is. Without torch in that process: a CUDA build of torch
    loads the real libcudart first.
"""
import ctypes
import importlib
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = os.path.join(HERE, "..", "gpu", "hfsdp_1x1.mfsdp")
CUDA_STREAM_LEGACY = 0x1
NCCL_NONBLOCKING, NCCL_MEM_ALLOC = 1, 2


def gpu_library():
    """libmfsdp_nccl next to MFSDP_LIBRARY (the build tree), or None."""
    lib = os.environ.get("MFSDP_LIBRARY")
    if not lib:
        return None
    path = os.path.join(os.path.dirname(lib), "libmfsdp_nccl.so")
    return path if os.path.exists(path) else None


def model_dir():
    """The CPU model's libcudart.so.13 and libnccl.so.2 of this build, or None."""
    env = os.environ.get("MFSDP_GPUMODEL_LIB")
    if env:
        return env if os.path.isdir(env) else None
    lib = gpu_library()
    if not lib:
        return None
    d = os.path.dirname(lib)
    for _ in range(3):   # <build>/runtime/libmfsdp_nccl.so -> <build>/tests/gpumodel/lib
        cand = os.path.join(d, "tests", "gpumodel", "lib")
        if os.path.exists(os.path.join(cand, "libcudart.so.13")):
            return cand
        d = os.path.dirname(d)
    return None


def run_worker(case, model=False):
    lib = gpu_library()
    if not lib:
        pytest.skip("no libmfsdp_nccl next to MFSDP_LIBRARY (a build without CUDA)")
    env = dict(os.environ, MFSDP_LIBRARY=lib)
    if model:
        d = model_dir()
        if not d:
            pytest.skip("the CPU model of CUDA/NCCL is not built (tests/gpumodel/lib)")
        env["LD_LIBRARY_PATH"] = os.pathsep.join([d] + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    p = subprocess.run([sys.executable, os.path.abspath(__file__), case], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, "worker %s: exit %d\n%s\n%s" % (case, p.returncode, p.stdout, p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- the cases (pytest) ----

def test_defaults_are_the_c_defaults():
    got = run_worker("defaults")
    assert got["c_flags"] == NCCL_MEM_ALLOC, got           # docs/gpu.md: blocking, ncclMemAlloc
    assert got["py_flags"] == got["c_flags"], got
    assert not got["py_flags"] & NCCL_NONBLOCKING, got
    assert got["py_watchdog"] == got["c_watchdog"] == 100, got
    assert got["py_stream"] is None and got["py_device"] == -1, got


@pytest.mark.parametrize("handle", [0, 0x5000])
def test_stream_the_c_side_receives(handle):
    got = run_worker("receives:%d" % handle)
    want = CUDA_STREAM_LEGACY if handle == 0 else handle
    assert got["compute_stream"] == want, got
    assert got["flags"] == NCCL_MEM_ALLOC, got              # blocking communicators
    assert got["size"] == got["sizeof"], got
    assert got["device"] == 3, got


@pytest.mark.parametrize("handle,label", [(0, "0x1, cudaStreamLegacy"), (0x5000, "0x5000")])
def test_stream_the_c_side_reads(handle, label):
    got = run_worker("reads:%d" % handle)
    assert "compute_stream must be NULL (it is %s)" % label in got["error"], got


@pytest.mark.parametrize("which", ["default", "created"])
def test_stream_in_use_on_the_model(which):
    got = run_worker("model:" + which, model=True)
    assert got["error"] == "", got
    assert got["compute"] == got["want"], got
    if which == "default":
        assert got["want"] == CUDA_STREAM_LEGACY, got


# ---- the worker (run as a script, on libmfsdp_nccl) ----

class _Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


def _mock_torch_cuda(handle, device=3):
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: device
    torch.cuda.current_stream = lambda *a, **k: _Stream(handle)


def _schedule():
    import mfsdp
    with open(SPEC) as f:
        return mfsdp.Schedule.compile(f.read(), name="hfsdp_1x1")


def _capture_create(lib, seen):
    """Wraps lib.mfsdp_create: records the mfsdp_nccl_config it is handed (as
    the C side will read it), then calls the real one."""
    from mfsdp import _lib
    real = lib.mfsdp_create

    def create(sh, cfg_ref, out):
        cfg = cfg_ref._obj
        if cfg.backend_config:
            nc = ctypes.cast(cfg.backend_config, ctypes.POINTER(_lib.NcclConfig)).contents
            seen.update(compute_stream=nc.compute_stream, flags=nc.flags, size=nc.size,
                        sizeof=ctypes.sizeof(_lib.NcclConfig), device=nc.device,
                        watchdog=nc.watchdog_poll_ms)
        return real(sh, cfg_ref, out)
    lib.mfsdp_create = create


def _worker(case):
    import mfsdp
    from mfsdp import _lib
    from mfsdp.runtime import nccl_config
    kind, _, arg = case.partition(":")
    if kind in ("receives", "reads"):   # torch first: its libnccl may be newer than the one libmfsdp links
        shard = importlib.import_module("mfsdp.torch.shard")   # the module (mfsdp.torch.shard is also a function)
    lib = _lib.load()   # on the model: before anything loads the real libcudart (a CUDA torch would)
    out = {}
    if kind == "defaults":
        c = _lib.NcclConfig()
        lib.mfsdp_nccl_config_init(ctypes.byref(c))
        py = nccl_config(lib, None, None, False, None)
        out = dict(c_flags=c.flags, c_watchdog=c.watchdog_poll_ms, py_flags=py.flags,
                   py_watchdog=py.watchdog_poll_ms, py_stream=py.compute_stream, py_device=py.device)
    elif kind == "receives":
        _mock_torch_cuda(int(arg))
        kw = shard._nccl_args({}, "nccl", 1)
        _capture_create(lib, out)
        try:
            mfsdp.Runtime(_schedule(), backend="nccl", **kw).close()
        except mfsdp.MfsdpError:
            pass   # no device here: what the C side was handed is what counts
    elif kind == "reads":
        _mock_torch_cuda(int(arg))
        kw = shard._nccl_args({}, "nccl", 1)
        try:
            mfsdp.Runtime(_schedule(), backend="nccl", host_compute=True, **kw).close()
            out["error"] = ""
        except mfsdp.MfsdpError as e:
            out["error"] = str(e)
    elif kind == "model":
        # no torch here (a CUDA build of torch would bring the real libcudart):
        # the handle torch's stream gives, passed as mfsdp.torch passes it
        handle = 0
        if arg == "created":
            cudart = ctypes.CDLL("libcudart.so.13")
            s = ctypes.c_void_p()
            assert cudart.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
            handle = s.value
        out = dict(error="", want=CUDA_STREAM_LEGACY if handle == 0 else handle)
        try:
            rt = mfsdp.Runtime(_schedule(), backend="nccl", device=0, stream=handle)
            out["compute"] = rt.cuda_stream(0)
            rt.close()
        except mfsdp.MfsdpError as e:
            out["error"] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    _worker(sys.argv[1])
