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
    dense tensors data parallel over both axes, expert_axes=("ep",);
  - moe_skip: the same MoE skipping empty experts (as Hugging Face's do) and
    one expert routed no token from step 1 on: a parameter with no gradient
    in a microbatch counts zero, one no rank of its group got a gradient for
    in a step has .grad None, as in the single-process model (momentum
    leaves it alone).
Every loss, every step's gradient norm (the norm counts each distinct tensor
once per coordinate, each replica once) and every rank's master shards after
every step equal the reference within 1e-6 relative. Without expert_axes the
expert gradients are the ep group's sum (the run is far from the reference).
The device mesh has mfsdp's coordinates. Global names (issue #42 item 2:
global_names=, the spec's global clause): sm.full_state_dict() after the
steps has the whole model's keys and values (the experts renamed, the TP
slices concatenated), equal bit for bit to the ranks' master shards put
together here and within 1e-6 of the reference; load_full_state_dict of the
whole model's initial state dict into a sharded model of other values gives
it back bit for bit and trains bit-identically to the first run; without
global names both (and save_dcp) are refused naming the tensor and
global_names=; save_dcp after the steps is read by torch's own dcp.load into
the single-process model bit for bit, and load_dcp on 4 ranks and on 2
(mpirun -np 2, dp = 1) gives it back (checkpoints with the optimizer, native,
DCP and Hugging Face: test_distinct_ckpt, test_distinct_dcp,
test_distinct_hf). In one process: the spec text (the global
clauses), the schedule's global key read from hand-written YAML, the
refusals of spec_from_module and fully_shard, and a one-rank state dict
under global names with load_full_state_dict's listed problems.
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
    two = [a if a != str(WORLD) else "2" for a in conftest.mpirun()]   # -np 2: dp = 1
    script = cmd[len(two):len(two) + 2]                                # python, the worker
    p = conftest.subprocess.run(two + script + [str(out), str(conftest.free_port()), "reshard"],
                                env=conftest.env(), cwd=str(out), capture_output=True,
                                text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    got = {(k, r): torch.load(os.path.join(out, "%s.rank%d.pt" % (k, r)))
           for k in list(dw.RUNS) + dw.REFUSED + ["unnamed"] for r in range(WORLD)}
    got.update({("reshard_" + k, r): torch.load(os.path.join(out, "reshard_%s.rank%d.pt"
                                                             % (k, r)))
                for k in ("tp", "moe") for r in range(2)})
    got["dir"] = str(out)
    return got


def reference(kind, steps=dw.STEPS, expert_scale=1.0):
    """The whole model in one process on the union of the microbatches: per
    step the loss, clip_grad_norm_'s norm, and the parameters after it.
    expert_scale multiplies the experts' gradients (a wrongly scaled run)."""
    model = dw.whole_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=dw.LR, momentum=0.9, foreach=False)
    X, Y = dw.data(kind)
    losses, norms, params = [], [], []
    for s in range(steps):
        dw.mask_step(model, kind, s)
        x = X[s].transpose(0, 1).reshape(dw.M, -1, dw.D)   # microbatch m: every rank's m-th
        y = Y[s].transpose(0, 1).reshape(dw.M, -1, dw.D)
        tot = 0.0
        for m in range(dw.M):
            loss = model(x[m], y[m]) / dw.M
            loss.backward()
            tot += loss.item()
        for n, p in model.named_parameters():
            if ".experts." in n and p.grad is not None:
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
@pytest.mark.parametrize("kind", ["tp", "moe", "moe_skip"])
def test_matches_the_whole_model(runs, kind):
    ref = reference(kind)
    if kind == "moe_skip":      # the masked expert: trained in step 0, left alone after
        name = "moe.experts.%d.w1.weight" % dw.MASKED
        assert not torch.equal(ref[2][0][name], dw.whole_model(kind).state_dict()[name])
        assert torch.equal(ref[2][1][name], ref[2][2][name])
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
def test_distinct_tensors(runs, kind):
    got = runs[(kind, 0)]
    axis = list(dw.RUNS[kind][0])[0]
    model = dw.whole_model(kind) if kind == "tp" else dw.MoEModel(dw.EP)
    want = {n for n, _ in model.named_parameters()
            if (".experts." in n if kind == "moe" else (".w1." in n or ".w2." in n))}
    assert got["distinct"] == {n: (axis,) for n in want}, got["distinct"]


