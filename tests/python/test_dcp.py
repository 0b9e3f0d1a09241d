"""
test_dcp: PyTorch Distributed Checkpoint in and out of mfsdp
(sm.save_dcp / sm.load_dcp, `mfsdp-ckpt to-dcp` / `from-dcp`;
docs/checkpoint.md, "PyTorch DCP"), against FSDP2 itself.

One mpirun -np 4 (dcp_worker.py): FSDP2 (fully_shard on a 1-D DeviceMesh of
4, AdamW) saves the FSDP2 way and mfsdp loads it into 2 x 2 HFSDP and 1 x 4
ZeRO-3: every element of every master weight, both moments and `step` bit-equal
to FSDP2's full_tensor()s, and one more step then an evaluation equal to
FSDP2's; mfsdp saves and FSDP2 loads (dcp.load, set_model_state_dict,
set_optimizer_state_dict): the same comparisons the other way, and the two
DCP directories' metadata have the same keys, kinds and sizes, each tensor
stored once. In this process (a world of one, FSDP2 on a 1-rank gloo group):
the offline conversions of both directions bit-exact, two param groups
(sm.param_groups) through save_dcp and through to-dcp, SGD's momentum both
ways, and the refusals: a
DCP of another model (every problem listed, nothing written), another
optimizer class, an existing output, inside a step, save_dcp on 4 ranks
without torch.distributed (from the worker), the console script's exit
statuses and its pass-through to the C tool.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

import conftest
import gpt
import mfsdp
import mfsdp.tools
import mfsdp.torch as mt

KEYS = ("main", "exp_avg", "exp_avg_sq")
TIE = "lm_head.weight=wte.weight"


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp")
    p = conftest.run_ranks("dcp_worker.py", [str(d), str(conftest.free_port())], timeout=300)
    assert p.returncode == 0, "worker failed:\n%s\n%s" % (p.stdout[-3000:], p.stderr[-3000:])
    return d


@pytest.fixture(scope="module")
def gloo():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % conftest.free_port(),
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def bits(t):
    return t.reshape(-1).view(torch.int32)


def assert_bitwise(a, b, what):
    assert a.numel() == b.numel(), (what, a.shape, b.shape)
    bad = int((bits(a) != bits(b)).sum())
    assert bad == 0, "%s: %d of %d elements differ" % (what, bad, a.numel())


def assemble(out, tag):
    """{(tensor, key): whole flat tensor} from the 4 ranks' shards (every
    element covered, replicas equal), the step, and the ranks' losses."""
    numel = {n: p.numel() for n, p in gpt.make_model().named_parameters()}
    full, losses = {}, []
    for r in range(4):
        d = torch.load(out / ("%s.rank%d.pt" % (tag, r)))
        losses.append(d["loss"])
        for n, t in d["tensors"].items():
            for k in KEYS:
                f = full.setdefault((n, k), torch.full((numel[n],), float("nan")))
                part = f[t["offset"]:t["offset"] + t[k].numel()]
                seen = ~torch.isnan(part)
                assert torch.equal(bits(part[seen]), bits(t[k][seen])), "replicas differ: " + n
                part.copy_(t[k])
            assert full.setdefault((n, "step"), t["step"]) == t["step"]
    for (n, k), f in full.items():
        assert not torch.isnan(f).any(), "%s %s: elements held by no rank" % (n, k)
    return full, losses


def compare(fsdp2, full, what):
    assert {n for n, _ in full} == set(fsdp2)
    for n, want in fsdp2.items():
        for k in KEYS:
            assert_bitwise(full[(n, k)], want[k], "%s: %s %s" % (what, n, k))
        assert_bitwise(full[(n, "step")], want["step"], "%s: %s step" % (what, n))


def close(a, b):
    assert abs(a - b) <= 1e-5 * abs(b), (a, b)


