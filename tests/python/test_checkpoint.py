"""
test_checkpoint: sharded checkpoints through the Python package
(Runtime.save_checkpoint / load_checkpoint / import_hf / export_hf and
mfsdp.torch.ShardedModel's, docs/checkpoint.md, docs/pytorch.md).

Under mpirun -np 4 (ckpt_worker.py; the saves in one launch, the loads in
the next, so in fresh processes): 6 AdamW steps straight on a 2 x 2 HFSDP
mesh, against 3 steps, a save, and 3 more steps in fresh processes that
resume from it (from a model initialised
with another seed): losses, master shards, both Adam moments and the step
counter bit for bit. The checkpoint, saved on a 2 x 2 HSDP mesh (replicated
shards), loaded on 1 x 4 ZeRO-3 and 2 x 2 HFSDP: every element of every
master weight and moment, assembled from the ranks' shards, bit-equal to the
saved ones. In one process: the Runtime-level API with NumPy states and a
user blob, the refusal of another model's checkpoint (nothing written), and
a Hugging Face checkpoint written by the reference `safetensors` package
imported (bf16, with a prefix rule), exported and re-read bit-exactly; on
8 thread-ranks of the HSDP example, a load reads each unique byte once
(Loaded.bytes_read) though every byte is held at least twice.
"""
import glob
import json
import os

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import conftest
import gpt
import mfsdp
import mfsdp.torch as mt

MESH2 = "dp_outer=2,dp_inner=2"


def launch(tmp, *runs):
    """Runs ckpt_worker.py's runs [(tag, layout, mesh, start, stop, total,
    load, save)] one after the other in one mpirun (fresh processes for the
    launch, not for each run); returns {tag: [rank 0..3's dump]}."""
    args = []
    for tag, layout, mesh, start, stop, total, load, save in runs:
        out = tmp / tag
        out.mkdir()
        args += (["+"] if args else []) + [str(out), layout, mesh, str(start), str(stop),
                                          str(total)]
        if load:
            args += ["--load", str(load)]
        if save:
            args += ["--save", str(save)]
    p = conftest.run_ranks("ckpt_worker.py", args, timeout=300)
    tags = [r[0] for r in runs]
    assert p.returncode == 0, "%s failed:\n%s\n%s" % (tags, p.stdout[-3000:], p.stderr[-3000:])
    return {t: [torch.load(tmp / t / ("rank%d.pt" % r)) for r in range(4)] for t in tags}


def bits(t):
    return t.reshape(-1).view(torch.int32)


def assert_bitwise(a, b, what):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    bad = int((bits(a) != bits(b)).sum())
    assert bad == 0, "%s: %d elements differ" % (what, bad)


def full_tensors(dumps, key):
    """{tensor: full flat tensor} assembled from every rank's shards; every
    element must be covered and replicas must agree."""
    shapes = {n: gpt.make_model().get_parameter(n).numel()
              for n in {n for d in dumps for n in d["tensors"]}}
    full = {n: torch.full((k,), float("nan")) for n, k in shapes.items()}
    for d in dumps:
        for n, t in d["tensors"].items():
            part = full[n][t["offset"]:t["offset"] + t[key].numel()]
            seen = ~torch.isnan(part)
            assert torch.equal(bits(part[seen]), bits(t[key][seen])), "replicas differ: " + n
            part.copy_(t[key])
    for n, f in full.items():
        assert not torch.isnan(f).any(), "%s: elements held by no rank" % n
    return full


