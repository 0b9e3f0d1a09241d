"""
test_distinct: tensors Distinct on a mesh axis through mfsdp.torch (issue #42,
items 4-6): spec_from_module / fully_shard's distinct={pattern: axis},
sm.device_mesh(), expert_axes, and clipping across mixed meshes.

On 4 MPI ranks, one launch of distinct_worker.py (3 steps of 2 microbatches,
SGD with momentum: a wrongly scaled gradient shows in the parameters, which
Adam's normalisation would hide), each compared with a single-process torch
run of the whole model on the union of the ranks' microbatches, with
torch.nn.utils.clip_grad_norm_ at the same max_norm (clipping happens at every
step):
  - tp: a Megatron-style column/row-parallel MLP, TP = 2 x DP = 2, its own f/g
    all-reduces on sm.device_mesh()["tp"];
  - moe: a top-1 MoE with E = 4 experts, EP = 2 (2 per ep coordinate) x DP = 2,
    tokens dispatched by all_to_all_single on sm.device_mesh()["ep"], the
    dense tensors data parallel over both axes, expert_axes=("ep",).
Every loss, every step's gradient norm (the norm counts each distinct tensor
once per coordinate, each replica once) and every rank's master shards after
every step equal the reference within 1e-6 relative. Without expert_axes the
expert gradients are the ep group's sum (the run is far from the reference).
The device mesh has mfsdp's coordinates; full_state_dict and save_checkpoint
are refused naming the missing global names. In one process: the spec text
and the refusals of spec_from_module and fully_shard.
"""
import os

import pytest
import torch

import conftest
import distinct_worker as dw
import mfsdp
import mfsdp.torch as mt

TOL = 1e-6
WORLD = 4

needs_mpi = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                               reason="libmfsdp built without the MPI backend")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("distinct")
    cmd = conftest.mpirun() + [conftest.sys.executable,
                               os.path.join(conftest.HERE, "distinct_worker.py"), str(out),
                               str(conftest.free_port())]
    p = conftest.subprocess.run(cmd, env=conftest.env(), cwd=str(out), capture_output=True,
                                text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return {(k, r): torch.load(os.path.join(out, "%s.rank%d.pt" % (k, r)))
            for k in list(dw.RUNS) + ["bad_init"] for r in range(WORLD)}


def reference(kind, steps=dw.STEPS, expert_scale=1.0):
    """The whole model in one process on the union of the microbatches: per
    step the loss, clip_grad_norm_'s norm, and the parameters after it.
    expert_scale multiplies the experts' gradients (a wrongly scaled run)."""
    model = dw.whole_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=dw.LR, momentum=0.9, foreach=False)
    X, Y = dw.data(kind)
    losses, norms, params = [], [], []
    for s in range(steps):
        x = X[s].transpose(0, 1).reshape(dw.M, -1, dw.D)   # microbatch m: every rank's m-th
        y = Y[s].transpose(0, 1).reshape(dw.M, -1, dw.D)
        tot = 0.0
        for m in range(dw.M):
            loss = model(x[m], y[m]) / dw.M
            loss.backward()
            tot += loss.item()
        for n, p in model.named_parameters():
            if ".experts." in n:
                p.grad.mul_(expert_scale)
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), dw.CLIP).item())
        opt.step()
        opt.zero_grad()
        losses.append(tot)
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return losses, norms, params


def whole_of(kind, name, c, full):
    """(whole-model name, this coordinate's part of it) of a rank's tensor."""
    if kind == "tp":
        return name, dw.tp_slice(name, full[name], c)
    g = dw.moe_global_name(name, c)
    return g, full[g]


def errors(runs, kind, ref):
    losses, norms, params = ref
    got0 = runs[(kind, 0)]
    steps = len(got0["losses"])
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(got0["losses"], losses))
    norm_err = max(abs(a - b) / abs(b) for a, b in zip(got0["norms"], norms))
    worst, seen = 0.0, set()
    for r in range(WORLD):
        got = runs[(kind, r)]
        assert got["norms"] == got0["norms"] and got["losses"] == got0["losses"], r
        for s in range(steps):
            for n, (off, p) in got["params"][s].items():
                g, part = whole_of(kind, n, got["coords"][0], params[s])
                want = part.reshape(-1)[off:off + p.numel()]
                worst = max(worst, ((p.reshape(-1) - want).abs().max()
                                    / params[s][g].abs().max()).item())
                seen.add(g)
    return loss_err, norm_err, worst, seen


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_matches_the_whole_model(runs, kind):
    ref = reference(kind)
    assert min(ref[1]) > 2 * dw.CLIP, ref[1]        # clipping happens at every step
    loss_err, norm_err, worst, seen = errors(runs, kind, ref)
    print("%s: loss %.2e, norm %.2e, parameters %.2e" % (kind, loss_err, norm_err, worst))
    assert seen == set(ref[2][0]), sorted(set(ref[2][0]) - seen)   # every whole tensor checked
    assert loss_err <= TOL and norm_err <= TOL and worst <= TOL, (loss_err, norm_err, worst)