def test_fsdp2_dcp_loads_into_mfsdp_meshes(out):
    saved = torch.load(out / "fsdp2_saved.rank0.pt")
    for layout in ("hfsdp", "zero3"):
        full, losses = assemble(out, "load_" + layout)
        compare(saved["full"], full, layout)
        assert float(full[("wte.weight", "step")]) == 2.0
        for loss in losses:
            close(loss, saved["loss"])


def test_mfsdp_dcp_loads_into_fsdp2(out):
    full, losses = assemble(out, "mfsdp_saved")
    loaded = torch.load(out / "fsdp2_loaded.rank0.pt")
    compare(loaded["full"], full, "fsdp2")
    close(losses[0], loaded["loss"])
    # the same layout as FSDP2's own: keys, kinds, shapes, dtypes; each stored once
    ours = dcp.FileSystemReader(str(out / "mfsdp")).read_metadata()
    theirs = dcp.FileSystemReader(str(out / "fsdp2")).read_metadata().state_dict_metadata
    md = ours.state_dict_metadata
    assert sorted(md) == sorted(theirs)
    for k, m in theirs.items():
        assert type(md[k]) is type(m), k
        if hasattr(m, "size"):
            assert (md[k].size, md[k].properties.dtype) == (m.size, m.properties.dtype), k
    stored = {}
    for index in ours.storage_data:
        stored[index.fqn] = stored.get(index.fqn, 0) + 1
    assert set(stored.values()) == {1} and set(stored) == set(md)
    sizes = [os.path.getsize(out / "mfsdp" / f) for f in os.listdir(out / "mfsdp")
             if f.endswith(".distcp")]
    assert len(sizes) == 4 and min(sizes) > 0.5 * max(sizes), sizes   # balanced writers
    assert "model.lm_head.weight" in md and "optim.state.lm_head.weight.step" not in md


class Ran:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def tool(capfd):
    """mfsdp-ckpt's main in this process (its C pass-through a child of it)."""
    def run(*args):
        capfd.readouterr()
        rc = mfsdp.tools.main([str(a) for a in args])
        got = capfd.readouterr()
        return Ran(rc, got.out, got.err)
    return run


def fsdp2_model(seed):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = gpt.make_model(seed=seed)
    mesh = init_device_mesh("cpu", (1,))
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1, foreach=False)


def one_rank(model, layout="zero3", M=1):
    spec = mt.spec_from_module(model, mesh={"dp": 1}, layout=layout, microbatches=M)
    return mt.shard(model, mfsdp.Schedule.compile(spec), backend="local")


def test_offline_conversions(out, tmp_path, gloo, tool):
    # to-dcp of mfsdp's checkpoint, then FSDP2 loads it
    p = tool("to-dcp", out / "mfsdp_ck", tmp_path / "td", "--tie", TIE)
    assert p.returncode == 0, p.stderr
    model = fsdp2_model(5)
    opt = adamw(model.parameters())
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(sd, checkpoint_id=str(tmp_path / "td"))
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])
    full, _ = assemble(out, "mfsdp_saved")
    for n, p_ in model.named_parameters():
        st = opt.state[p_]
        assert_bitwise(p_.full_tensor(), full[(n, "main")], "to-dcp " + n)
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert_bitwise(st[k].full_tensor() if k != "step" else st[k], full[(n, k)],
                           "to-dcp %s %s" % (n, k))
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[0]["betas"] == (0.9, 0.999)

    # from-dcp of FSDP2's DCP for the 2 x 2 schedule, loaded on one rank
    p = tool("from-dcp", out / "fsdp2", out / "hfsdp.yaml", tmp_path / "fd", "--tie", TIE)
    assert p.returncode == 0, p.stderr
    sm = one_rank(gpt.make_model(seed=9))
    opt = adamw(sm.main_parameters())
    step, _ = sm.load_checkpoint(str(tmp_path / "fd"), opt)
    assert step == 2
    want = torch.load(out / "fsdp2_saved.rank0.pt")["full"]
    for name, _, mp in sm.shards():
        assert_bitwise(mp.detach(), want[name]["main"], "from-dcp " + name)
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert_bitwise(opt.state[mp][k], want[name][k], "from-dcp %s %s" % (name, k))
    sm.close()

    # the console script: usage 2, refused input 1, nothing half-written, pass-through
    assert tool("to-dcp", out / "mfsdp_ck").returncode == 2
    p = tool("to-dcp", out / "mfsdp_ck", tmp_path / "td")
    assert p.returncode == 1 and "exists" in p.stderr
    p = tool("from-dcp", out / "fsdp2", out / "hfsdp.yaml", tmp_path / "fd2")   # no --tie
    assert p.returncode == 1 and "unexpected 'model.lm_head.weight'" in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "fd2")
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]
    p = tool("info", out / "mfsdp_ck")
    c = subprocess.run([os.environ.get("MFSDP_CKPT", "mfsdp-ckpt"), "info", out / "mfsdp_ck"],
                       capture_output=True, text=True)
    assert (p.returncode, p.stdout) == (c.returncode, c.stdout) and "step: 2" in p.stdout
    assert tool("verify", tmp_path / "nothing").returncode == 1
    h = subprocess.run([sys.executable, "-m", "mfsdp.tools", "--help"], capture_output=True,
                       text=True, env=conftest.env(), timeout=120)
    assert h.returncode == 0 and all(c in h.stdout for c in ("reshard", "to-dcp", "from-dcp"))


