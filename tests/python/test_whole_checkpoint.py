"""
test_whole_checkpoint: checkpoints of a run with Whole main weights (the GPT
model, 2 x 2 HFSDP with matrix_optimizer="whole", AdamW over every main
parameter: full-shape on the owners of a matrix, 1-D shards elsewhere). In one
mpirun -np 4 (whole_worker.py ckpt): save_checkpoint on the Whole run loads
into a Flat HFSDP run of another seed, and the Flat run's checkpoint into a
Whole one, every master weight and both moments bit for bit and the step;
the Flat run resumed from the Whole checkpoint takes the step single-process
torch takes; save_dcp of the Whole run loads into FSDP2 (1-D mesh over gloo)
bit for bit; export_hf of the Whole run is its master weights exactly and the
single-process weights within 1e-5. Two optimizers (Muon on the owned
matrices + AdamW on the rest, whole_worker.several): 2 steps, save_checkpoint
and save_dcp of both, fresh runs of other seeds load each and take 2 more
steps, equal bit for bit to 4 uninterrupted steps; the wrong lists (count,
class, swapped order, a matrix moved to AdamW, a parameter in both) are
refused on every rank with the difference named, nothing modified.
"""
import glob
import os

import pytest
import safetensors.torch
import torch

import conftest
import gpt
import mfsdp
import whole_worker as ww

TOL = 1e-5
KEYS = ("main", "exp_avg", "exp_avg_sq")

