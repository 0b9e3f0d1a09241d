"""
test_contract: the training loop held to its schedule, in one process (a
world of one rank, local backend; docs/pytorch.md, "The loop's contract").
Each row of issue 24's table is a UsageError naming the fix: an optimizer
over model.parameters(), a microbatch beyond M, an extra backward, an
optimizer step or an evaluation forward inside a step, helpers inside a
step, any use after close(); after each, close() works and the model can be
sharded again. The guard on weights outside their windows (a weight read by
another unit's module without a declared tie is refused; declared, it
trains as torch does). Main parameters' full names and shapes, and
param_groups' nanoGPT grouping. Evaluation forwards and short steps against
plain torch.
"""
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpt
import mfsdp
import mfsdp.torch as mt
import phases


def schedule(model, M=1, layout="zero3"):
    spec = mt.spec_from_module(model, mesh={"dp": 1}, layout=layout, microbatches=M)
    return mfsdp.Schedule.compile(spec)


def sharded(M=1, layout="zero3", **kw):
    model = gpt.make_model()
    return model, mt.shard(model, schedule(model, M, layout), backend="local", **kw)


def batch(M=1, steps=1):
    return gpt.make_data(steps, 1, M, 2)


def microbatch(model, X, Y, s, m, scale):
    loss = model(X[s, 0, m], Y[s, 0, m])
    (loss * scale).backward()
    return loss




def usage_error(fn, *needles):
    with pytest.raises(mfsdp.UsageError) as e:
        fn()
    for n in needles:
        assert n in str(e.value), (n, str(e.value))
    return e.value


def test_optimizer_over_the_models_own_parameters_is_refused():
    model, sm = sharded()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)     # the FSDP2 habit
    X, Y = batch()
    microbatch(model, X, Y, 0, 0, 1.0)
    usage_error(opt.step, "AdamW.step() over parameter", "sm.main_parameters()")
    torch.optim.AdamW(sm.main_parameters(), lr=1e-3).step()  # the fix works
    sm.close()