def test_refusals(out, tmp_path, gloo):
    nodist = torch.load(out / "nodist.rank1.pt")
    assert "torch.distributed.init_process_group" in nodist["message"] and not nodist["exists"]

    # another model: wrong shapes, missing and unexpected keys, all listed, nothing written
    other = gpt.make_model(layers=3, vocab=72)
    other.extra = torch.nn.Linear(4, 4)
    sm = one_rank(other)
    before = sm.full_state_dict()
    with pytest.raises(mfsdp.UsageError) as e:
        sm.load_dcp(str(out / "fsdp2"), adamw(sm.main_parameters()))
    msg = str(e.value)
    for part in ("'model.wte.weight': shape [64, 32] in the checkpoint, the model has [72, 32]",
                 "missing 'model.extra.weight' [4, 4]", "unexpected 'model.blocks.3.fc.bias'",
                 "unexpected 'optim.state.blocks.3.qkv.weight.exp_avg'",
                 "missing the optimizer state of 'extra.bias'"):
        assert part in msg, msg
    after = sm.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    sm.close()

    # another optimizer class
    sm = one_rank(gpt.make_model())
    with pytest.raises(mfsdp.UsageError, match="param group 0: the checkpoint's options .*betas"
                                               ".* this SGD's .*momentum"):
        sm.load_dcp(str(out / "fsdp2"), torch.optim.SGD(sm.main_parameters(), lr=0.1))

    # an existing directory is never overwritten
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep").write_text("x")
    with pytest.raises(mfsdp.UsageError, match="exists; a checkpoint is never overwritten"):
        sm.save_dcp(str(tmp_path / "taken"))
    assert os.listdir(tmp_path / "taken") == ["keep"]
    sm.close()

    # inside a step (1 of 2 microbatches)
    model = gpt.make_model()
    sm = one_rank(model, M=2)
    opt = adamw(sm.main_parameters())
    X, Y = gpt.make_data(1, 1, 2, 2)
    model(X[0, 0, 0], Y[0, 0, 0]).backward()
    for call in (lambda: sm.save_dcp(str(tmp_path / "mid"), opt),
                 lambda: sm.load_dcp(str(out / "fsdp2"), opt)):
        with pytest.raises(mfsdp.UsageError, match="inside a step"):
            call()
    assert not os.path.exists(tmp_path / "mid")
    sm.close()


