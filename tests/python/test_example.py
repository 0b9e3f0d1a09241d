"""
test_example: the training script of docs/pytorch.md (example_train.py) runs
as is on 4 MPI ranks, its loss goes down and the model it saves (rank 0's
full_state_dict) loads into the unsharded model and gives a lower loss.
"""
import os

import pytest
import torch

import conftest
import mfsdp


@pytest.mark.skipif(not mfsdp.backend_available("mpi"), reason="no MPI backend")
def test_documented_example_trains(tmp_path, monkeypatch):
    """docs/pytorch.md's script runs as is and its loss goes down."""
    import gpt
    save = str(tmp_path / "model.pt")
    monkeypatch.setenv("MFSDP_EXAMPLE_SAVE", save)
    p = conftest.run_ranks("example_train.py", [], timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    first, last = [float(l.split()[-1]) for l in p.stdout.splitlines() if l.startswith("step ")]
    assert last < 0.9 * first, (first, last)
    model = gpt.make_model()
    X, Y = gpt.make_data(10, 4, 3, 2)
    with torch.no_grad():
        before = model(X[0, 0, 0], Y[0, 0, 0]).item()
        r = model.load_state_dict(torch.load(save), strict=False)
        after = model(X[0, 0, 0], Y[0, 0, 0]).item()
    assert r.missing_keys == ["lm_head.weight"] and not r.unexpected_keys  # the tied alias
    assert os.path.getsize(save) > 0 and after < 0.9 * before, (before, after)
