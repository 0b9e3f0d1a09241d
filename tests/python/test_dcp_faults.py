"""
test_dcp_faults: a DCP load is all or nothing and every fault an mfsdp error
(issue 39 points 3 to 6; docs/checkpoint.md, "What a DCP load trusts"), in
this process on a world of one, seconds in all:

- a bit flip in a payload, `.metadata` edited (a dtype float32 -> bfloat16,
  with and without mfsdp's checksums), a storage path `../` out of the
  directory, a symlink, a FIFO (an error at once, no hang), a truncated
  file, an edited storage length: each refused by load_dcp naming the
  cause, with no master weight, optimizer state or buffer changed (a small
  batch_bytes, so the refusal comes after earlier batches were read), and
  by `mfsdp-ckpt from-dcp` as one line and exit status 1, no output left;
- save_dcp that cannot write (RLIMIT_FSIZE: the file-size limit, SIGXFSZ
  ignored): a UsageError and no PATH.tmp-* left;
- a save killed mid-write (SIGKILL) leaves PATH.tmp-ID; the next save into
  the same parent removes it; overwrite=True replaces a checkpoint, and
  refuses to replace what is not one.
"""
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import conftest
import gpt
import mfsdp
import mfsdp.tools
import mfsdp.torch as mt
from mfsdp.torch import dcp as tdcp
from mfsdp.torch import dcp_files

TIE = "lm_head.weight=wte.weight"


def one_rank(seed=0):
    model = gpt.make_model(seed=seed)
    spec = mt.spec_from_module(model, mesh={"dp": 1}, layout="zero3")
    sched = mfsdp.Schedule.compile(spec)
    return model, mt.shard(model, sched, backend="local"), sched


def trained(seed=0):
    model, sm, sched = one_rank(seed)
    opt = torch.optim.AdamW(sm.main_parameters(), lr=3e-3, foreach=False)
    X, Y = gpt.make_data(1, 1, 1, 2)
    model(X[0, 0, 0], Y[0, 0, 0]).backward()
    opt.step()
    opt.zero_grad()
    return model, sm, opt, sched


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An mfsdp-written DCP (with its checksums) and the schedule's YAML."""
    d = tmp_path_factory.mktemp("dcpf")
    model, sm, opt, sched = trained()
    sm.save_dcp(str(d / "good"), opt)
    (d / "sched.yaml").write_bytes(sched.text)
    sm.close()
    return d


def snapshot(sm, opt):
    full = {k: v.clone() for k, v in sm.full_state_dict().items()}
    st = {mp: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
          for mp, s in opt.state.items()}
    return full, st


def unchanged(a, b):
    (fa, sa), (fb, sb) = a, b
    assert all(torch.equal(fa[k], fb[k]) for k in fa)
    assert set(sa) == set(sb)
    for mp in sa:
        for k in sa[mp]:
            assert torch.equal(torch.as_tensor(sa[mp][k]), torch.as_tensor(sb[mp][k])), k


def payload(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".distcp"))[0]


def edit_metadata(d, fn):
    p = d / ".metadata"
    md = pickle.loads(p.read_bytes())
    fn(md)
    p.write_bytes(pickle.dumps(md))


def refused(tmp_path, d, *needles, tool=None):
    """load_dcp of d into a trained model (batch_bytes small) raises a
    UsageError with every needle and changes nothing; with `tool` (pytest's
    capfd), mfsdp-ckpt from-dcp exits 1 with one line and leaves no output."""
    model, sm, opt, sched = trained(seed=3)
    before = snapshot(sm, opt)
    with pytest.raises(mfsdp.UsageError) as e:
        sm.load_dcp(str(d), opt, batch_bytes=4096)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))
    unchanged(before, snapshot(sm, opt))
    sm.close()
    if tool:
        out = tmp_path / "from"
        tool.readouterr()
        rc = mfsdp.tools.main(["from-dcp", str(d), str(d.parent / "sched.yaml"), str(out),
                               "--tie", TIE])
        err = tool.readouterr().err
        lines = err.strip().splitlines()
        assert rc == 1 and len(lines) == 1, err
        assert lines[0].startswith("mfsdp-ckpt from-dcp: error:") and needles[0] in lines[0], err
        assert not os.path.exists(out)
    return str(e.value)


