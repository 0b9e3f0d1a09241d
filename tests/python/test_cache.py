"""
test_cache: the schedule cache cannot be forged (issue 39 point 1;
python/mfsdp/torch/cache.py, docs/pytorch.md "The schedule cache").

A forged entry is the schedule of a modified spec (bf16 compute, or
`reduce sum`) planted under the honest spec's key, its source_sha256
rewritten to the honest spec's and its first line's self-hash recomputed:
whether another user owns it or this user does, it is never loaded (the
schedule returned is the honest one: fp32 weights, reduce avg) and it is
replaced. A cache directory writable by others or owned by another user is
refused naming it ("bad permissions on ..."), and the call compiles
without the cache; so are entries that are symlinks or writable by others.
One process, a second or two.
"""
import hashlib
import os
import warnings

import pytest

import gpt
import mfsdp.torch as mt
from mfsdp.torch.cache import CACHE_MAGIC, cache_stats, compile_cached, schedule_key
from mfsdp.compile import compile_text

OTHER_UID = 12345


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("MFSDP_CACHE_DIR", str(d))
    return d


def spec(**kw):
    return mt.spec_from_module(gpt.make_model(), {"dp": 1}, layout="zero3", **kw)


def forged(honest, **modified):
    """The schedule of spec(**modified) dressed as honest's cache entry."""
    yaml = compile_text(spec(**modified))
    lines = yaml.split(b"\n")
    assert lines[2].startswith(b"source_sha256: ")
    lines[2] = b'source_sha256: "%s"' % hashlib.sha256(honest.encode()).hexdigest().encode()
    return entry(b"\n".join(lines))


def entry(body):
    return CACHE_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def plant(cache, honest, data, uid=None, mode=0o600):
    cache.mkdir(mode=0o700, exist_ok=True)
    path = cache / (schedule_key(honest) + ".yaml")
    path.write_bytes(data)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def honest_facts(sched):
    return sched.reduce, {(t.weight_dtype, t.grad_dtype) for t in sched.tensors}


def run(honest):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        sched, status = compile_cached(honest)
    return sched, status, [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("modified", [{"dtype": "bf16"}, {"reduce": "sum"}])
@pytest.mark.parametrize("owner", ["another user", "this user"])
def test_forged_entry_never_used(cache, modified, owner):
    honest = spec()
    path = plant(cache, honest, forged(honest, **modified),
                 uid=OTHER_UID if owner == "another user" else None)
    sched, status, warned = run(honest)
    assert status == "replaced"
    assert honest_facts(sched) == ("avg", {("fp32", "fp32")})
    if owner == "another user":
        assert any("bad permissions on %s: owned by uid %d" % (path, OTHER_UID) in w
                   for w in warned), warned
    st = os.stat(path)
    assert st.st_uid == os.geteuid() and (st.st_mode & 0o077) == 0
    assert path.read_bytes().endswith(compile_text(honest))          # replaced by the honest one
    c0, k0 = cache_stats["compiles"], cache_stats["checks"]
    sched, status, _ = run(honest)
    assert (status, cache_stats["compiles"], cache_stats["checks"]) == ("hit", c0, k0 + 1)
    assert honest_facts(sched) == ("avg", {("fp32", "fp32")})


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "another owner"])
def test_untrusted_directory_not_used(cache, how):
    honest = spec()
    plant(cache, honest, forged(honest, reduce="sum"))
    if how == "another owner":
        os.chown(cache, OTHER_UID, -1)
    else:
        os.chmod(cache, 0o777 if how == "world-writable" else 0o770)
    sched, status, warned = run(honest)
    assert status == "uncached" and honest_facts(sched) == ("avg", {("fp32", "fp32")})
    want = "owned by uid %d" % OTHER_UID if how == "another owner" else "writable by its group " \
                                                                        "or others"
    assert any(("bad permissions on %s" % cache) in w and want in w for w in warned), warned


def test_entry_symlink_or_writable_by_others_replaced(cache, tmp_path):
    honest = spec()
    target = tmp_path / "elsewhere.yaml"
    target.write_bytes(forged(honest, dtype="bf16"))
    cache.mkdir(mode=0o700)
    path = cache / (schedule_key(honest) + ".yaml")
    os.symlink(target, path)
    sched, status, warned = run(honest)
    assert status == "replaced" and not os.path.islink(path)
    assert any("bad permissions on %s: a symbolic link" % path in w for w in warned), warned
    plant(cache, honest, entry(compile_text(honest)), mode=0o666)      # honest bytes, wrong mode
    sched, status, warned = run(honest)
    assert status == "replaced" and any("mode 0666" in w for w in warned), warned
    assert honest_facts(sched) == ("avg", {("fp32", "fp32")})