def test_resume_in_fresh_processes_is_bitwise_and_reshards(tmp_path):
    ck, ck_hsdp = tmp_path / "ck-3", tmp_path / "ck-hsdp"
    # the saves in one launch; every load in the next (fresh processes)
    saves = launch(tmp_path, ("straight", "hfsdp", MESH2, 0, 6, 6, None, None),
                   ("first", "hfsdp", MESH2, 0, 3, 6, None, ck),
                   ("hsdp", "hsdp", MESH2, 0, 2, 2, None, ck_hsdp))   # replicas split the writes
    assert sorted(os.listdir(tmp_path)) == ["ck-3", "ck-hsdp", "first", "hsdp", "straight"]
    mfsdp.verify_checkpoint(str(ck))                         # ^ no temporary left
    m = mfsdp.read_manifest(str(ck))
    assert m["step"] == 3 and m["world"] == 4
    assert [s["name"] for s in m["states"]] == ["main_weight", "exp_avg", "exp_avg_sq"]
    loads = launch(tmp_path, ("resumed", "hfsdp", MESH2, 3, 6, 6, ck, None),
                   ("load-zero3", "zero3", "dp=4", 2, 2, 2, ck_hsdp, None),
                   ("load-hfsdp", "hfsdp", MESH2, 2, 2, 2, ck_hsdp, None))
    straight, first, resumed = saves["straight"], saves["first"], loads["resumed"]
    for r in range(4):
        assert first[r]["losses"] == straight[r]["losses"][:3]
        assert resumed[r]["losses"] == straight[r]["losses"][3:], (r, resumed[r]["losses"])
        assert set(resumed[r]["tensors"]) == set(straight[r]["tensors"])
        for n, t in straight[r]["tensors"].items():
            u = resumed[r]["tensors"][n]
            assert u["offset"] == t["offset"]
            for key in ("main", "exp_avg", "exp_avg_sq", "step"):
                assert_bitwise(u[key], t[key], "rank %d %s %s" % (r, n, key))
    assert float(resumed[0]["tensors"]["wte.weight"]["step"]) == 6.0

    # reshard: saved on HSDP, loaded elsewhere
    want = {k: full_tensors(saves["hsdp"], k) for k in ("main", "exp_avg", "exp_avg_sq")}
    for tag in ("zero3", "hfsdp"):
        got = loads["load-" + tag]
        for key in want:
            have = full_tensors(got, key)
            for n in want[key]:
                assert_bitwise(have[n], want[key][n], "%s %s %s" % (tag, n, key))
        assert all(float(t["step"]) == 2.0 for d in got for t in d["tensors"].values())


SPEC = """
mesh dp = 1;
microbatches 1;
layout z { weight fp32 [Replicate]; grad fp32 [Partial]; main_weight fp32 [Replicate]; }
unit "a" layout z { tensor "w" [3, 4]; tensor "b" [4]; }
"""


def test_runtime_level_save_load_and_refusal(tmp_path):
    s = mfsdp.Schedule.compile(SPEC)
    ck = str(tmp_path / "ck")
    with mfsdp.Runtime(s, backend="local") as rt:
        rt.array("a.w", "main_weight")[...] = np.arange(12, dtype=np.float32) / 8
        rt.array("a.b", "main_weight")[...] = [1.5, -2.0, 0.25, 3.0]
        mom = {"a.w": np.full(12, 0.5, np.float32), "a.b": np.arange(4, dtype=np.float32)}
        rt.save_checkpoint(ck, step=11, states={"mom": mom}, user_blob=b"loader at 42")
    with pytest.raises(mfsdp.MfsdpError, match="already exists"):
        with mfsdp.Runtime(s, backend="local") as rt:
            rt.save_checkpoint(ck)
    with mfsdp.Runtime(s, backend="local") as rt:
        got = rt.load_checkpoint(ck, states=["mom"], verify_files=True)
        assert got.step == 11 and got.user_blob == b"loader at 42"
        assert (rt.array("a.w", "main_weight") == np.arange(12, dtype=np.float32) / 8).all()
        assert list(rt.array("a.b", "main_weight")) == [1.5, -2.0, 0.25, 3.0]
        assert (got.states["mom"]["a.w"] == 0.5).all() and list(got.states["mom"]["a.b"]) == [0, 1, 2, 3]
        with pytest.raises(mfsdp.MfsdpError, match="state 'nope' is not in the checkpoint"):
            rt.load_checkpoint(ck, states=["nope"])
    other = mfsdp.Schedule.compile(SPEC.replace('"b" [4]', '"b" [5]'))
    with mfsdp.Runtime(other, backend="local") as rt:
        rt.array("a.w", "main_weight")[...] = 7.0
        with pytest.raises(mfsdp.MfsdpError) as e:
            rt.load_checkpoint(ck)
        assert e.value.code_name == "MFSDP_ERR_LOAD"
        assert "tensor 'a.b' has shape [4] in the checkpoint, [5] in the schedule" in e.value.message
        assert (rt.array("a.w", "main_weight") == 7.0).all()       # nothing written
    with pytest.raises(mfsdp.MfsdpError, match="not a committed checkpoint"):
        mfsdp.verify_checkpoint(str(tmp_path))


