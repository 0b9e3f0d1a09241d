"""
test_distinct_dcp: PyTorch DCP checkpoints with the optimizer of models
whose tensors are Distinct on a mesh axis (issue #42 item 2; docs/pytorch.md
"Expert and tensor parallelism", docs/checkpoint.md "Distinct tensors").

One launch of distinct_dcp_worker.py on 4 MPI ranks (the TP = 2 x DP = 2
column/row MLP, split global names, and the EP = 2 x DP = 2 top-1 MoE,
renamed experts, of distinct_worker.py; Adam: a 0-d `step` and two moments
per parameter), then one on 2 (dp = 1). Checked here:
  - torch's own dcp.load of sm.save_dcp(path, optimizer), through
    get_state_dict / set_state_dict into the single-process whole model and
    a torch.optim.Adam, gives the sharded run's weights (its full_state_dict)
    and every rank's optimizer shards bit for bit, both within 1e-6 of a
    single-process run of the same steps; stepping that model on gives the
    single-process run's next steps;
  - load_dcp(path, optimizer) into a fresh sharded model of other values
    resumes bit for bit on 4 ranks (losses and every master shard of the
    next steps equal the uninterrupted run's), and within 1e-6 on 2 ranks
    (dp = 1, the same global batches), whose own save_dcp torch reads back;
  - no global tensor is assembled during the save (the worker makes
    global_state.gather, full_state_dict's assembly, fail meanwhile), and
    every Distinct global tensor is stored as chunks written by the ranks
    that hold them (several files, no rank writes an expert set whole), with
    the tp/ep layout recorded; loading into the model with tp = 4 or ep = 4
    is refused on every rank naming the tensor and both sizes.
"""
import json
import os
import warnings

import pytest
import torch

import conftest
import distinct_dcp_worker as ddw
import distinct_worker as dw
import mfsdp

TOL = 1e-6
# Adam's moments are the gradients themselves (and their squares), summed
# over the tokens in another order than one process sums them (the MoE's
# dispatch regroups them): fp32 rounding of a sum of ~100 terms, ~1e-6
# relative; the weights they move stay within TOL.
MOMENT_TOL = 1e-5
WORLD = 4
KINDS = ("tp", "moe")
SAVED = KINDS + ("moe_skip",)      # the 4-rank launch's runs