def test_torch_state_dicts_of_a_sharded_model_name_the_mfsdp_calls():
    """The FSDP2 habits model.state_dict(), get_model_state_dict(model) and
    model.load_state_dict(sd) on a sharded model: refused at the call, naming
    sm.full_state_dict / save_dcp and load_full_state_dict / load_dcp; the
    named fix gives the single-process model's values."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    model, sm = sharded()
    X, Y = batch()
    microbatch(model, X, Y, 0, 0, 1.0)
    torch.optim.SGD(sm.main_parameters(), lr=0.1).step()
    for call in (model.state_dict, model.blocks[1].state_dict, lambda: get_model_state_dict(model),
                 lambda: torch.save(model.state_dict(), io.BytesIO())):
        usage_error(call, "state_dict() of a sharded model", "sm.full_state_dict()",
                    "sm.save_dcp(path, optimizer)")
    fresh = gpt.make_model(seed=5).state_dict()
    usage_error(lambda: model.load_state_dict(fresh), "load_state_dict() into a sharded model",
                "sm.load_full_state_dict(state_dict)", "sm.load_dcp(path, optimizer)")
    sm.load_full_state_dict(fresh)                          # the named fix
    full = sm.full_state_dict()
    assert all(torch.equal(full[k], fresh[k]) for k in full)
    sm.close()
    usage_error(model.state_dict, "closed")                 # the stand-ins refuse on their own


def test_optimizer_step_inside_a_step_is_refused():
    model, sm = sharded(M=2)
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.1)
    X, Y = batch(2)
    microbatch(model, X, Y, 0, 0, 0.5)                     # 1 microbatch of M = 2
    before = [mp.detach().clone() for mp in sm.main_parameters()]
    usage_error(opt.step, "inside a step: 1 of the schedule's 2 microbatches",
                "sm.finish_step()")
    assert all(torch.equal(a, b) for a, b in zip(before, sm.main_parameters()))
    sm.close()


@pytest.mark.parametrize("M", [1, 2])
def test_a_microbatch_beyond_M_is_refused(M):
    """M + 1 forwards without an optimizer step: the extra one would start the
    next step and lose the delivered gradient."""
    model, sm = sharded(M=M)
    X, Y = batch(M)
    for m in range(M):
        microbatch(model, X, Y, 0, m, 1.0 / M)
    assert sm.steps == 1
    usage_error(lambda: model(X[0, 0, 0], Y[0, 0, 0]), "would begin step 2",
                "the schedule's %d microbatch" % M, "optimizer.step()", "sm.finish_step()")
    # zero_grad() drops the gradient on purpose: the next step may begin
    torch.optim.SGD(sm.main_parameters(), lr=0.1).zero_grad()
    microbatch(model, X, Y, 0, 0, 1.0 / M)
    sm.close()


def test_an_extra_backward_is_refused():
    model, sm = sharded(M=2)
    X, Y = batch(2)
    loss = model(X[0, 0, 0], Y[0, 0, 0])
    (loss / 2).backward(retain_graph=True)
    usage_error(lambda: (loss / 2).backward(), "second loss.backward()",
                "one forward, then one backward")
    sm.close()


def test_an_evaluation_forward_inside_a_step_is_refused():
    model, sm = sharded(M=2)
    X, Y = batch(2)
    microbatch(model, X, Y, 0, 0, 0.5)
    with torch.no_grad():
        usage_error(lambda: model(X[0, 0, 1], Y[0, 0, 1]), "inside a step",
                    "finish the step first", "sm.finish_step()")
    sm.close()


def test_helpers_inside_a_step_are_refused():
    model, sm = sharded(M=2)
    X, Y = batch(2)
    microbatch(model, X, Y, 0, 0, 0.5)
    for name, call in [("mean_over_ranks", lambda: sm.mean_over_ranks(1.0)),
                       ("allreduce", lambda: sm.allreduce([1.0])),
                       ("grad_norm", sm.grad_norm),
                       ("clip_grad_norm_", lambda: sm.clip_grad_norm_(1.0)),
                       ("full_state_dict", sm.full_state_dict)]:
        usage_error(call, "%s inside a step (1 of the schedule's 2 microbatches" % name)
    sm.close()


def test_finish_step_misuse_is_refused():
    model, sm = sharded(M=3)
    X, Y = batch(3)
    usage_error(sm.finish_step, "no microbatch run in this step")
    loss = model(X[0, 0, 0], Y[0, 0, 0])
    usage_error(sm.finish_step, "during microbatch 0")
    loss.backward()
    sm.finish_step()
    assert sm.steps == 1
    usage_error(sm.finish_step, "no microbatch run in this step")
    sm.close()


def test_any_use_after_close_names_the_fix():
    model, sm = sharded()
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.1)
    X, Y = batch()
    sm.close()
    sm.close()                                   # idempotent
    usage_error(lambda: model(X[0, 0, 0], Y[0, 0, 0]), "parameter 'wte.weight'",
                "ShardedModel was closed", "mt.shard")
    usage_error(lambda: model.wte.weight.sum(), "was closed")
    usage_error(sm.full_state_dict, "after sm.close()")
    usage_error(sm.finish_step, "after sm.close()")
    usage_error(opt.step, "closed ShardedModel")
    assert model.wte.weight.shape == (64, 32)    # metadata still answers
    with pytest.raises(mt.ModelMismatchError, match="is already sharded"):
        mt.shard(model, schedule(model), backend="local")


def test_close_mid_step_then_shard_again():
    """close() inside a step (between the microbatches, and after a refused
    call), then a fresh model sharded in the same process trains like torch."""
    for stop in ("between microbatches", "after an error"):
        model, sm = sharded(M=2)
        X, Y = batch(2)
        microbatch(model, X, Y, 0, 0, 0.5)
        if stop == "after an error":
            with pytest.raises(mfsdp.UsageError):
                torch.optim.SGD(sm.main_parameters(), lr=0.1).step()
        sm.close()
    model, sm = sharded(M=2)
    ref = gpt.make_model()
    opt = torch.optim.SGD(sm.main_parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for m in range(2):
        microbatch(model, X, Y, 0, m, 0.5)
        microbatch(ref, X, Y, 0, m, 0.5)
    opt.step()
    ropt.step()
    got = sm.full_state_dict()
    sm.close()
    for n, p in ref.named_parameters():
        assert torch.allclose(got[n], p.detach(), rtol=0, atol=1e-6), n


class TiedByUse(nn.Module):
    """An LM head that reads the embedding's weight through F.linear: one
    parameter, one name, used by two units."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok = nn.Embedding(16, 8)
        self.body = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, idx, targets):
        h = self.norm(self.body(self.tok(idx)))
        logits = F.linear(h, self.tok.weight)
        return F.cross_entropy(logits.reshape(-1, 16), targets.reshape(-1))


