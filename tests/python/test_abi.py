"""
test_abi: the ctypes binding against the public headers (abi_check.py, run
with the build's clang and include directories), that the check names the
first mismatch of each kind (a function's types, a missing declaration, a
constant, a struct's fields, types, offsets and size), and that the
configuration structs the binding makes carry the size and version the
library requires (a zeroed one is refused with a message naming it).
"""
import ctypes
import os
import subprocess
import sys
import types

import pytest

import mfsdp
from mfsdp import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import abi_check  # noqa: E402

CLANG = os.environ.get("MFSDP_CLANG")
needs_clang = pytest.mark.skipif(not CLANG, reason="no clang found by CMake (MFSDP_CLANG)")


def _cflags():
    return [f for f in os.environ.get("MFSDP_ABI_CFLAGS", "").split("|") if f]


def _headers():
    return os.environ.get("MFSDP_ABI_HEADERS", ",".join(abi_check.HEADERS)).split(",")


@pytest.fixture(scope="module")
def headers():
    return abi_check.Headers(CLANG, os.environ["MFSDP_ABI_INCLUDE"], _cflags(), _headers())


def _fake_lib(**changes):
    """_lib's declarations with some replaced (a copy; _lib is untouched)."""
    ns = {k: getattr(_lib, k) for k in dir(_lib) if not k.startswith("__")}
    ns["_PROTOTYPES"] = dict(_lib._PROTOTYPES)
    ns["_OPTIONAL"] = dict(_lib._OPTIONAL)
    ns["STRUCTS"] = dict(_lib.STRUCTS)
    for k, v in changes.items():
        ns[k] = v(ns[k]) if callable(v) and k in ("_PROTOTYPES", "_OPTIONAL", "STRUCTS") else v
    return types.SimpleNamespace(**ns)


def _mismatch(h, lib, part=abi_check.check):
    with pytest.raises(abi_check.Mismatch) as e:
        part(h, lib)
    return str(e.value)


@needs_clang
def test_binding_matches_the_headers(headers):
    functions, constants, structs = abi_check.check(headers, _lib)
    # the headers as of this test: every exported function, MFSDP_* constant and struct
    assert functions >= 64 and constants >= 37 and structs >= 8   # without mfsdp_nccl.h
    assert "mfsdp_create" in headers.functions and "mfsdp_config_set_mpi" not in headers.functions


@needs_clang
def test_the_script_exits_1_naming_the_mismatch(tmp_path):
    """The command CTest runs, on a copy of the package whose _lib.py declares
    mfsdp_rank with an int result (the header: int64_t)."""
    pkg = tmp_path / "mfsdp"
    pkg.mkdir()
    src = open(_lib.__file__).read()
    assert '"mfsdp_rank": (_I64, [_P]),' in src
    (pkg / "_lib.py").write_text(src.replace('"mfsdp_rank": (_I64, [_P]),', '"mfsdp_rank": (_INT, [_P]),'))
    (pkg / "__init__.py").write_text("")
    cmd = [sys.executable, os.path.join(HERE, "abi_check.py"), "--clang", CLANG,
           "--include", os.environ["MFSDP_ABI_INCLUDE"], "--headers", ",".join(_headers()),
           "--python", str(tmp_path)] + ["--cflag=" + f for f in _cflags()]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.startswith("abi_check: mfsdp_rank: result: the header says int64_t"), p.stdout


@needs_clang
def test_a_wrong_argument_type_is_named(headers):
    def wrong(protos):
        res, args = protos["mfsdp_convert"]
        protos["mfsdp_convert"] = (res, args[:4] + [ctypes.c_int])   # n is int64_t
        return protos
    msg = _mismatch(headers, _fake_lib(_PROTOTYPES=wrong))
    assert msg.startswith("mfsdp_convert: argument 5: the header says int64_t"), msg


@needs_clang
def test_a_missing_or_extra_function_is_named(headers):
    def drop(protos):
        del protos["mfsdp_dtype_name"]
        return protos
    msg = _mismatch(headers, _fake_lib(_PROTOTYPES=drop))
    assert msg == "mfsdp_dtype_name: exported by the headers, not declared in _lib._PROTOTYPES"

    def add(protos):
        protos["mfsdp_no_such_call"] = (None, [])
        return protos
    msg = _mismatch(headers, _fake_lib(_PROTOTYPES=add))
    assert msg == "mfsdp_no_such_call: declared in _lib.py, not exported by the headers"


@needs_clang
def test_a_wrong_constant_is_named(headers):
    msg = _mismatch(headers, _fake_lib(FLAG_CHECK=4))
    assert msg == "MFSDP_FLAG_CHECK = 2 in the header, _lib.FLAG_CHECK = 4"
    lib = _fake_lib()
    del lib.NCCL_TIMELINE
    if "mfsdp_nccl.h" in _headers():
        assert _mismatch(headers, lib) == "MFSDP_NCCL_TIMELINE = 32: no _lib.NCCL_TIMELINE"