needs_mpi = pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                               reason="libmfsdp built without the MPI backend")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("distinct_dcp")
    cmd = conftest.mpirun() + [conftest.sys.executable,
                               os.path.join(conftest.HERE, "distinct_dcp_worker.py"), str(out),
                               str(conftest.free_port())]
    p = conftest.subprocess.run(cmd, env=conftest.env(), cwd=str(out), capture_output=True,
                                text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    two = [a if a != str(WORLD) else "2" for a in conftest.mpirun()]   # -np 2: dp = 1
    script = cmd[len(two):len(two) + 2]
    p = conftest.subprocess.run(two + script + [str(out), str(conftest.free_port()), "resume2"],
                                env=conftest.env(), cwd=str(out), capture_output=True,
                                text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    got = {(k, r): torch.load(os.path.join(out, "%s.rank%d.pt" % (k, r)))
           for k in SAVED for r in range(WORLD)}
    got.update({("resume2_" + k, r): torch.load(os.path.join(out, "resume2_%s.rank%d.pt"
                                                             % (k, r)))
                for k in KINDS for r in range(2)})
    got["dir"] = str(out)
    return got


def batches(kind, s):
    """Step s's M microbatches of the whole model: every rank's m-th together."""
    X, Y = ddw.data(kind)
    return (X[s].transpose(0, 1).reshape(dw.M, -1, dw.D),
            Y[s].transpose(0, 1).reshape(dw.M, -1, dw.D))


def step(model, opt, kind, s):
    x, y = batches(kind, s)
    tot = 0.0
    for m in range(dw.M):
        loss = model(x[m], y[m]) / dw.M
        loss.backward()
        tot += loss.item()
    opt.step()
    opt.zero_grad()
    return tot


def reference(kind):
    """The whole model and its Adam after K steps in one process, and the
    losses and parameters of the R steps after them."""
    model = dw.whole_model(kind)
    ddw.mask(model, kind)
    opt = ddw.adam_of(model.parameters())
    for s in range(ddw.K):
        step(model, opt, kind, s)
    saved = ({n: p.detach().clone() for n, p in model.named_parameters()},
             {n: {k: v.clone() for k, v in opt.state[p].items()}
              for n, p in model.named_parameters() if opt.state.get(p)})
    after = []
    for s in range(ddw.K, ddw.K + ddw.R):
        loss = step(model, opt, kind, s)
        after.append((loss, {n: p.detach().clone() for n, p in model.named_parameters()}))
    return saved, after


def torch_load(path, kind):
    """torch's own dcp.load of an FSDP2-layout checkpoint into the whole
    model and a fresh Adam (get_state_dict / set_state_dict; get_state_dict
    gives every parameter state, so moe_skip, whose masked expert has none
    in the checkpoint, loads with DCP's allow_partial_load)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model = dw.whole_model(kind)
    ddw.mask(model, kind)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    opt = ddw.adam_of(model.parameters())
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, checkpoint_id=path, no_dist=True,
                 planner=DefaultLoadPlanner(allow_partial_load=kind == "moe_skip"))
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    state = {n: {k: v.clone() for k, v in opt.state[p].items()}
             for n, p in model.named_parameters()}
    return model, opt, state


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def whole_of(kind, name, c, full):
    """(whole-model name, coordinate c's part of it) of a rank's tensor `name`."""
    if kind == "tp":
        return name, dw.tp_slice(name, full[name], c)
    g = dw.moe_global_name(name, c)
    return g, full[g]


@needs_mpi
@pytest.mark.parametrize("kind", SAVED)
def test_torch_loads_weights_and_optimizer(runs, kind):
    """torch's dcp.load into the whole model + Adam: the weights are the
    sharded run's full_state_dict and the optimizer state every rank's
    shards, bit for bit; both within 1e-6 of the single-process run, which
    the loaded model then follows step for step. moe_skip: the expert that
    never had a gradient has no optimizer state in the checkpoint (nor in
    the single-process Adam) and its weights stay the initial ones."""
    model, opt, state = torch_load(os.path.join(runs["dir"], "dcp_" + kind), kind)
    saved = runs[(kind, 0)]["saved"]
    params = dict(model.named_parameters())
    assert set(params) == set(saved)
    assert all(torch.equal(params[n].detach(), saved[n]) for n in saved)
    covered = {n: 0 for n in params if not n.startswith("moe.experts.%d." % dw.MASKED)
               or kind != "moe_skip"}
    for r in range(WORLD):
        got = runs[(kind, r)]
        for t, sh in got["opt_shards"].items():
            off = got["shards"][t][0]
            for k, v in sh.items():
                if v.dim() == 0:
                    g = dw.moe_global_name(t, got["coords"][0]) if kind == "moe" else t
                    assert torch.equal(state[g][k], v), (r, t, k)
                    continue
                g, part = whole_of(kind, t, got["coords"][0], {n: s[k] for n, s in state.items()})
                assert torch.equal(part.reshape(-1)[off:off + v.numel()], v), (r, t, k)
                covered[g] += v.numel() if k == "exp_avg" else 0
    assert all(covered[n] >= params[n].numel() for n in covered), covered
    (ref_w, ref_s), after = reference(kind)
    masked = {n for n in ref_w if n not in ref_s}
    assert masked == ({n for n in ref_w if n.startswith("moe.experts.%d." % dw.MASKED)}
                      if kind == "moe_skip" else set())
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(os.path.join(runs["dir"], "dcp_" + kind)).read_metadata()
    for n in masked:
        assert not any(k.startswith("optim.state.%s." % n) for k in md.state_dict_metadata), n
        assert torch.equal(params[n].detach(), dict(dw.whole_model(kind).named_parameters())[n])
    for n in ref_w:
        assert rel(params[n].detach(), ref_w[n]) <= TOL, n
        if n in masked:
            continue
        assert torch.equal(state[n]["step"], ref_s[n]["step"]), n
        for k in ("exp_avg", "exp_avg_sq"):   # the gradients' own rounding: MOMENT_TOL
            err = rel(state[n][k], ref_s[n][k])
            assert err <= MOMENT_TOL, (n, k, err)
    for i, (loss, ref_p) in enumerate(after):
        got = step(model, opt, kind, ddw.K + i)
        assert abs(got - loss) <= TOL * abs(loss), i
        assert all(rel(p.detach(), ref_p[n]) <= TOL for n, p in model.named_parameters()), i


@needs_mpi
@pytest.mark.parametrize("kind", SAVED)
def test_load_dcp_resumes_identically(runs, kind):
    """load_dcp(path, optimizer) on 4 ranks: the next steps are the
    uninterrupted run's bit for bit; on 2 ranks (dp = 1) within 1e-6, and
    the checkpoint it saves is its state for torch's dcp.load."""
    for r in range(WORLD):
        run, resumed = runs[(kind, r)]["run"], runs[(kind, r)]["resumed"]
        assert resumed["losses"] == run["losses"][ddw.K:], r
        for i in range(ddw.R):
            want, got = run["params"][ddw.K + i], resumed["params"][i]
            assert set(got) == set(want)
            assert all(got[n][0] == want[n][0] and torch.equal(got[n][1], want[n][1])
                       for n in want), (r, i)
    if kind not in KINDS:
        return                       # moe_skip: not run on 2 ranks
    full = runs[(kind, 0)]["run"]["full"]
    for r in range(2):
        two = runs[("resume2_" + kind, r)]
        want = runs[(kind, 0)]["run"]["losses"][ddw.K:]
        assert len(two["losses"]) == len(want)
        assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(two["losses"], want)), r
        assert set(two["full"]) == set(full)
        assert all(rel(two["full"][n], full[n]) <= TOL for n in full), r
    model, _, _ = torch_load(os.path.join(runs["dir"], "dcp2_" + kind), kind)
    two = runs[("resume2_" + kind, 0)]["full"]
    assert all(torch.equal(p.detach(), two[n]) for n, p in model.named_parameters())


@needs_mpi
@pytest.mark.parametrize("kind", KINDS)
def test_each_rank_writes_its_own_shards(runs, kind):
    """Every Distinct global tensor (and its optimizer moments) is stored as
    chunks, in the files of more than one rank, none of them the whole
    tensor; the record of its axes and split is in the checkpoint."""
    import torch.distributed.checkpoint as dcp
    path = os.path.join(runs["dir"], "dcp_" + kind)
    md = dcp.FileSystemReader(path).read_metadata()
    distinct = runs[(kind, 0)]["saved"]
    names = [n for n in distinct if (".experts." in n if kind == "moe" else
                                     ".w1." in n or ".w2." in n)]
    assert names
    every = set()
    for n in names:
        for key in ("model." + n, "optim.state.%s.exp_avg" % n):
            m = md.state_dict_metadata[key]
            files = {md.storage_data[i].relative_path for i in md.storage_data if i.fqn == key}
            every |= files
            if kind == "tp":     # each slice by a rank of its tp coordinate
                assert len(m.chunks) >= 2 and all(tuple(c.sizes) != tuple(m.size)
                                                  for c in m.chunks), key
                assert len(files) >= 2, (key, files)
    for f in every if kind == "moe" else ():   # the experts whole, no file holds all of them
        assert not all(any(md.storage_data[i].relative_path == f and i.fqn == "model." + n
                           and tuple(i.offset or ()) == (0,) * len(distinct[n].shape)
                           for i in md.storage_data) for n in names), f
    sd = {"mfsdp.distinct": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, checkpoint_id=path, no_dist=True)
    record = json.loads(sd["mfsdp.distinct"])
    axis = "ep" if kind == "moe" else "tp"
    assert set(record) == set(names)
    for n in names:
        split = None if kind == "moe" else (0 if ".w1." in n else 1)
        assert record[n] == {"axes": [[axis, 2]], "split": split}, n


@needs_mpi
@pytest.mark.parametrize("kind", KINDS)
def test_other_tp_ep_size_is_refused(runs, kind):
    """The checkpoint loaded into the model with tp = 4 / ep = 4: refused on
    every rank, naming the tensor, both sizes and what does reshard."""
    first = "'moe.experts.0.w1.weight'" if kind == "moe" else "'blocks.0.w1.weight'"
    sizes = ("over ep = 2, this model holds it over ep = 4" if kind == "moe" else
             "over tp = 2 split 0, this model holds it over tp = 4 split 0")
    for r in range(WORLD):
        msg = runs[(kind, r)]["other_size"]
        assert msg and msg.startswith("load_dcp: "), msg
        assert "is not a checkpoint of this model" in msg, msg
        assert "%s was saved Distinct %s" % (first, sizes) in msg, msg
        assert "reshards across data-parallel sizes only" in msg, msg


def test_boxes_cover_a_flat_range_exactly():
    """dcp_files.boxes: every flat range of small tensors of 0 to 3 dims cut
    into boxes, each a contiguous run of the range starting where it says,
    together every element once, at most 2 x ndim - 1 of them."""
    from mfsdp.torch.dcp_files import boxes
    for shape in [(), (5,), (3, 4), (2, 3, 4), (1, 4, 1), (4, 1, 3)]:
        n = 1
        for d in shape:
            n *= d
        ids = torch.arange(n).reshape(shape)
        for a in range(n + 1):
            for b in range(a, n + 1):
                seen = torch.zeros(n, dtype=torch.int64)
                got = boxes(shape, a, b)
                assert len(got) <= max(1, 2 * len(shape) - 1), (shape, a, b, got)
                for off, sizes, start in got:
                    part = ids[tuple(slice(o, o + s) for o, s in zip(off, sizes))].reshape(-1)
                    assert part.tolist() == list(range(start, start + part.numel())), \
                        (shape, a, b, off, sizes, start)
                    seen[part] += 1
                want = torch.zeros(n, dtype=torch.int64)
                want[a:b] = 1
                assert torch.equal(seen, want), (shape, a, b, got)


def test_writes_each_element_once():
    """global_state.writes: replicas of one coordinate share its elements
    (each written by exactly one rank, hand-computed), a coordinate not
    covered is refused naming it."""
    from mfsdp.torch import global_state
    # tensor "w" (8 elements), 2 coordinates; ranks 0, 1 hold coordinate 0 (0-4, 4-8), ranks 2, 3
    # coordinate 1, each the whole 0-8 (replicas)
    held = [[("w", 0, 0, 4)], [("w", 0, 4, 4)], [("w", 1, 0, 8)], [("w", 1, 0, 8)]]
    got = [global_state.writes(held, r, {"w": 8}, {"w": 2}, "save_dcp") for r in range(4)]
    assert got[0] == {"w": [(0, 4)]} and got[1] == {"w": [(4, 8)]}
    # coordinate 1: the rotation (tensor 0 + coordinate 1 = rank 1 first, then 2): rank 2 writes
    assert got[2] == {"w": [(0, 8)]} and got[3] == {}
    # overlapping replicas: rank 3 holds 2-8 of coordinate 1, rank 2 0-4: rank 2 first (0-4),
    # rank 3 the rest (4-8)
    held[2], held[3] = [("w", 1, 0, 4)], [("w", 1, 2, 6)]
    assert global_state.writes(held, 2, {"w": 8}, {"w": 2}, "save_dcp") == {"w": [(0, 4)]}
    assert global_state.writes(held, 3, {"w": 8}, {"w": 2}, "save_dcp") == {"w": [(4, 8)]}
    held[3] = [("w", 1, 5, 3)]
    with pytest.raises(mfsdp.UsageError, match="save_dcp: coordinate 1 of 'w' is not covered"):
        global_state.writes(held, 0, {"w": 8}, {"w": 2}, "save_dcp")