def test_hf_import_export_through_the_package(tmp_path):
    model = gpt.make_model()
    g = torch.Generator().manual_seed(5)
    hf = {"model." + n: torch.randn(p.shape, generator=g).to(torch.bfloat16)
          for n, p in model.named_parameters()}
    src = tmp_path / "hf"
    src.mkdir()
    safetensors.torch.save_file(hf, str(src / "model.safetensors"), metadata={"format": "pt"})
    spec = mt.spec_from_module(model, mesh={"dp": 1}, layout="zero3", microbatches=1)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec), backend="local")
    sm.import_hf(str(src), maps={"model.": ""})
    full = sm.full_state_dict()
    for n, t in hf.items():
        assert_bitwise(full[n[len("model."):]], t.float(), n)        # bf16 widens exactly
    out = tmp_path / "export"
    sm.export_hf(str(out), dtype=torch.bfloat16, maps={"model.": ""})
    back = safetensors.torch.load_file(str(out / "model.safetensors"))
    assert set(back) == set(hf)
    for n, t in hf.items():
        assert back[n].dtype == torch.bfloat16 and torch.equal(back[n].view(torch.int16),
                                                               t.view(torch.int16)), n
    out32 = tmp_path / "export32"
    sm.runtime.export_hf(str(out32), max_file_bytes=20000)            # fp32, several files
    index = json.loads((out32 / "model.safetensors.index.json").read_text())
    files = sorted(glob.glob(str(out32 / "model-*-of-*.safetensors")))
    assert len(files) > 1 and set(index["weight_map"].values()) == {os.path.basename(f) for f in files}
    merged = {}
    for f in files:
        merged.update(safetensors.numpy.load_file(f))
    for n, t in hf.items():
        assert np.array_equal(merged[n[len("model."):]], t.float().numpy()), n
    bad = tmp_path / "bad"
    bad.mkdir()
    hf2 = dict(hf)
    hf2["model.extra"] = torch.zeros(3, dtype=torch.bfloat16)
    del hf2["model.ln_f.bias"]
    safetensors.torch.save_file(hf2, str(bad / "model.safetensors"))
    with pytest.raises(mfsdp.MfsdpError) as e:
        sm.import_hf(str(bad), maps={"model.": ""})
    assert "no Hugging Face tensor maps to 'ln_f.bias'" in e.value.message
    assert "'model.extra'" in e.value.message
    assert_bitwise(sm.full_state_dict()["wte.weight"], hf["model.wte.weight"].float(), "unchanged")
    sm.close()


def test_replicas_share_reads_on_thread_ranks(tmp_path):
    """8 thread-ranks of the HSDP example (master weights replicated across
    dp_outer, some tensors on every rank): a save and a load through the package with one optimizer
    state; the load reads every unique byte once over the ranks
    (Loaded.bytes_read), while the ranks hold each byte at least twice, and every
    rank's shards come back."""
    from test_package import ROOT, _on_threads
    s = mfsdp.Schedule.load(os.path.join(ROOT, "schedules", "hsdp.yaml"))
    assert s.world_size == 8
    unique = sum(t.numel for t in s.tensors) * 4 * 2       # fp32 main_weight + one fp32 state
    ck = str(tmp_path / "ck")

    def value(t):
        return (np.arange(t.numel, dtype=np.float32) % 251).reshape(t.shape) - 125

    def save(g, r):
        with mfsdp.Runtime(s, backend="local", group=g, rank=r, timeout_ms=60000) as rt:
            for t in s.tensors:
                rt.scatter(t.name, value(t))
            m = {v.name: rt.array(v.name, "main_weight") * 2 + 1 for v in rt.views if v.shard_count}
            rt.save_checkpoint(ck, step=5, states={"m": m})

    def load(g, r):
        with mfsdp.Runtime(s, backend="local", group=g, rank=r, timeout_ms=60000) as rt:
            got = rt.load_checkpoint(ck, states=["m"])
            bad = 0
            for v in rt.views:
                if v.shard_count:
                    want = value(v).reshape(-1)[v.shard_offset:v.shard_offset + v.shard_count]
                    bad += int((rt.array(v.name, "main_weight") != want).sum())
                    bad += int((got.states["m"][v.name] != want * 2 + 1).sum())
            held = sum(v.shard_count * 8 for v in rt.views)
            return got.step, got.bytes_read, held, bad

    g = mfsdp.LocalGroup(8)
    _on_threads(8, lambda r: save(g, r))
    g.close()
    g = mfsdp.LocalGroup(8)
    res = _on_threads(8, lambda r: load(g, r))
    g.close()
    assert all(step == 5 and bad == 0 for step, _, _, bad in res), res
    assert sum(h for _, _, h, _ in res) >= 2 * unique           # every byte held at least twice
    assert sum(b for _, b, _, _ in res) == unique, [b for _, b, _, _ in res]