def assembled(runs, kind):
    """The whole model put together here from every rank's master shards
    after the last step (the test's own knowledge of the naming: expert e of
    ep coordinate c is 2c + e; TP's w1 concatenated along dim 0, w2 along 1)."""
    shapes = {n: p.shape for n, p in dw.whole_model(kind).named_parameters()}
    local = {}
    for r in range(WORLD):
        got = runs[(kind, r)]
        c = got["coords"][0]
        for n, (off, p) in got["params"][-1].items():
            g = dw.moe_global_name(n, c) if kind == "moe" else n
            shape = list(shapes[g])
            tp = kind == "tp" and (".w1." in n or ".w2." in n)
            if tp:
                shape[1 if ".w2." in n else 0] //= 2
            flat = local.setdefault((g, c if tp else 0),
                                    torch.full(shape, float("nan")).reshape(-1))
            flat[off:off + p.numel()] = p.reshape(-1)
    out = {}
    for (g, c), flat in sorted(local.items()):
        if kind == "tp" and (".w1." in g or ".w2." in g):
            parts = [local[(g, k)].reshape(-1, *shapes[g][1:]) if ".w1." in g
                     else local[(g, k)].reshape(shapes[g][0], -1) for k in range(2)]
            out[g] = torch.cat(parts, dim=1 if ".w2." in g else 0)
        else:
            out[g] = flat.reshape(shapes[g])
    return out


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_full_state_dict_is_the_whole_model(runs, kind):
    """full_state_dict: the whole model's names and tensors on every rank (bit
    for bit the ranks' shards put together; within TOL of the reference, the
    single-process run), rank 0's only by default."""
    ref = reference(kind)[2][-1]
    want = assembled(runs, kind)
    assert set(want) == set(ref) and not any(bool(t.isnan().any()) for t in want.values())
    for r in range(WORLD):
        got = runs[(kind, r)]
        full = got["full"]
        assert set(full) == set(ref), sorted(set(full) ^ set(ref))
        for n in ref:
            assert full[n].shape == ref[n].shape and torch.equal(full[n], want[n]), (r, n)
            err = ((full[n] - ref[n]).abs().max() / ref[n].abs().max()).item()
            assert err <= TOL, (r, n, err)
        if r == 0:
            assert set(got["full0"]) == set(ref)
            assert all(torch.equal(got["full0"][n], full[n]) for n in ref)
        else:
            assert got["full0"] == {}


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_load_full_state_dict_trains_identically(runs, kind):
    """load_full_state_dict of the whole model's initial state dict into a
    sharded model of other values: full_state_dict gives it back bit for bit,
    and the steps after it are the first run's, bit for bit."""
    init = dw.whole_model(kind).state_dict()
    for r in range(WORLD):
        first, again = runs[(kind, r)], runs[(kind, r)]["reload"]
        assert set(again["loaded"]) == set(init)
        assert all(torch.equal(again["loaded"][n], init[n]) for n in init), r
        assert again["losses"] == first["losses"] and again["norms"] == first["norms"], r
        assert all(torch.equal(again["full"][n], first["full"][n]) for n in init), r


def torch_load(path, kind):
    """torch DCP's own load of a checkpoint into the single-process model's
    state dict (no process group)."""
    import warnings
    import torch.distributed.checkpoint as dcp
    sd = {"model": dw.whole_model(kind).state_dict()}
    with warnings.catch_warnings():          # "torch.distributed is disabled": on purpose
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, checkpoint_id=path, no_dist=True)
    return sd["model"]


@needs_mpi
@pytest.mark.parametrize("kind", ["tp", "moe"])
def test_dcp_is_the_whole_model(runs, kind):
    """save_dcp writes the global model: torch's dcp.load into the
    single-process model gives full_state_dict bit for bit, from the 4-rank
    save and from the 2-rank one (dp = 1) that loaded it; load_dcp into fresh
    sharded models on 4 and on 2 ranks gives it back bit for bit. With an
    optimizer is test_distinct_dcp's)."""
    full = runs[(kind, 0)]["full"]
    for d in ("dcp_", "dcp2_"):
        got = torch_load(os.path.join(runs["dir"], d + kind), kind)
        assert set(got) == set(full)
        assert all(torch.equal(got[n], full[n]) for n in full), d
    for r in range(WORLD):
        loaded = runs[(kind, r)]["dcp_loaded"]
        assert set(loaded) == set(full) and all(torch.equal(loaded[n], full[n]) for n in full)
    for r in range(2):
        loaded = runs[("reshard_" + kind, r)]
        assert set(loaded) == set(full) and all(torch.equal(loaded[n], full[n]) for n in full)


