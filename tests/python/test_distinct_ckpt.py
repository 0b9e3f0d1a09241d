"""
test_distinct_ckpt: native checkpoints (sm.save_checkpoint / load_checkpoint)
of models with Distinct tensors (issue #42 item 2), through
distinct_ckpt_worker.py on the models of distinct_worker.py: the TP = 2 x
DP = 2 column/row MLP (w1 under the split global name `split 0`, w2 `split
1`) and the EP = 2 x DP = 2 top-1 MoE (experts renamed: local expert e of ep
coordinate c is global expert 2c + e), trained with Adam.

One launch on 4 MPI ranks saves after 2 steps and takes a third step; a
fresh model of other values loads the checkpoint with a fresh Adam and takes
the same third step; a launch on 2 ranks (tp or ep = 2 x dp = 1) loads it
again. Checked here, with the test's own knowledge of the naming and none of
the code under test:
  - the checkpoint's files hold the whole model: its tensors are the whole
    model's names and shapes, and main_weight, exp_avg and exp_avg_sq read
    from the files' pieces equal, bit for bit, the 4 ranks' master shards
    and Adam states at the save put together (TP slices concatenated along
    their dims, experts renamed);
  - the load on 4 ranks gives every rank back its master shards and Adam
    states bit for bit, and the resumed step's loss and every shard equal
    the uninterrupted run's bit for bit;
  - the load on 2 ranks gives each coordinate's tensors (master and Adam
    states) bit for bit (the TP one staged, MFSDP_CKPT_STAGE=1: through the
    backend's stage hook as on a GPU, each rank reading w2's slice row by
    row);
  - refused, naming the tensor: save_checkpoint of the model without global
    names (global_names=, nothing written), and a TP = 4 model loading the
    TP = 2 checkpoint;
  - offline (mfsdp-ckpt reshard, the same plan code): the checkpoint written
    again for dp = 1 holds the same whole model, every state bit for bit; for
    tp = 4 refused naming the tensor, nothing written.
"""
import json
import os

import numpy as np
import pytest
import torch

import conftest
import distinct_worker as dw
import mfsdp

WORLD = 4
STATES = ("main_weight", "exp_avg", "exp_avg_sq")

needs_mpi = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                               reason="libmfsdp built without the MPI backend")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("distinct_ckpt")
    script = [conftest.sys.executable, os.path.join(conftest.HERE, "distinct_ckpt_worker.py"),
              str(out)]
    for np_, what in ((str(WORLD), "save"), ("2", "reload2")):
        mpirun = [a if a != str(WORLD) else np_ for a in conftest.mpirun()]
        p = conftest.subprocess.run(mpirun + script + [str(conftest.free_port()), what],
                                    env=conftest.env(), cwd=str(out), capture_output=True,
                                    text=True, timeout=240)
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    got = {(k, r): torch.load(os.path.join(out, "%s.rank%d.pt" % (k, r)))
           for k in ("tp", "moe") for r in range(WORLD)}
    got.update({("reload2_" + k, r): torch.load(os.path.join(out, "reload2_%s.rank%d.pt"
                                                              % (k, r)))
                for k in ("tp", "moe") for r in range(2)})
    got["dir"] = str(out)
    return got


def distinct(kind, name):
    return ".experts." in name if kind == "moe" else (".w1." in name or ".w2." in name)


def locals_of(runs, kind, ranks, key, what, dp):
    """{(name, coordinate or None): flat local tensor} put together from the
    ranks' shards (`what`: "saved" or "loaded"; key: None for the master
    weights, else an Adam state)."""
    local = dw.TPModel(2) if kind == "tp" else dw.MoEModel(dw.EP)
    numel = {n: p.numel() for n, p in local.named_parameters()}
    out = {}
    for r in ranks:
        shards, states = runs[r][what]
        c = r // dp
        for n, (off, x) in (shards if key is None else states[key]).items():
            k = (n, c if distinct(kind, n) else None)
            t = out.setdefault(k, torch.full((numel[n],), float("nan")))
            t[off:off + x.numel()] = x
    for k, t in out.items():
        assert not torch.isnan(t).any(), "%s: %s has elements no rank holds" % (what, k)
    return out


def whole_of(kind, loc):
    """The whole model's tensors from the coordinates' local ones."""
    shapes = {n: p.shape for n, p in (dw.TPModel(2) if kind == "tp" else dw.MoEModel(dw.EP))
              .named_parameters()}
    out = {}
    for (n, c), t in loc.items():
        if c is None:
            out[n] = t.view(shapes[n])
        elif kind == "moe":
            out[dw.moe_global_name(n, c)] = t.view(shapes[n])
    if kind == "tp":
        for n in shapes:
            if distinct(kind, n):
                dim = 1 if n.endswith("w2.weight") else 0
                out[n] = torch.cat([loc[(n, c)].view(shapes[n]) for c in range(2)], dim=dim)
    return out