def tied_by_use_spec(declare):
    """Written out: the spec that spec_from_module would give without the
    tie (declare=False), or with tok.weight in the `tied` layout."""
    tie = " layout tied" if declare else ""
    return """mesh dp = 1;
microbatches 1;
reduce avg;
layout zero3 { weight fp32 [Flat]; grad fp32 [Flat]; main_weight fp32 [Flat]; }
layout tied { weight fp32 [Replicate]; grad fp32 [Flat]; main_weight fp32 [Flat]; }
unit "tok" layout zero3 { tensor "weight" [16, 8]%s; }
unit "body" layout zero3 { tensor "weight" [8, 8]; tensor "bias" [8]; }
unit "norm" layout zero3 { reshard_after_forward false; tensor "weight" [8]; tensor "bias" [8]; }
""" % tie


def tied_data():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 16, (4, 2, 6), generator=g), torch.randint(0, 16, (4, 2, 6),
                                                                      generator=g)


def test_a_weight_read_outside_its_window_is_refused():
    model = TiedByUse()
    sm = mt.shard(model, mfsdp.Schedule.compile(tied_by_use_spec(False)), backend="local")
    X, Y = tied_data()
    usage_error(lambda: model(X[0], Y[0]), "linear of parameter 'tok.weight' outside the "
                "windows of its unit 'tok' (after its forward in microbatch 0", "is a tie")
    sm.close()


def test_a_declared_tie_trains_as_torch():
    model, ref = TiedByUse(), TiedByUse()
    sm = mt.shard(model, mfsdp.Schedule.compile(tied_by_use_spec(True)), backend="local")
    opt = torch.optim.AdamW(sm.main_parameters(), lr=1e-2)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    X, Y = tied_data()
    for s in range(4):
        loss, rloss = model(X[s], Y[s]), ref(X[s], Y[s])
        loss.backward()
        rloss.backward()
        assert abs(loss.item() - rloss.item()) <= 1e-6 * abs(rloss.item()), s
        opt.step(); opt.zero_grad(); ropt.step(); ropt.zero_grad()
    sm.close()


def test_main_parameters_carry_full_names_and_shapes():
    model, sm = sharded(layout="zero3")
    shapes = {n: p.shape for n, p in model.named_parameters()}
    mains = sm.main_parameters()
    assert {mp.full_name: mp.full_shape for mp in mains} == shapes
    assert all(len(mp.shape) == 1 for mp in mains)     # the shards themselves are flat
    # ... but answer dim()/ndim as their whole tensor: nanoGPT's p.dim() >= 2 grouping
    assert all(mp.dim() == mp.ndim == mp.ndimension() == len(mp.full_shape) for mp in mains)
    groups = sm.param_groups(weight_decay=0.1, lr=3e-4)
    decay = {mp.full_name for mp in groups[0]["params"]}
    assert decay == {n for n, s in shapes.items() if len(s) >= 2}       # nanoGPT's rule
    assert "blocks.0.fc.weight" in decay and "ln_f.weight" not in decay
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert groups[0]["lr"] == groups[1]["lr"] == 3e-4
    own = sm.param_groups(0.1, no_decay=lambda name, shape: "ln" in name or len(shape) < 2)
    assert {mp.full_name for mp in own[1]["params"]} == {
        n for n, s in shapes.items() if "ln" in n or len(s) < 2}
    torch.optim.AdamW(groups).step()              # torch accepts the groups
    sm.close()


PLAN, EVALS = phases.PLAN, phases.EVALS


def test_evaluation_and_short_steps_equal_torch():
    losses, evals, sm = phases.train("zero3", 3, PLAN, EVALS)
    full = sm.full_state_dict()
    sm.close()
    ref_losses, ref_evals, ref = phases.reference(3, PLAN, EVALS)
    assert len(evals) == len(ref_evals) == len(EVALS)
    for a, b in zip(losses + evals, ref_losses + ref_evals):
        assert abs(a - b) <= 1e-6 * abs(b), (a, b)
    for n, p in ref.items():
        err = ((full[n] - p.detach()).abs().max() / p.detach().abs().max()).item()
        assert err <= 1e-5, (n, err)


def test_a_tie_in_a_schedule_file_is_read_for_the_whole_step(tmp_path):
    """A schedule loaded from its file (no text kept): the tied layout's
    weight is still valid for the whole step (the LM head reads it after
    the embedding's window), and the model trains as torch does."""
    model, ref = gpt.make_model(), gpt.make_model()
    path = tmp_path / "gpt.yaml"
    path.write_bytes(schedule(model).text)
    sm = mt.shard(model, mfsdp.Schedule.load(str(path)), backend="local")
    X, Y = batch()
    loss, rloss = model(X[0, 0, 0], Y[0, 0, 0]), ref(X[0, 0, 0], Y[0, 0, 0])
    loss.backward()
    rloss.backward()
    assert abs(loss.item() - rloss.item()) <= 1e-6 * rloss.item()
    sm.close()