@needs_clang
def test_a_wrong_struct_is_named(headers):
    class NoHeader(ctypes.Structure):       # mfsdp_config without size and version
        _fields_ = _lib.Config._fields_[2:]

    def swap(structs, cls=NoHeader):
        structs["mfsdp_config"] = cls
        return structs
    msg = _mismatch(headers, _fake_lib(STRUCTS=swap))   # the functions come first
    assert msg.startswith("mfsdp_config_init: argument 1: the header says mfsdp_config *"), msg
    structs = abi_check.check_structs
    msg = _mismatch(headers, _fake_lib(STRUCTS=swap), structs)
    assert msg.startswith("struct mfsdp_config: fields ['size', 'version', 'backend'"), msg

    class NarrowSteps(ctypes.Structure):    # steps as int32: a type and every offset after it
        _fields_ = [("steps", ctypes.c_int32)] + _lib.Stats._fields_[1:]
    msg = _mismatch(headers, _fake_lib(STRUCTS=lambda s: dict(s, mfsdp_stats=NarrowSteps)), structs)
    assert msg.startswith("struct mfsdp_stats.steps: the header says int64_t"), msg

    class Packed(ctypes.Structure):         # the right types, packed: an offset differs
        _pack_ = 1
        _fields_ = _lib.TensorView._fields_
    msg = _mismatch(headers, _fake_lib(STRUCTS=lambda s: dict(s, mfsdp_tensor_view=Packed)), structs)
    assert msg == "struct mfsdp_tensor_view.grad_local: offset 104 in C, 100 in _lib.Packed", msg

    class PackedInfo(ctypes.Structure):     # every offset right, no tail padding
        _pack_ = 1
        _fields_ = _lib.TensorInfo._fields_
    msg = _mismatch(headers, _fake_lib(STRUCTS=lambda s: dict(s, mfsdp_tensor_info=PackedInfo)), structs)
    assert msg == "struct mfsdp_tensor_info: sizeof 104 in C, 100 in _lib.PackedInfo", msg

    unbound = _fake_lib(STRUCTS=lambda s: {k: v for k, v in s.items() if k != "mfsdp_hf_options"})
    assert _mismatch(headers, unbound, structs) == "struct mfsdp_hf_options: not bound in _lib.STRUCTS"


def test_config_structs_carry_size_and_version():
    for cls in (_lib.Config, _lib.NcclConfig, _lib.CkptSaveOptions, _lib.CkptLoadOptions,
                _lib.HfOptions):
        c = cls()
        assert (c.size, c.version) == (ctypes.sizeof(cls), _lib.ABI_VERSION), cls.__name__
    assert _lib.ABI_VERSION == 1


SPEC = """
mesh dp = 1;
microbatches 1;
layout l { weight fp32 [Replicate]; grad fp32 [Partial]; main_weight fp32 [Replicate]; }
unit "a" layout l { tensor "w" [4]; }
"""


def test_the_library_refuses_a_struct_without_them(tmp_path):
    lib = _lib.load()
    s = mfsdp.Schedule.compile(SPEC)
    cfg = _lib.Config()
    lib.mfsdp_config_init(ctypes.byref(cfg))
    cfg.version = 0
    h = ctypes.c_void_p()
    with pytest.raises(mfsdp.MfsdpError) as e:
        _lib.check(lib.mfsdp_create(s.handle, ctypes.byref(cfg), ctypes.byref(h)))
    assert e.value.code_name == "MFSDP_ERR_INVALID_ARGUMENT"
    assert "mfsdp_config was never initialized" in e.value.message
    assert "MFSDP_CONFIG_INIT or mfsdp_config_init()" in e.value.message
    with mfsdp.Runtime(s) as rt:                       # the binding's own structs pass
        opt = _lib.CkptSaveOptions()
        opt.size += 8
        with pytest.raises(mfsdp.MfsdpError) as e:
            _lib.check(lib.mfsdp_ckpt_save(rt.handle, str(tmp_path / "c").encode(), ctypes.byref(opt)),
                       rt.handle)
        assert "mfsdp_ckpt_save_options is from a newer header" in e.value.message
        mfsdp.checkpoint.save(rt, str(tmp_path / "c"), step=2)
        assert mfsdp.checkpoint.load(rt, str(tmp_path / "c")).step == 2


def _public_callables(module):
    """The functions and the methods of the classes a module defines, public
    by name ("close", "__init__"), with their qualified names."""
    import inspect
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for mname, m in vars(obj).items():
                f = m.__func__ if isinstance(m, (classmethod, staticmethod)) else \
                    m.fget if isinstance(m, property) else m
                if inspect.isfunction(f) and (not mname.startswith("_") or mname in (
                        "__init__", "__enter__", "__exit__", "__sub__")):
                    yield "%s.%s" % (name, mname), f


def test_public_functions_are_annotated():
    import importlib
    import inspect
    names = ["mfsdp", "mfsdp._lib", "mfsdp._arrays", "mfsdp._mpi", "mfsdp.checkpoint",
             "mfsdp.compile", "mfsdp.convert", "mfsdp.runtime", "mfsdp.schedule"]
    try:
        import torch  # noqa: F401
        names += ["mfsdp.torch.%s" % m for m in ("checkpoint", "guard", "shard", "spec", "tensors",
                                                 "init", "order")]
    except ImportError:
        pass
    missing, seen = [], 0
    for mod in map(importlib.import_module, names):
        for qual, f in _public_callables(mod):
            seen += 1
            sig = inspect.signature(f)
            params = [p for p in sig.parameters if p not in ("self", "cls")]
            if sig.return_annotation is inspect.Signature.empty:
                missing.append("%s.%s: return" % (mod.__name__, qual))
            missing += ["%s.%s: %s" % (mod.__name__, qual, p) for p in params
                        if sig.parameters[p].annotation is inspect.Parameter.empty]
    assert seen > 80
    assert not missing, "not annotated: %s" % ", ".join(missing[:20])
