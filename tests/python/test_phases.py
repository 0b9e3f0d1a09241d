"""
test_phases: evaluation forwards between steps and short steps on 4 MPI
ranks (2 x 2 mesh) equal single-process torch for HSDP, HFSDP and ZeRO-3
(phases.py: M = 3, steps of 3, 2, 3 and 1 microbatches, evaluation under
no_grad and inference_mode before the first step and after steps 0, 1 and 3);
a runtime closed in the middle of a step, one closed after a refused call,
and one closed after a hook the C runtime itself refused mid-step (the first
rank to close aborts its peers' step) are each followed by a fresh shard in
the same processes that trains one step as torch does.
"""
import os

import pytest
import torch

import conftest
import gpt
import mfsdp
import phases
import train

LAYOUTS = ["hsdp", "hfsdp", "zero3"]

pytestmark = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                                reason="libmfsdp built without the MPI backend")


def run_worker(tmp_path_factory, args):
    out = str(tmp_path_factory.mktemp("phases"))
    p = conftest.run_ranks("phases_worker.py", [out] + args, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_worker(tmp_path_factory, LAYOUTS)


def worst_param_err(full, ref):
    return max(((full[n] - p.detach()).abs().max() / p.detach().abs().max()).item()
               for n, p in ref.items())


@pytest.fixture(scope="module")
def reference():
    return phases.reference(3, phases.PLAN, phases.EVALS, world=train.WORLD)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eval_and_short_steps_match_single_process(runs, reference, layout):
    got = torch.load(os.path.join(runs, layout + ".pt"))
    ref_losses, ref_evals, ref = reference
    assert len(got["losses"]) == len(ref_losses) and len(got["evals"]) == len(ref_evals)
    print("%s: eval loss rel err %.1e, train loss %.1e, params %.1e" % (
        layout, max(abs(a - b) / abs(b) for a, b in zip(got["evals"], ref_evals)),
        max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref_losses)),
        worst_param_err(got["full"], ref)))
    for a, b in zip(got["evals"], ref_evals):
        assert abs(a - b) <= 1e-6 * abs(b), ("eval", a, b)
    for a, b in zip(got["losses"], ref_losses):
        assert abs(a - b) <= 1e-5 * abs(b), ("train", a, b)
    assert worst_param_err(got["full"], ref) <= 1e-5


def test_the_short_steps_matter(reference):
    """Not vacuous: the run with every step full ends far from the one with short steps."""
    _, _, full_steps = phases.reference(3, [3, 3, 3, 3], (), world=train.WORLD)
    assert worst_param_err({n: p.detach() for n, p in full_steps.items()}, reference[2]) > 1e-3


def lifecycle_matches_torch(out, name):
    got = torch.load(os.path.join(out, name + ".pt"))
    ref = gpt.make_model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    X, Y = gpt.make_data(1, train.WORLD, 2, 2)
    ref(X[0].reshape(-1, 16), Y[0].reshape(-1, 16)).backward()
    opt.step()
    assert worst_param_err(got["full"], dict(ref.named_parameters())) <= 1e-5


def test_shard_again_after_closing_mid_step(tmp_path_factory):
    lifecycle_matches_torch(run_worker(tmp_path_factory, ["lifecycle"]), "lifecycle")


def test_shard_again_after_a_runtime_error_mid_step(tmp_path_factory):
    out = run_worker(tmp_path_factory, ["lifecycle_runtime_error"])
    lifecycle_matches_torch(out, "lifecycle_runtime_error")