def copy(saved, tmp_path, name="c"):
    d = tmp_path / "ck" / name
    shutil.copytree(saved / "good", d)
    shutil.copy(saved / "sched.yaml", tmp_path / "ck" / "sched.yaml")
    return d


def test_good_checkpoint_loads_and_has_checksums(saved):
    assert os.path.isfile(saved / "good" / dcp_files.SUMS)
    model, sm, opt, _ = trained(seed=3)
    sm.load_dcp(str(saved / "good"), opt, batch_bytes=4096)
    want = trained()[1].full_state_dict()
    assert all(torch.equal(want[k], v) for k, v in sm.full_state_dict().items())


def test_bit_flip_refused(saved, tmp_path, capfd):
    d = copy(saved, tmp_path)
    f = d / payload(d)
    data = bytearray(f.read_bytes())
    data[len(data) - 100] ^= 0x10                       # inside the last tensor's bytes
    f.write_bytes(bytes(data))
    refused(tmp_path, d, "do not match their checksum", tool=capfd)


def test_metadata_dtype_edit_refused(saved, tmp_path, capfd):
    def to_bf16(md):
        md.state_dict_metadata["model.wte.weight"].properties.dtype = torch.bfloat16
    d = copy(saved, tmp_path, "sums")
    edit_metadata(d, to_bf16)
    refused(tmp_path, d, ".metadata does not match its checksum", tool=capfd)
    d = copy(saved, tmp_path, "nosums")                 # a DCP written by others: no checksums
    os.unlink(d / dcp_files.SUMS)
    edit_metadata(d, to_bf16)
    refused(tmp_path, d, "'model.wte.weight': dtype torch.bfloat16 in the checkpoint, the "
                         "model's torch.float32", tool=capfd)


def test_storage_dtype_differs_from_metadata(saved, tmp_path):
    """.metadata and the model agree on bfloat16 for an optimizer state the
    storage holds as float32: the stored dtype is checked, not converted."""
    d = copy(saved, tmp_path)
    os.unlink(d / dcp_files.SUMS)
    edit_metadata(d, lambda md: setattr(
        md.state_dict_metadata["optim.state.wte.weight.exp_avg"].properties, "dtype",
        torch.bfloat16))
    refused(tmp_path, d, "'optim.state.wte.weight.exp_avg' is stored as torch.float32, "
                         ".metadata says torch.bfloat16")


def test_paths_outside_symlinks_fifos_refused(saved, tmp_path, capfd):
    d = copy(saved, tmp_path, "up")
    os.unlink(d / dcp_files.SUMS)
    name = payload(d)
    os.makedirs(tmp_path / "other")
    shutil.copy(d / name, tmp_path / "other" / name)

    def leave(md):
        for info in md.storage_data.values():
            info.relative_path = "../other/" + info.relative_path
    edit_metadata(d, leave)
    refused(tmp_path, d, "'../other/%s' is not a file name inside the checkpoint" % name,
            tool=capfd)

    d = copy(saved, tmp_path, "link")
    os.rename(d / name, tmp_path / "other" / "moved.distcp")
    os.symlink(tmp_path / "other" / "moved.distcp", d / name)
    refused(tmp_path, d, "is a symbolic link, not a regular file", tool=capfd)

    d = copy(saved, tmp_path, "fifo")
    os.unlink(d / name)
    os.mkfifo(d / name)
    signal.alarm(60)                    # a hang fails the test instead of blocking CI
    try:
        refused(tmp_path, d, "is a FIFO, not a regular file", tool=capfd)
    finally:
        signal.alarm(0)


