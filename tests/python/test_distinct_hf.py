"""
test_distinct_hf: the Hugging Face export and import (sm.export_hf /
sm.import_hf, mfsdp_ckpt_export_hf / import_hf) of models whose tensors are
Distinct on a mesh axis, under their global names (issue #42): the TP = 2 x
DP = 2 column/row MLP (w1 and its bias split along dim 0, w2 along dim 1:
the strided case) and the EP = 2 x DP = 2 top-1 MoE (4 experts renamed, 2
per ep coordinate) of distinct_worker.py, trained by distinct_hf_worker.py
under one `mpirun -np 4` launch, then one `mpirun -np 2` (dp = 1).

Checked against values computed outside the code under test:
  - the export before training, read by safetensors' own load_file, is the
    single-process whole model's state dict (distinct_worker.whole_model),
    every key and every value bit for bit, and loads into that model with
    strict=True;
  - the export after the steps equals, bit for bit, full_state_dict
    (global_state.py's Python assembly, tested in test_distinct) and is
    within 1e-6 of the single-process reference run (test_distinct.reference);
  - the sharded export (files of at most 1200 bytes) has its index naming
    every tensor once and the same tensors; the export with maps prefixes
    every name (moe: the tied head.weight not stored);
  - importing each export on 4 ranks into a model of other values gives
    every rank's master shards of the training back bit for bit (the tie:
    head.weight from embed.weight's values); on 2 ranks (dp = 1) its
    full_state_dict is the exported model, and its own export is the same
    bytes as the 4-rank one;
  - mfsdp-ckpt import of the export into a native checkpoint for the
    schedule, then mfsdp-ckpt export of that, gives the same bytes;
  - without global names both calls are refused (UsageError, before any C
    call) naming the expert tensor and global_names=, creating nothing
    (the C library's own refusal: test_distinct_hf_rt).
"""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

import conftest
import distinct_worker as dw
import mfsdp
from test_distinct import reference

WORLD = 4
KINDS = ("tp", "moe")

needs_mpi = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                               reason="libmfsdp built without the MPI backend")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    d = tmp_path_factory.mktemp("distinct_hf")
    script = [conftest.sys.executable, os.path.join(conftest.HERE, "distinct_hf_worker.py"),
              str(d)]
    four = conftest.mpirun()
    two = [a if a != str(WORLD) else "2" for a in four]
    for cmd in (four + script + [str(conftest.free_port())],
                two + script + [str(conftest.free_port()), "two"]):
        p = conftest.subprocess.run(cmd, env=conftest.env(), cwd=str(d), capture_output=True,
                                    text=True, timeout=240)
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return str(d)


def rank(out, kind, r, prefix=""):
    return torch.load(os.path.join(out, "%s%s.rank%d.pt" % (prefix, kind, r)))


def assert_equal_dicts(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k], want[k]), k


@needs_mpi
@pytest.mark.parametrize("kind", KINDS)
def test_export_is_the_whole_model(out, kind):
    whole = dw.whole_model(kind)
    exported = load_file(os.path.join(out, "hf0_%s" % kind, "model.safetensors"))
    assert_equal_dicts(exported, whole.state_dict())
    trained = load_file(os.path.join(out, "hf_%s" % kind, "model.safetensors"))
    assert_equal_dicts(trained, rank(out, kind, 0)["full"])
    whole.load_state_dict(trained, strict=True)
    ref = reference(kind)[2][-1]
    worst = max(((trained[k] - ref[k]).abs().max() / ref[k].abs().max()).item() for k in ref)
    print("%s: export against the single-process run: %.2e" % (kind, worst))
    assert worst <= 1e-6


@needs_mpi
@pytest.mark.parametrize("kind", KINDS)
def test_sharded_and_mapped_exports(out, kind):
    trained = load_file(os.path.join(out, "hf_%s" % kind, "model.safetensors"))
    d = os.path.join(out, "hfs_%s" % kind)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    assert len(files) > 2 and sorted(set(wm.values())) == files
    got = {}
    for f in files:
        part = load_file(os.path.join(d, f))
        assert all(wm[k] == f for k in part)
        got.update(part)
    assert_equal_dicts(got, trained)
    mapped = load_file(os.path.join(out, "hfm_%s" % kind, "model.safetensors"))
    want = {"model." + k: v for k, v in trained.items()}
    if kind == "moe":
        del want["model.head.weight"]          # tied: stored once, as embed.weight
    assert_equal_dicts(mapped, want)


@needs_mpi
@pytest.mark.parametrize("kind", KINDS)
def test_import_gives_the_shards_back(out, kind):
    trained = load_file(os.path.join(out, "hf_%s" % kind, "model.safetensors"))
    embed = trained.get("embed.weight")
    for r in range(WORLD):
        got = rank(out, kind, r)
        assert got["shards"], r
        for key in ("imported", "imported_sharded", "imported_maps"):
            assert sorted(got[key]) == sorted(got["shards"]), (r, key)
            for n, (off, want) in got["shards"].items():
                o, p = got[key][n]
                if key == "imported_maps" and kind == "moe" and n == "head.weight":
                    want = embed.reshape(-1)[off:off + want.numel()]   # filled from its source
                assert o == off and torch.equal(p.reshape(-1), want.reshape(-1)), (r, key, n)
        assert_equal_dicts(got["imported_full"], trained)


@needs_mpi
@pytest.mark.parametrize("kind", KINDS)
def test_two_ranks(out, kind):
    trained = load_file(os.path.join(out, "hf_%s" % kind, "model.safetensors"))
    for r in range(2):
        got = rank(out, kind, r, "two_")
        assert got["coords"][1] == 0                 # dp = 1: one rank per tp / ep coordinate
        assert_equal_dicts(got["full"], trained)
    with open(os.path.join(out, "hf_%s" % kind, "model.safetensors"), "rb") as a, \
            open(os.path.join(out, "hf2_%s" % kind, "model.safetensors"), "rb") as b:
        assert a.read() == b.read()


@needs_mpi
@pytest.mark.parametrize("kind", KINDS)
def test_offline_tool(out, kind):
    """mfsdp-ckpt import of the export into a native checkpoint for the
    schedule (each coordinate's tensor or its runs of a split one), then
    mfsdp-ckpt export of that: the same bytes as the runtime's export."""
    tool = os.environ.get("MFSDP_CKPT", "mfsdp-ckpt")
    hf = os.path.join(out, "hf_%s" % kind)
    native, again = os.path.join(out, "native_%s" % kind), os.path.join(out, "hfx_%s" % kind)
    for args in (["import", hf, os.path.join(out, "sched_%s.yaml" % kind), native],
                 ["export", native, again]):
        p = conftest.subprocess.run([tool] + args, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(hf, "model.safetensors"), "rb") as a, \
            open(os.path.join(again, "model.safetensors"), "rb") as b:
        assert a.read() == b.read()


@needs_mpi
def test_unnamed_refused(out):
    for r in range(WORLD):
        got = rank(out, "unnamed", r, "")
        for what in ("export_hf", "import_hf"):
            assert got[what] is not None, what
            kind, msg = got[what]
            assert kind == "UsageError", got[what]
            assert "%s: the Distinct tensor 'moe.experts.0.w1.weight'" % what in msg, msg
            assert "has no global name" in msg and "global_names=" in msg, msg
        assert not got["never_exists"]