def read_checkpoint(path):
    """{state: {tensor: tensor}} read from the checkpoint's manifest and files
    (pieces: [state, tensor, start, end, byte offset]; fp32)."""
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    assert [s["name"] for s in m["states"]] == list(STATES)
    out = {s: {t["name"]: torch.full(t["shape"], float("nan")).reshape(-1)
               for t in m["tensors"]} for s in STATES}
    for f in m["files"]:
        data = open(os.path.join(path, f["name"]), "rb").read()
        for s, t, a, e, off in f["pieces"]:
            x = np.frombuffer(data, dtype=np.float32, count=e - a, offset=off)
            out[STATES[s]][m["tensors"][t]["name"]][a:e] = torch.from_numpy(x.copy())
    return m, {s: {n: x.view(*next(t["shape"] for t in m["tensors"] if t["name"] == n))
                   for n, x in d.items()} for s, d in out.items()}


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_checkpoint_holds_whole_model(runs, kind):
    m, ck = read_checkpoint(os.path.join(runs["dir"], "ckpt_%s" % kind))
    whole = {n: tuple(p.shape) for n, p in dw.whole_model(kind).named_parameters()}
    assert {t["name"]: tuple(t["shape"]) for t in m["tensors"]} == whole
    assert m["step"] == 2
    four = {r: runs[(kind, r)] for r in range(WORLD)}
    for s, key in zip(STATES, (None, "exp_avg", "exp_avg_sq")):
        want = whole_of(kind, locals_of(four, kind, range(WORLD), key, "saved", 2))
        assert set(want) == set(whole)
        for n in whole:
            assert torch.equal(ck[s][n], want[n]), (s, n)


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_resume_bit_exact(runs, kind):
    for r in range(WORLD):
        got = runs[(kind, r)]
        assert got["load_step"] == 2
        for what in ("loaded", "after2"):
            ref = got["saved" if what == "loaded" else "after"]
            assert set(got[what][0]) == set(ref[0])
            for n, (off, x) in ref[0].items():
                assert got[what][0][n][0] == off and torch.equal(got[what][0][n][1], x), \
                    (what, r, n)
            for key, d in ref[1].items():
                assert set(got[what][1][key]) == set(d) and d
                for n, (off, x) in d.items():
                    assert torch.equal(got[what][1][key][n][1], x), (what, r, key, n)
        assert got["loss2"] == got["loss"]


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_load_on_two_ranks(runs, kind):
    four = {r: runs[(kind, r)] for r in range(WORLD)}
    two = {r: runs[("reload2_" + kind, r)] for r in range(2)}
    assert [two[r]["coords"][0] for r in range(2)] == [0, 1]
    for key in (None, "exp_avg", "exp_avg_sq"):
        want = locals_of(four, kind, range(WORLD), key, "saved", 2)
        got = locals_of(two, kind, range(2), key, "loaded", 1)
        assert set(got) == set(want)
        for k in want:
            assert torch.equal(got[k], want[k]), (key, k)


@needs_mpi
def test_refusals(runs):
    for kind, tensor in (("tp", "blocks.0.w1.weight"), ("moe", "moe.experts.0.w1.weight")):
        msg = runs[(kind, 0)]["unnamed"]
        assert msg and "save_checkpoint" in msg and repr(tensor) in msg \
            and "global_names=" in msg, msg
        assert not runs[(kind, 0)]["never_exists"]
    msg = runs[("tp", 0)]["tp4"]
    assert msg and "tensor 'blocks.0.w1.weight' (global 'blocks.0.w1.weight' split 0)" in msg \
        and "axis 'tp' of size 4 here, 2 in the checkpoint" in msg, msg


def schedule(tmp, kind, mesh):
    """The run's spec on mesh compiled to tmp/<kind>_<sizes>.yaml (mfsdpc)."""
    import mfsdp.torch as mt
    model = dw.TPModel(mesh["tp"]) if kind == "tp" else dw.MoEModel(mesh["ep"])
    distinct = {"blocks.*.w1.*": "tp", "blocks.*.w2.*": "tp"} if kind == "tp" \
        else {"moe.experts.*": "ep"}
    text = mt.spec_from_module(model, mesh=mesh, layout=dw.RUNS[kind][1], microbatches=dw.M,
                               distinct=distinct, global_names=dw.global_names(kind),
                               units=None if kind == "tp" else ["embed", "moe", "head"])
    base = os.path.join(str(tmp), "%s_%s" % (kind, "x".join(str(v) for v in mesh.values())))
    with open(base + ".mfsdp", "w") as f:
        f.write(text)
    c = conftest.subprocess.run([os.environ.get("MFSDPC", "mfsdpc"), "compile", base + ".mfsdp",
                                 "-o", base + ".yaml"], capture_output=True, text=True)
    assert c.returncode == 0, c.stderr
    return base + ".yaml"


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_offline_reshard(runs, kind, tmp_path):
    """mfsdp-ckpt reshard onto dp = 1 (the same plan code): the same whole
    model, every state, bit for bit; onto tp = 4 refused naming the tensor."""
    tool = os.environ.get("MFSDP_CKPT", "mfsdp-ckpt")
    src = os.path.join(runs["dir"], "ckpt_%s" % kind)
    axis = "tp" if kind == "tp" else "ep"
    yaml = schedule(tmp_path, kind, {axis: 2, "dp": 1})
    c = conftest.subprocess.run([tool, "reshard", src, yaml, str(tmp_path / "out")],
                                capture_output=True, text=True)
    assert c.returncode == 0, c.stderr
    m, got = read_checkpoint(str(tmp_path / "out"))
    assert m["world"] == 2
    want = read_checkpoint(src)[1]
    for s in STATES:
        assert set(got[s]) == set(want[s])
        for n in want[s]:
            assert torch.equal(got[s][n], want[s][n]), (s, n)
    if kind == "tp":
        yaml = schedule(tmp_path, kind, {"tp": 4, "dp": 1})
        c = conftest.subprocess.run([tool, "reshard", src, yaml, str(tmp_path / "out4")],
                                    capture_output=True, text=True)
        assert c.returncode == 1 and "axis 'tp' of size 4 here, 2 in the checkpoint" in c.stderr \
            and "tensor 'blocks.0.w1.weight'" in c.stderr, c.stderr
        assert not os.path.exists(str(tmp_path / "out4"))
