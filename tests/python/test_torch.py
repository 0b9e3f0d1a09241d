"""
test_torch: mfsdp.torch in one process (a world of one rank, local backend):
spec_from_module for every layout, the model/schedule check, refused misuse
(a unit run twice, a no_grad forward inside a step), one-rank training equal to plain
torch with tied weights and activation checkpointing, and on one rank in
check mode: clip_grad_norm_ against torch's, full_state_dict and
load_full_state_dict with their refused misuse.
"""
import re

import pytest
import torch

import gpt
import mfsdp
import mfsdp.torch as mt
import train

MESH = {"dp_outer": 2, "dp_inner": 2}


@pytest.mark.parametrize("layout", mt.LAYOUT_NAMES)
def test_spec_compiles_for_every_layout(layout):
    model = gpt.make_model()
    spec = mt.spec_from_module(model, mesh=MESH, layout=layout, microbatches=3)
    assert 'unit "blocks.{i}" for i in 0..4 layout %s {' % layout in spec
    assert "layout %s {" % layout in spec
    s = mfsdp.Schedule.compile(spec, name=layout)
    assert s.units == ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f"]
    names = {t.name for t in s.tensors}
    assert names == {n for n, _ in model.named_parameters()}
    tied = s.tensor("wte.weight")
    # the tied embedding / LM head weight is whole on every rank in every layout
    assert ("layout tied" in spec) == (layout in ("zero3", "hsdp", "hsdp_nosync", "hfsdp",
                                                  "fsdp2d"))
    assert tied.shape == (64, 32)


def test_spec_overrides_and_dtypes():
    spec = mt.spec_from_module(gpt.make_model(), mesh=MESH, layout="hfsdp", dtype="bf16",
                               overrides={"*.ln_*": "replicated"}, prefetch=2)
    assert "weight      bf16 [Replicate, Flat];" in spec and "\nprefetch 2;\n" in spec
    assert re.search(r'tensor "ln_1.weight" \[32\] layout replicated;', spec)
    mfsdp.Schedule.compile(spec)
    with pytest.raises(ValueError, match="needs a mesh of at least 2 axes"):
        mt.spec_from_module(gpt.make_model(), mesh={"dp": 4}, layout="hsdp")
    with pytest.raises(ValueError, match="unknown layout"):
        mt.spec_from_module(gpt.make_model(), mesh=MESH, layout="zero4")
    with pytest.raises(ValueError, match="has no forward to hook"):
        mt.spec_from_module(gpt.make_model(), mesh=MESH, units=["wte", "wpe", "blocks", "ln_f"])
    units = ["wte", "wpe"] + ["blocks.%d" % i for i in range(4)]
    with pytest.raises(ValueError, match="parameters not covered by any unit: ln_f.weight"):
        mt.spec_from_module(gpt.make_model(), mesh=MESH, units=units)
    custom = {"name": "mine", "weight": ("fp32", ["R", "F"]), "grad": ("fp32", ["P", "F"]),
              "main_weight": ("fp32", ["F", "F"])}
    assert "layout mine {" in mt.spec_from_module(gpt.make_model(), mesh=MESH, layout=custom)


def one_rank_schedule(model, M=1, layout="zero3", text_filter=None):
    spec = mt.spec_from_module(model, mesh={"dp": 1}, layout=layout, microbatches=M)
    if text_filter:
        spec = text_filter(spec)
    return mfsdp.Schedule.compile(spec)


def test_mismatch_lists_every_problem():
    model = gpt.make_model()

    def damage(spec):
        spec = spec.replace('tensor "weight" [16, 32];', 'tensor "weight" [17, 32];')  # wpe
        spec = spec.replace('tensor "proj.bias" [32];', 'tensor "proj.bais" [32];')
        return spec.replace('  tensor "bias" [32];\n}', "}")                           # ln_f.bias
    sched = one_rank_schedule(model, text_filter=damage)
    with pytest.raises(mt.ModelMismatchError) as e:
        mt.shard(model, sched, backend="local")
    msg = str(e.value)
    assert "tensor 'wpe.weight': the schedule says shape [17, 32], the model has [16, 32]" in msg
    assert "module 'blocks.0' has no parameter 'proj.bais'" in msg
    assert "parameter 'ln_f.bias' [32] is in no unit" in msg
    assert "parameter 'blocks.3.proj.bias' [32] is in no unit" in msg
    # 1 reshaped, 4 renamed (the loop), their 4 parameters uncovered, ln_f.bias missing
    assert len(e.value.problems) == 1 + 4 + 4 + 1
    assert e.value.code_name == "MFSDP_ERR_INVALID_USAGE"