@needs_mpi
def test_experts_unscaled_are_the_ep_sum(runs):
    """With ep declared in tensor_axes (as if tensor parallel) the delivered
    expert gradient is the sum over the ep group's tokens (twice the mean):
    the run equals a reference whose expert gradients are doubled, and is far
    from the true one. So the axis's kind must be declared
    (test_every_distinct_axis_is_declared)."""
    doubled = errors(runs, "moe_unscaled", reference("moe", 1, expert_scale=2.0))
    true = errors(runs, "moe_unscaled", reference("moe", 1))
    assert max(doubled[:3]) <= TOL, doubled[:3]
    assert true[1] > 100 * TOL and true[2] > 100 * TOL, true[:3]


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_device_mesh_has_mfsdp_coordinates(runs, kind):
    mesh = dw.RUNS[kind][0]
    outer, inner = list(mesh)
    for r in range(WORLD):
        got = runs[(kind, r)]
        assert got["coords"] == [r // 2, r % 2], got["coords"]
        assert list(got["mesh_coords"]) == got["coords"]
        assert got["groups"][outer] == [r % 2, 2 + r % 2], got["groups"]
        assert got["groups"][inner] == [r - r % 2, r - r % 2 + 1], got["groups"]


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_distinct_tensors_and_refusals(runs, kind):
    got = runs[(kind, 0)]
    axis = list(dw.RUNS[kind][0])[0]
    model = dw.whole_model(kind) if kind == "tp" else dw.MoEModel(dw.EP)
    want = {n for n, _ in model.named_parameters()
            if (".experts." in n if kind == "moe" else (".w1." in n or ".w2." in n))}
    assert got["distinct"] == {n: (axis,) for n in want}, got["distinct"]
    for what in ("full_state_dict", "save_checkpoint"):
        assert got[what] and "%s of a model with Distinct tensors" % what in got[what] \
            and "global names" in got[what], got[what]
    assert not got["never_exists"]


@needs_mpi
def test_replicas_of_a_coordinate_must_agree(runs):
    """Ranks of one ep coordinate holding different experts are refused on
    every rank, naming the tensor (the coordinates' own differences are not)."""
    for r in range(WORLD):
        msg = runs[("bad_init", r)]["message"]
        assert msg and "the ranks that share a Distinct coordinate start from different " \
            "values of moe.experts.1.w2.bias at sharding" in msg, (r, msg)


def test_spec_distinct_layouts(tmp_path):
    """The Distinct variant of each layout, the other axes as the layout says."""
    model = dw.MoEModel(dw.EP)
    spec = mt.spec_from_module(model, {"ep": 2, "dp": 2}, layout="hfsdp",
                               distinct={"moe.experts.*": "ep"}, units=["embed", "moe", "head"])
    assert "layout hfsdp_d_ep {\n  weight      fp32 [Distinct, Flat];\n" \
           "  grad        fp32 [Distinct, Flat];\n  main_weight fp32 [Distinct, Flat];\n}" \
           in spec, spec
    assert spec.count("layout hfsdp_d_ep;") == 8           # 2 experts x (w1, w2) x (w, b)
    assert '"router.weight" [4, 16];' in spec
    spec = mt.spec_from_module(model, {"ep": 2, "dp": 2}, layout="hsdp",
                               distinct={"moe.experts.*.w1.weight": "ep"})
    assert "layout hsdp_d_ep {\n  weight      fp32 [Distinct, Flat];\n" \
           "  grad        fp32 [Distinct, Flat];\n  main_weight fp32 [Distinct, Flat];\n}" \
           in spec, spec
    assert '"w1.bias" [32];' in spec and '"w1.bias" [32] layout' not in spec
    from mfsdp.torch.shard import distinct_axes_of
    sched = mfsdp.Schedule.compile(spec, name="distinct_spec")
    assert distinct_axes_of(sched) == {"moe.experts.0.w1.weight": ("ep",),
                                       "moe.experts.1.w1.weight": ("ep",)}
    path = tmp_path / "s.yaml"
    path.write_bytes(sched.text)                     # a schedule loaded from its file
    assert distinct_axes_of(mfsdp.Schedule.load(str(path))) == distinct_axes_of(sched)
    dense = mfsdp.Schedule.compile(mt.spec_from_module(model, {"ep": 2, "dp": 2}))
    assert distinct_axes_of(dense) == {}


def test_refusals_name_the_fix():
    model = dw.MoEModel(dw.EP)
    with pytest.raises(ValueError, match=r"distinct axis 'ep' of 'moe.experts.0.w1.weight' lies "
                                         r"inside axis 'dp', which layout fsdp2d splits .*put "
                                         r"'ep' outermost in the mesh \(mesh=\{'ep': \.\.\., "
                                         r"'dp': \.\.\.\}\)"):
        mt.spec_from_module(model, {"dp": 2, "ep": 2}, layout="fsdp2d",
                            distinct={"moe.experts.*": "ep"})
    with pytest.raises(ValueError, match=r"'tp' is not an axis of the mesh \(its axes are ep, "
                                         r"dp\)"):
        mt.spec_from_module(model, {"ep": 2, "dp": 2}, distinct={"moe.experts.*": "tp"})
    with pytest.raises(ValueError, match=r"distinct=\{'experts.\*': 'ep'\}: the pattern matches "
                                         r"no parameter of the model"):
        mt.spec_from_module(model, {"ep": 2, "dp": 2}, distinct={"experts.*": "ep"})
    mixed = {"name": "m", "weight": ("fp32", ["D", "F"]), "grad": ("fp32", ["P", "F"]),
             "main_weight": ("fp32", ["D", "F"])}
    with pytest.raises(ValueError, match=r"layout m: Distinct on an axis in some roles only"):
        mt.spec_from_module(model, {"ep": 2, "dp": 2}, layout=mixed)
    with pytest.raises(mfsdp.UsageError, match=r"fully_shard: distinct=.*matches no parameter"):
        mt.fully_shard(model, mesh={"ep": 2, "dp": 2}, distinct={"nothing.*": "ep"})


def test_expert_axes_and_device_mesh_refusals():
    """On one rank (the local backend): expert_axes naming an axis that is
    Distinct for no tensor, device_mesh() without torch.distributed,
    full_state_dict of a model with a Distinct tensor."""
    import torch.distributed as dist
    model = dw.MoEModel(dw.EP)
    with pytest.raises(mfsdp.UsageError, match=r"expert_axes names 'dp', which is Distinct for "
                                               r"no tensor"):
        mt.fully_shard(model, mesh={"ep": 1, "dp": 1}, distinct={"moe.experts.*": "ep"},
                       expert_axes=("dp",), backend="local", cache=False)
    with pytest.raises(mfsdp.UsageError, match=r"expert_axes='ep': give a tuple of axis names, "
                                               r"e.g. \('ep',\)"):
        mt.fully_shard(dw.MoEModel(dw.EP), mesh={"ep": 1, "dp": 1},
                       distinct={"moe.experts.*": "ep"}, expert_axes="ep", backend="local",
                       cache=False)
    sm = mt.fully_shard(dw.MoEModel(dw.EP), mesh={"ep": 1, "dp": 1},
                        distinct={"moe.experts.*": "ep"}, expert_axes=("ep",), backend="local",
                        cache=False)
    try:
        if not dist.is_initialized():
            with pytest.raises(mfsdp.UsageError, match=r"device_mesh\(\) needs "
                                                       r"torch.distributed: call"):
                sm.device_mesh()
        with pytest.raises(mfsdp.UsageError, match=r"full_state_dict of a model with Distinct "
                                                   r"tensors \(8, e.g. 'moe.experts.0.w1.weight' "
                                                   r"on axis ep\)"):
            sm.full_state_dict()
        with pytest.raises(mfsdp.UsageError, match=r"save_dcp of a model with Distinct"):
            sm.save_dcp("never")
        assert not os.path.exists("never")
    finally:
        sm.close()


def test_every_distinct_axis_is_declared():
    """A Distinct axis in neither expert_axes nor tensor_axes, or in both, is a
    UsageError at sharding that names the axis, a tensor and both choices
    (undeclared, an expert gradient would be off by the axis size)."""
    for kw, where in (({}, "in neither"), ({"expert_axes": ("ep",), "tensor_axes": ("ep",)},
                                           "in both")):
        with pytest.raises(mfsdp.UsageError, match=r"axis 'ep' is Distinct \(e.g. "
                           r"'moe.experts.0.w1.weight'\) and %s: say how its tensors get their "
                           r"gradient, in exactly one of expert_axes=\('ep',\).*tensor_axes="
                           r"\('ep',\)" % where):
            mt.fully_shard(dw.MoEModel(dw.EP), mesh={"ep": 1, "dp": 1},
                           distinct={"moe.experts.*": "ep"}, backend="local", cache=False, **kw)
    with pytest.raises(mfsdp.UsageError, match=r"tensor_axes names 'dp', which is Distinct for "
                                               r"no tensor"):
        mt.fully_shard(dw.MoEModel(dw.EP), mesh={"ep": 1, "dp": 1},
                       distinct={"moe.experts.*": "ep"}, expert_axes=("ep",),
                       tensor_axes=("dp",), backend="local", cache=False)


def test_device_mesh_takes_a_sharded_model():
    """mt.device_mesh(x) of anything but a ShardedModel names what it takes."""
    with pytest.raises(mfsdp.UsageError, match=r"device_mesh\(sm\) takes the ShardedModel "
                                               r"that mt.shard or mt.fully_shard returned, not a "
                                               r"MoEModel"):
        mt.device_mesh(dw.MoEModel(dw.EP))