def test_truncated_or_edited_storage_refused_before_writing(saved, tmp_path, capfd):
    d = copy(saved, tmp_path, "trunc")
    f = d / payload(d)
    os.truncate(f, os.path.getsize(f) - 4096)
    refused(tmp_path, d, "(truncated?)", tool=capfd)
    d = copy(saved, tmp_path, "len")
    os.unlink(d / dcp_files.SUMS)

    def shorten(md):
        for mi, info in md.storage_data.items():
            if mi.fqn == "model.blocks.3.fc.weight":
                info.length = 64
    edit_metadata(d, shorten)
    refused(tmp_path, d, "'model.blocks.3.fc.weight': the chunk at [0, 0] holds 64 bytes, 4096 "
                         "torch.float32 elements take 16384", tool=capfd)
    d = copy(saved, tmp_path, "swap")                   # two entries of 4096 elements swapped
    os.unlink(d / dcp_files.SUMS)

    def swap(md):
        by = {mi.fqn: mi for mi in md.storage_data}
        a, b = by["model.blocks.1.fc.weight"], by["model.blocks.1.out.weight"]
        md.storage_data[a], md.storage_data[b] = md.storage_data[b], md.storage_data[a]
    edit_metadata(d, swap)
    msg = refused(tmp_path, d, ".metadata's chunk has [", tool=capfd)
    assert "'model.blocks.1.fc.weight' is stored with shape [32, 128], .metadata's chunk has " \
           "[128, 32]" in msg or "'model.blocks.1.out.weight' is stored with shape [128, 32], " \
           ".metadata's chunk has [32, 128]" in msg, msg


def test_save_that_cannot_write_leaves_nothing(tmp_path, capfd):
    model, sm, opt, _ = trained()
    sm.save_checkpoint(str(tmp_path / "ck"), opt)
    out = tmp_path / "out"
    out.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512 << 10, hard))   # the payload is ~1 MiB
    try:
        with pytest.raises(mfsdp.UsageError) as e:
            sm.save_dcp(str(out / "big"), opt)
        capfd.readouterr()
        rc = mfsdp.tools.main(["to-dcp", str(tmp_path / "ck"), str(out / "conv"), "--tie", TIE])
        err = capfd.readouterr().err
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert str(e.value).startswith("save_dcp: writing %s.tmp-" % (out / "big")), str(e.value)
    assert "failed on rank 0: rank 0: " in str(e.value), str(e.value)
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("mfsdp-ckpt to-dcp: error: writing %s.tmp-" % (out / "conv")), err
    assert os.listdir(out) == []
    sm.close()


KILLED = """
import os, signal, sys
sys.path[:0] = [%r]
import torch, torch.distributed.checkpoint as dcp
import gpt, mfsdp, mfsdp.torch as mt
model = gpt.make_model()
sm = mt.shard(model, mfsdp.Schedule.compile(mt.spec_from_module(model, {"dp": 1}, layout="zero3")),
              backend="local")
real = dcp.save
def save_then_die(*a, **kw):
    real(*a, **kw)
    os.kill(os.getpid(), signal.SIGKILL)
dcp.save = save_then_die
sm.save_dcp(sys.argv[1])
"""


def test_killed_save_residue_cleaned_and_overwrite(tmp_path):
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED % conftest.HERE),
                        str(tmp_path / "a")], env=conftest.env(), timeout=120)
    assert p.returncode == -signal.SIGKILL
    residue = [f for f in os.listdir(tmp_path) if ".tmp-" in f]
    assert len(residue) == 1 and not os.path.exists(tmp_path / "a")
    model, sm, opt, _ = trained()
    sm.save_dcp(str(tmp_path / "b"), opt)              # another name, the same parent
    assert sorted(os.listdir(tmp_path)) == ["b"]

    with pytest.raises(mfsdp.UsageError, match="overwrite=True"):
        sm.save_dcp(str(tmp_path / "b"), opt)
    X, Y = gpt.make_data(2, 1, 1, 2)
    model(X[1, 0, 0], Y[1, 0, 0]).backward()
    opt.step()
    tdcp.save_dcp(sm, str(tmp_path / "b"), opt, overwrite=True)   # sm.save_dcp's overwrite: shard.py
    assert sorted(os.listdir(tmp_path)) == ["b"]
    want = sm.full_state_dict()
    sm.close()
    model, sm, opt, _ = trained(seed=3)
    sm.load_dcp(str(tmp_path / "b"), opt)
    assert all(torch.equal(want[k], v) for k, v in sm.full_state_dict().items())
    assert all(float(s["step"]) == 2.0 for s in opt.state.values())
    (tmp_path / "notdcp").mkdir()
    with pytest.raises(mfsdp.UsageError, match="is not a DCP checkpoint"):
        tdcp.save_dcp(sm, str(tmp_path / "notdcp"), opt, overwrite=True)
    sm.close()