class Twice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.b(self.a(self.a(x))).sum()


def test_unit_run_twice_is_refused():
    model = Twice()
    sm = mt.shard(model, one_rank_schedule(model), backend="local")
    with pytest.raises(mfsdp.UsageError, match="unit 'a' ran twice in the forward of microbatch 0"):
        model(torch.ones(2, 4))
    sm.close()


def test_no_grad_forward_inside_a_step_is_refused():
    model = gpt.make_model()
    sm = mt.shard(model, one_rank_schedule(model, 2), backend="local")
    X, Y = gpt.make_data(1, 1, 2, 2)
    (model(X[0, 0, 0], Y[0, 0, 0]) / 2).backward()
    with torch.no_grad(), pytest.raises(mfsdp.UsageError, match="under torch.no_grad"):
        model(X[0, 0, 1], Y[0, 0, 1])
    sm.close()


def test_reentrant_checkpoint_is_refused():
    model = gpt.make_model()
    sm = mt.shard(model, one_rank_schedule(model), backend="local")
    X, Y = gpt.make_data(1, 1, 1, 2)
    blk = model.blocks[1]
    model.blocks[1] = torch.nn.Identity()        # run block 1 through a reentrant checkpoint
    orig = model.blocks[0].forward
    model.blocks[0].forward = lambda x: torch.utils.checkpoint.checkpoint(
        blk, orig(x), use_reentrant=True)
    with pytest.raises(mfsdp.UsageError, match="use_reentrant=False"):
        model(X[0, 0, 0], Y[0, 0, 0])
    sm.close()


@pytest.mark.parametrize("layout,M,ckpt", [("zero3", 2, ()), ("ddp", 1, (1, 2)),
                                           ("zero2", 3, (0, 3))])