pytestmark = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                                reason="libmfsdp built without the MPI backend")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("whole_ckpt"))
    p = conftest.run_ranks("whole_worker.py", [out, "ckpt", str(conftest.free_port())],
                           timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return out, torch.load(os.path.join(out, "ckpt.pt"))


def bitwise_diffs(a, b):
    return int((a.reshape(-1).view(torch.int32) != b.reshape(-1).view(torch.int32)).sum())


def assert_bitwise(got, want, what):
    assert set(got) == set(want), (what, sorted(got), sorted(want))
    bad = {(n, k): bitwise_diffs(got[n][k], want[n][k]) for n in want for k in KEYS}
    bad = {nk: c for nk, c in bad.items() if c}
    assert not bad, (what, bad)


def reference(steps):
    """Single-process AdamW on the global batch: (losses, {name: parameter})."""
    model = gpt.make_model()
    opt = ww.adamw(list(model.parameters()))
    X, Y = ww.data(3)
    losses = []
    for s in range(steps):
        loss = model(X[s].reshape(-1, X.shape[-1]), Y[s].reshape(-1, Y.shape[-1]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def test_the_saving_run_was_whole(run):
    """The matrices' main parameters on rank 0 are full-shape (Whole), the
    vectors 1-D shards (Flat)."""
    _, res = run
    shapes = res["whole_shapes"]
    assert any(len(s) == 2 for s in shapes.values()), shapes
    assert all(len(s) in (1, 2) for s in shapes.values())


def test_whole_to_flat_and_back_bit_exact(run):
    _, res = run
    assert_bitwise(res["flat_loaded"], res["whole_saved"], "Whole -> Flat")
    assert_bitwise(res["whole_loaded"], res["flat_saved"], "Flat -> Whole")
    assert res["whole_steps"] == res["flat_loaded_steps"] == {2.0}
    assert res["whole_loaded_steps"] == {3.0}
    assert bitwise_diffs(res["flat_saved"]["wte.weight"]["main"],
                         res["whole_saved"]["wte.weight"]["main"]) > 0   # the Flat step moved it


def test_resumed_flat_run_matches_torch(run):
    _, res = run
    ref_losses, _ = reference(3)
    got = res["whole_losses"] + [res["flat_loss"]]
    err = max(abs(a - b) / abs(b) for a, b in zip(got, ref_losses))
    print("losses %s, reference %s: rel err %.2e" % (got, ref_losses, err))
    assert err <= TOL, (got, ref_losses)


def test_dcp_of_whole_run_loads_into_fsdp2(run):
    out, res = run
    fsdp2 = torch.load(os.path.join(out, "dcp_fsdp2.pt"))
    assert_bitwise({n: d for n, d in fsdp2.items()}, res["whole_saved"], "DCP -> FSDP2")
    assert {d["step"] for d in fsdp2.values()} == {2.0}


def test_hf_export_of_whole_run(run):
    out, res = run
    files = sorted(glob.glob(os.path.join(out, "whole_hf", "*.safetensors")))
    assert files, os.listdir(os.path.join(out, "whole_hf"))
    hf = {}
    for f in files:
        hf.update(safetensors.torch.load_file(f))
    saved = {n: d["main"] for n, d in res["whole_saved"].items()}
    assert set(saved) <= set(hf), (sorted(hf), sorted(saved))
    bad = {n: bitwise_diffs(hf[n], t) for n, t in saved.items() if bitwise_diffs(hf[n], t)}
    assert not bad, bad
    _, ref = reference(2)
    worst = max(((hf[n] - p).abs().max() / p.abs().max()).item() for n, p in ref.items())
    print("HF export vs single-process torch: %.2e" % worst)
    assert worst <= TOL, worst


@pytest.fixture(scope="module")
def several(run):
    out, _ = run
    return torch.load(os.path.join(out, "several.pt"))


@pytest.mark.parametrize("kind", ["ck", "dcp"])
def test_two_optimizers_resume_bit_exact(several, kind):
    for r, res in enumerate(several):
        assert res["muon_mats"], "rank %d owns no matrix" % r
        assert all(len(s) == 2 for s in res["muon_mats"].values()), res["muon_mats"]
        only_one_side, count = res[kind + "_diffs"]
        assert not only_one_side and count == 0, (r, kind, only_one_side, count)
        assert res[kind + "_losses"] == res["losses"][2:], (r, kind)


# the refusal of each wrong list: (kind, case) -> words the message must hold
REFUSED = {
    ("ck", "count"): ["holds the state of 2 optimizers (Muon, AdamW), 3 given"],
    ("ck", "one"): ["holds the state of 2 optimizers (Muon, AdamW)", "a list"],
    ("ck", "class"): ["optimizer 1 is a SGD, the checkpoint's optimizer 1 a AdamW"],
    ("ck", "swapped"): ["optimizer 0 is a AdamW, the checkpoint's optimizer 0 a Muon"],
    ("ck", "moved"): ["is in optimizer 1 (AdamW) here and in optimizer 0 (Muon) in the "
                      "checkpoint"],
    ("ck", "twice"): ["is in optimizer 0 (Muon) and in optimizer 1 (AdamW)"],
    ("dcp", "count"): ["2 param groups in the checkpoint, the optimizer has 1"],
    ("dcp", "class"): ["param group 1: the checkpoint's options", "optimizer 1's (SGD)"],
    ("dcp", "swapped"): ["param group 0: the checkpoint's options",
                         "optimizer 0's (AdamW)", "another order"],
    ("dcp", "moved"): ["is in param group 1 of the optimizers (optimizer 1's (AdamW))"],
    ("dcp", "twice"): ["is in optimizer 0 (Muon) and in optimizer 1 (AdamW)"],
}


@pytest.mark.parametrize("kind", ["ck", "dcp"])
def test_two_optimizers_refusals(several, kind):
    for r, res in enumerate(several):
        got = res[kind + "_refused"]
        want = {c: w for (k, c), w in REFUSED.items() if k == kind}
        assert set(got) == set(want), (r, kind, sorted(got))
        for case, words in want.items():
            assert got[case] is not None, (r, kind, case, "not refused")
            for w in words:
                assert w in got[case], (r, kind, case, w, got[case])
        only_one_side, count = res[kind + "_untouched"]
        assert not only_one_side and count == 0, (r, kind, "modified by a refused load", count)