@needs_mpi
def test_unnamed_distinct_tensors_are_refused(runs):
    for r in range(WORLD):
        got = runs[("unnamed", r)]
        for what in ("full_state_dict", "load_full_state_dict", "save_dcp"):
            want = ("%s: the Distinct tensor 'moe.experts.0.w1.weight' (on axis ep; 8 without "
                    "global names) has no global name" % what)
            assert got[what] and want in got[what] and "global_names={pattern:" in got[what], \
                (r, what, got[what])


@needs_mpi
def test_replicas_of_a_coordinate_must_agree(runs):
    """Ranks of one ep coordinate holding different experts are refused on
    every rank, naming the tensor (the coordinates' own differences are not)."""
    for r in range(WORLD):
        msg = runs[("bad_init", r)]["message"]
        assert msg and "the ranks that share a Distinct coordinate start from different " \
            "values of moe.experts.1.w2.bias at sharding" in msg, (r, msg)


@needs_mpi
def test_ranks_declare_the_axes_alike(runs):
    """Ranks of dp coordinate 1 declaring ep a tensor axis while the others
    declare it an expert axis: refused on every rank (a replica dividing its
    expert gradients and another not would drift apart)."""
    for r in range(WORLD):
        msg = runs[("bad_axes", r)]["message"]
        mine = ("expert_axes=('ep',), tensor_axes=()" if r % 2 == 0 else
                "expert_axes=(), tensor_axes=('ep',)")
        assert msg and "the ranks declare the Distinct axes differently: this rank has " \
            + mine in msg, (r, msg)


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
        with pytest.raises(mfsdp.UsageError, match=r"full_state_dict: the Distinct tensor "
                                                   r"'moe.experts.0.w1.weight' \(on axis ep; 8 "
                                                   r"without global names\) has no global name"):
            sm.full_state_dict()
        with pytest.raises(mfsdp.UsageError, match=r"save_dcp: the Distinct tensor "
                                                   r"'moe.experts.0.w1.weight' .* has no global "
                                                   r"name"):
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


def test_spec_global_clauses():
    """global_names= writes the spec's global clause, relative to the unit:
    mt.expert_names renames (one template per expert), (axis, D) and
    mt.split(D) slice."""
    spec = mt.spec_from_module(dw.MoEModel(dw.EP), {"ep": 2, "dp": 2}, layout="hfsdp",
                               distinct={"moe.experts.*": "ep"}, units=["embed", "moe", "head"],
                               global_names=dw.global_names("moe"))
    assert 'tensor "experts.1.w1.weight" [32, 16] layout hfsdp_d_ep global ' \
           '"experts.{2*ep+1}.w1.weight";' in spec, spec
    assert spec.count(" global ") == 8 and '"router.weight" [4, 16];' in spec
    spec = mt.spec_from_module(dw.TPModel(2), {"tp": 2, "dp": 2}, layout="fsdp2d",
                               distinct={"blocks.*.w1.*": "tp", "blocks.*.w2.*": "tp"},
                               global_names=dw.global_names("tp"))
    for line in ('"w1.weight" [16, 16] layout fsdp2d_d_tp global "w1.weight" split 0;',
                 '"w1.bias" [16] layout fsdp2d_d_tp global "w1.bias" split 0;',
                 '"w2.weight" [16, 16] layout fsdp2d_d_tp global "w2.weight" split 1;'):
        assert line in spec, spec
    assert 'unit "blocks.{i}" for i in 0..2' in spec                # the loop kept