def test_one_rank_training_equals_torch(layout, M, ckpt):
    steps = 3
    c = {"layout": layout, "M": M, "opt": "adamw", "dtype": "fp32", "ckpt": ckpt,
         "steps": steps, "b": 2}
    model = gpt.make_model(checkpoint=ckpt)
    sm = mt.shard(model, one_rank_schedule(model, M, layout), backend="local")
    opt = train.make_optimizer(sm.main_parameters(), "adamw")
    X, Y = gpt.make_data(steps, 1, M, 2)
    ref = gpt.make_model(checkpoint=ckpt)
    ropt = train.make_optimizer(ref.parameters(), "adamw")
    for s in range(steps):
        for m in range(M):
            (model(X[s, 0, m], Y[s, 0, m]) / M).backward()
            (ref(X[s, 0, m], Y[s, 0, m]) / M).backward()
        opt.step(); opt.zero_grad(); ropt.step(); ropt.zero_grad()
    assert sm.steps == steps
    got = {n: mp.detach().clone() for n, _, mp in sm.shards()}
    sm.close()
    for n, p in ref.named_parameters():
        err = ((got[n] - p.detach().reshape(-1)).abs().max() / p.detach().abs().max()).item()
        assert err <= 1e-5, (n, err)
    with pytest.raises(mfsdp.UsageError, match="was closed"):   # no view of freed memory
        model(X[0, 0, 0], Y[0, 0, 0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_nccl_backend_without_a_gpu_says_so():
    model = gpt.make_model()
    with pytest.raises(mfsdp.MfsdpError) as e:
        mt.shard(model, one_rank_schedule(model), backend="nccl")
    assert e.value.code_name == "MFSDP_ERR_UNSUPPORTED" and "needs a CUDA device" in str(e.value)


def test_cuda_array_interface_of_views():
    from mfsdp.torch.tensors import _CudaArray
    a = _CudaArray(0x1000, 6, "bf16").__cuda_array_interface__
    assert a == {"shape": (6,), "typestr": "<i2", "data": (0x1000, False), "version": 2,
                 "strides": None}
    assert _CudaArray(0x2000, 3, "fp32").__cuda_array_interface__["typestr"] == "<f4"
    assert _CudaArray(0x2000, 3, "fp16").__cuda_array_interface__["typestr"] == "<f2"


def _untied():
    """The GPT with its LM head untied: the check mode refuses a tied weight read
    outside its unit's windows (the `tied` layout's contract, docs/pytorch.md)."""
    m = gpt.make_model()
    m.lm_head.weight = torch.nn.Parameter(m.wte.weight.detach().clone())
    return m


def test_one_rank_clip_and_state_dict_in_check_mode():
    """One rank, check mode (MFSDP_FLAG_CHECK): clipping equals
    torch.nn.utils.clip_grad_norm_ step by step; full_state_dict equals the
    reference's parameters; a state dict loads back bitwise."""
    steps, M, clip = 2, 2, 3.0
    model = _untied()
    sm = mt.shard(model, one_rank_schedule(model, M, "zero3"), backend="local", check=True)
    opt = train.make_optimizer(sm.main_parameters(), "sgd")
    X, Y = gpt.make_data(steps, 1, M, 2)
    ref = _untied()
    ropt = train.make_optimizer(ref.parameters(), "sgd")
    for s in range(steps):
        for m in range(M):
            (model(X[s, 0, m], Y[s, 0, m]) / M).backward()
            (ref(X[s, 0, m], Y[s, 0, m]) / M).backward()
        norm = sm.clip_grad_norm_(clip)
        rnorm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        assert abs(norm.item() - rnorm.item()) <= 1e-5 * rnorm.item()
        assert rnorm.item() > clip                           # the clipping acts
        assert abs(sm.grad_norm() - clip) <= 1e-5 * clip     # what is left is clipped
        opt.step(); opt.zero_grad(); ropt.step(); ropt.zero_grad()
    assert sm.mean_over_ranks(torch.tensor(2.5), count=3) == 2.5
    full = sm.full_state_dict()
    assert set(full) == set(dict(ref.named_parameters()))
    for n, p in ref.named_parameters():
        err = ((full[n] - p.detach()).abs().max() / p.detach().abs().max()).item()
        assert full[n].shape == p.shape and err <= 1e-5, (n, err)
    sd = ref.state_dict()
    sm.load_full_state_dict(sd)
    back = sm.full_state_dict(dtype=torch.float32)
    assert all(torch.equal(back[n], p.detach()) for n, p in ref.named_parameters())
    sm.close()


def test_state_dict_and_clip_misuse_is_refused():
    model = gpt.make_model()
    sm = mt.shard(model, one_rank_schedule(model, 2, "ddp"), backend="local")
    sd = dict(gpt.make_model().named_parameters())     # the sharded model's are stand-ins
    bad = dict(sd, extra=torch.zeros(1))
    del bad["wpe.weight"]
    bad["ln_f.weight"] = torch.zeros(3)
    with pytest.raises(mfsdp.UsageError) as e:
        sm.load_full_state_dict(bad)
    msg = str(e.value)
    assert "missing parameter 'wpe.weight'" in msg and "unexpected key 'extra'" in msg
    assert "'ln_f.weight': shape [3]" in msg
    with pytest.raises(mfsdp.UsageError, match="only the L2 norm"):
        sm.clip_grad_norm_(1.0, norm_type=1.0)
    X, Y = gpt.make_data(1, 1, 2, 2)
    (model(X[0, 0, 0], Y[0, 0, 0]) / 2).backward()      # microbatch 0 of 2 done
    for call in (lambda: sm.clip_grad_norm_(1.0), sm.full_state_dict,
                 lambda: sm.load_full_state_dict(sd)):
        with pytest.raises(mfsdp.UsageError, match="inside a step"):
            call()
    sm.close()