def test_two_param_groups_both_ways(tmp_path, gloo, tool):
    """sm.param_groups' two groups (decay / no decay) through save_dcp and
    through save_checkpoint + to-dcp: the same DCP entries, and FSDP2 with the
    same two groups loads them, each parameter's group and state intact."""
    model = gpt.make_model()
    sm = one_rank(model)
    opt = torch.optim.AdamW(sm.param_groups(0.1, lr=3e-3), foreach=False)
    X, Y = gpt.make_data(1, 1, 1, 2)
    model(X[0, 0, 0], Y[0, 0, 0]).backward()
    opt.step()
    opt.zero_grad()
    sm.save_dcp(str(tmp_path / "live"), opt)
    sm.save_checkpoint(str(tmp_path / "ck"), opt)
    full = sm.full_state_dict()
    sm.close()
    assert tool("to-dcp", tmp_path / "ck", tmp_path / "off", "--tie", TIE).returncode == 0
    for d in ("live", "off"):
        ref = fsdp2_model(4)
        decay = [p for n, p in ref.named_parameters() if p.dim() >= 2]
        keep = [p for n, p in ref.named_parameters() if p.dim() < 2]
        ropt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                  {"params": keep, "weight_decay": 0.0}], lr=3e-3, foreach=False)
        sd = {"model": get_model_state_dict(ref), "optim": get_optimizer_state_dict(ref, ropt)}
        dcp.load(sd, checkpoint_id=str(tmp_path / d))
        groups = sd["optim"]["param_groups"]
        assert [g["weight_decay"] for g in groups] == [0.1, 0.0], d
        assert "wte.weight" in groups[0]["params"] and "ln_f.bias" in groups[1]["params"], d
        set_model_state_dict(ref, sd["model"])
        set_optimizer_state_dict(ref, ropt, sd["optim"])
        for n, p in ref.named_parameters():
            assert_bitwise(p.full_tensor(), full[n], "%s %s" % (d, n))
            assert float(ropt.state[p]["step"]) == 1.0


def test_sgd_momentum_both_ways(tmp_path, gloo):
    """SGD's momentum_buffer: mfsdp's save_dcp loads into FSDP2's SGD, and
    FSDP2's DCP back into a fresh mfsdp SGD, bit for bit."""
    model = gpt.make_model()
    sm = one_rank(model)
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.05, momentum=0.9, foreach=False)
    X, Y = gpt.make_data(1, 1, 1, 2)
    model(X[0, 0, 0], Y[0, 0, 0]).backward()
    opt.step()
    opt.zero_grad()
    sm.save_dcp(str(tmp_path / "sgd"), opt)
    want = {n: (mp.detach().clone(), opt.state[mp]["momentum_buffer"].clone())
            for n, _, mp in sm.shards()}
    sm.close()
    ref = fsdp2_model(4)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5, foreach=False)
    sd = {"model": get_model_state_dict(ref), "optim": get_optimizer_state_dict(ref, ropt)}
    dcp.load(sd, checkpoint_id=str(tmp_path / "sgd"))
    set_model_state_dict(ref, sd["model"])
    set_optimizer_state_dict(ref, ropt, sd["optim"])
    assert (ropt.param_groups[0]["lr"], ropt.param_groups[0]["momentum"]) == (0.05, 0.9)
    for n, p in ref.named_parameters():
        assert_bitwise(p.full_tensor(), want[n][0], n)
        assert_bitwise(ropt.state[p]["momentum_buffer"].full_tensor(), want[n][1], n)
    sd = {"model": get_model_state_dict(ref), "optim": get_optimizer_state_dict(ref, ropt)}
    dcp.save(sd, checkpoint_id=str(tmp_path / "sgd2"))
    sm = one_rank(gpt.make_model(seed=8), layout="ddp")
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.1, momentum=0.5, foreach=False)
    sm.load_dcp(str(tmp_path / "sgd2"), opt)
    assert (opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"]) == (0.05, 0.9)
    for n, _, mp in sm.shards():
        assert_bitwise(mp.detach(), want[n][0], "back " + n)
        assert_bitwise(opt.state[mp]["momentum_buffer"], want[n][1], "back " + n)
    sm.close()