def test_global_names_refusals():
    model = dw.MoEModel(dw.EP)
    kw = dict(distinct={"moe.experts.*": "ep"}, units=["embed", "moe", "head"])
    cases = [
        ({"nothing.*": "x"}, r"global_names=\{'nothing.\*': \.\.\.\}: the pattern matches no "
                             r"parameter"),
        ({"moe.router.weight": "moe.r"}, r"'moe.router.weight' is not Distinct on any axis"),
        ({"moe.experts.0.w1.weight": 3}, r"a value is a template string, split\(D\), \(axis, "
                                         r"D\) or a callable"),
        ({"moe.experts.0.w1.weight": "experts.{ep}.w1.weight"},
         r"global name 'experts.\{ep\}.w1.weight' of 'moe.experts.0.w1.weight': a global name "
         r"stays in its unit 'moe'"),
        ({"moe.experts.0.w1.weight": ("tp", 0)}, r"'moe.experts.0.w1.weight' is Distinct on ep, "
                                                 r"not on 'tp'"),
        ({"moe.router.*": mt.expert_names("moe.experts.{}", 2)}, r"not Distinct"),
        ({"moe.experts.*": mt.expert_names("moe.exp.{}", 2)}, r"expert_names\('moe.exp.\{\}'\): "
                                                             r"'moe.experts.0.w1.weight' does "
                                                             r"not start with it"),
    ]
    for names, msg in cases:
        with pytest.raises(ValueError, match=msg):
            mt.spec_from_module(model, {"ep": 2, "dp": 2}, global_names=names, **kw)
    with pytest.raises(ValueError, match=r"holds one '\{\}' where the local expert index"):
        mt.expert_names("moe.experts", 2)
    with pytest.raises(ValueError, match=r"split\('0'\): the dimension is an integer"):
        mt.split("0")


def test_schedule_global_key():
    """The schedule's global key (docs/schedule.md, written by mfsdpc) read from
    hand-written YAML: rename lists, split maps, quoted names, tensors without."""
    from mfsdp.torch.naming import global_names_of
    text = "\n".join([
        "format: mfsdp-schedule/6", "buckets:", "- name: moe/x", "  tensors:",
        "  - {name: moe.router.weight, offset: 0, numel: 64, dims: [4, 16]}",
        "  - {name: moe.experts.1.w, offset: 64, numel: 8, dims: [8], "
        "global: [moe.experts.1.w, moe.experts.3.w]}",
        "  - {name: \"a b\", offset: 72, numel: 8, dims: [2, 4], global: {name: 'x ''y', "
        "split: 1}}",
        "ops:", "  - {name: nope, global: [z]}", ""])
    assert global_names_of(text) == {"moe.experts.1.w": ["moe.experts.1.w", "moe.experts.3.w"],
                                     "a b": ("x 'y", 1)}
    with pytest.raises(ValueError, match=r"malformed global key in .*global: \{name: n\}"):
        global_names_of("buckets:\n  - {name: t, dims: [2], global: {name: n}}\n")


def test_one_rank_global_names():
    """On one rank (the local backend, ep = 1: no torch.distributed needed):
    full_state_dict under the global names gives the values sharded; a
    missing or misshapen global tensor and an unknown key are listed by
    load_full_state_dict before anything is written."""
    model = dw.MoEModel(dw.EP)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sm = mt.fully_shard(model, mesh={"ep": 1, "dp": 1}, distinct={"moe.experts.*": "ep"},
                        global_names=dw.global_names("moe"), expert_axes=("ep",),
                        units=["embed", "moe", "head"], backend="local", cache=False)
    try:
        assert sm.globals["moe.experts.1.w2.bias"] == ["moe.experts.1.w2.bias"]
        full = sm.full_state_dict()
        assert set(full) == set(before) and all(torch.equal(full[n], before[n]) for n in before)
        bad = dict(full)
        del bad["moe.experts.1.w1.weight"]
        bad["moe.experts.0.w2.bias"] = torch.zeros(3)
        bad["moe.experts.9.w1.weight"] = torch.zeros(1)
        with pytest.raises(mfsdp.UsageError, match=r"load_full_state_dict: missing parameter "
                           r"'moe.experts.1.w1.weight' \(a global name of a Distinct tensor\)"
                           r".*'moe.experts.0.w2.bias': shape \[3\], the global tensor has "
                           r"\[16\].*unexpected key 'moe.experts.9.w1.weight'"):
            sm.load_full_state_dict(bad)
        assert all(torch.equal(t, full[n]) for n, t in sm.full_state_dict().items())
    finally:
        sm.close()
