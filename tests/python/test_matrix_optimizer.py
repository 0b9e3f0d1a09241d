"""
test_matrix_optimizer: which tensors spec_from_module puts on Whole (one
process, no MPI). matrix_optimizer="whole" follows the Muon recipe: the hidden
matrices only, not the embeddings nor the output head (Hugging Face's
get_output_embeddings(), a weight tied to the embedding, or a Linear onto the
input embedding's vocabulary); "whole_all" every 2-D tensor; overrides keep
their meaning (a plain layout takes a matrix out, a _whole one puts it in).
whole_owners="node" gives the Whole tensors main_weight [Replicate, Whole] and
grad [Partial, Whole] on a 2-D mesh and is the same spec as "mesh" on a 1-D
one. Each expectation is a hand-written list of names, checked in the spec's
text and in the compiled schedule's per-tensor Whole flags. Bad values are
ValueErrors (UsageErrors through fully_shard) that name the fix.
"""
import re

import pytest
import torch
import torch.nn as nn

import mfsdp
import mfsdp.torch as mt
from mfsdp.torch.spec import hidden_matrices

V, D, P = 40, 8, 16        # vocabulary, width, a position table as long as `up` is wide


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.q = nn.Linear(D, D, bias=False)
        self.up = nn.Linear(D, 2 * D)
        self.down = nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(torch.relu(self.up(h + self.q(h))))


class HFLike(nn.Module):
    """A Hugging Face-shaped causal LM: embed_tokens, layers, norm, lm_head,
    with get_input_embeddings / get_output_embeddings (optional) and a learned
    position table of P = 2 * D rows (as many as `up` has outputs)."""
    _no_split_modules = ["Layer"]

    def __init__(self, tied=False, accessors=True, head_out=V, vocab=V):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, D)
        self.positions = nn.Embedding(P, D)
        self.layers = nn.ModuleList(Layer() for _ in range(2))
        self.norm = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, head_out, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight
        self.accessors = accessors

    def get_input_embeddings(self):
        if not self.accessors:
            raise NotImplementedError
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head if self.accessors else None

    def forward(self, idx):
        x = self.embed_tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


HIDDEN = ["layers.%d.%s.weight" % (i, n) for i in range(2) for n in ("q", "up", "down")]
ALL_2D = ["embed_tokens.weight", "positions.weight"] + HIDDEN + ["lm_head.weight"]
MESH1, MESH2 = {"dp": 4}, {"dp_outer": 2, "dp_inner": 2}


def parse(spec):
    """({full tensor name: layout name}, {layout name: {role: [placement names]}})
    of a spec's text, loops expanded."""
    tensors, layouts, unit, block = {}, {}, None, None
    for line in spec.splitlines():
        m = re.match(r'^unit "([^"]+)"(?: for i in (\d+)\.\.(\d+))? layout (\w+) \{$', line)
        if m:
            idx = range(int(m.group(2)), int(m.group(3))) if m.group(2) else [None]
            unit = ([m.group(1).replace("{i}", str(i)) for i in idx], m.group(4))
            continue
        m = re.match(r'^\s+tensor "([^"]+)" \[[\d, ]*\](?: layout (\w+))?;$', line)
        if m:
            for u in unit[0]:
                tensors[u + "." + m.group(1)] = m.group(2) or unit[1]
            continue
        m = re.match(r"^layout (\w+) \{$", line)
        if m:
            block = layouts.setdefault(m.group(1), {})
            continue
        m = re.match(r"^\s+(weight|grad|main_weight)\s+\w+ \[([A-Za-z, ]+)\];$", line)
        if m and block is not None:
            block[m.group(1)] = m.group(2).split(", ")
    return tensors, layouts


def whole_in_spec(spec):
    """Names whose main_weight has a Whole axis in the spec's text, sorted."""
    tensors, layouts = parse(spec)
    return sorted(n for n, lay in tensors.items() if "Whole" in layouts[lay]["main_weight"])


def whole_in_schedule(spec):
    """Names the compiler marks Whole (grad and main_weight), sorted."""
    sched = mfsdp.Schedule.compile(spec, name="matrix_optimizer")
    both = mfsdp._lib.WHOLE_GRAD | mfsdp._lib.WHOLE_MAIN_WEIGHT
    assert all(t.whole in (0, both) for t in sched.tensors), [t.whole for t in sched.tensors]
    return sorted(t.name for t in sched.tensors if t.whole)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("accessors", [True, False])
def test_whole_is_the_hidden_matrices(tied, accessors):
    """The default share: the layers' matrices; not the token embedding, the
    position table or the head (tied or not, found by get_output_embeddings()
    or as a Linear onto the vocabulary when the model has no accessors)."""
    model = HFLike(tied=tied, accessors=accessors)
    want = sorted(HIDDEN)
    assert sorted(hidden_matrices(model)) == want
    for mesh, layout in ((MESH1, "zero3"), (MESH2, "hfsdp")):
        spec = mt.spec_from_module(model, mesh, layout=layout, matrix_optimizer="whole")
        assert whole_in_spec(spec) == want, spec
        assert whole_in_schedule(spec) == want
    every = [n for n in ALL_2D if not (tied and n == "lm_head.weight")]   # one tensor when tied
    spec = mt.spec_from_module(model, MESH2, layout="hfsdp", matrix_optimizer="whole_all")
    assert whole_in_spec(spec) == sorted(every) and whole_in_schedule(spec) == sorted(every)
    assert whole_in_schedule(mt.spec_from_module(model, MESH2, layout="hfsdp")) == []


def test_head_found_by_get_output_embeddings_alone():
    """A head whose width is not the vocabulary (a classifier) is excluded
    because get_output_embeddings() returns it; without the accessors it is a
    hidden matrix like any other Linear."""
    model = HFLike(head_out=3)
    assert sorted(hidden_matrices(model)) == sorted(HIDDEN)
    model.accessors = False
    assert sorted(hidden_matrices(model)) == sorted(HIDDEN + ["lm_head.weight"])


def test_a_block_as_wide_as_the_vocabulary_stays_hidden():
    """Without accessors, a Linear onto the vocabulary is the head only outside
    the blocks (ModuleLists): with the vocabulary 2 * D, `up` (D -> 2 * D) in
    each layer stays hidden, the head (out_features 2 * D too) is excluded."""
    model = HFLike(accessors=False, vocab=2 * D, head_out=2 * D)
    assert sorted(hidden_matrices(model)) == sorted(HIDDEN)
    spec = mt.spec_from_module(model, MESH1, layout="zero3", matrix_optimizer="whole")
    assert whole_in_schedule(spec) == sorted(HIDDEN)


def test_overrides_keep_their_meaning():
    """An override to a plain layout keeps a hidden matrix Flat; one to a
    _whole layout makes the untied head Whole; the rest follow the rule."""
    model = HFLike()
    spec = mt.spec_from_module(model, MESH1, layout="zero3", matrix_optimizer="whole",
                               overrides={"layers.1.up.weight": "zero3",
                                          "lm_head.weight": "zero3_whole"})
    want = sorted([n for n in HIDDEN if n != "layers.1.up.weight"] + ["lm_head.weight"])
    assert whole_in_spec(spec) == want and whole_in_schedule(spec) == want


def test_node_owners_replicate_the_outer_axes():
    """whole_owners="node" on 2 x 2: the hidden matrices get main_weight
    [Replicate, Whole] and grad [Partial, Whole] under hfsdp and zero3,
    against [Whole, Whole] for "mesh"; the weight as the layout says, but
    never split finer than the owners (a whole bucket's shards are ragged,
    docs/semantics.md §4.6: zero3's [Flat, Flat] becomes [Replicate, Flat]);
    the other tensors keep the layout."""
    model = HFLike()
    cases = (("hfsdp", "mesh", ["Replicate", "Flat"], ["Partial", "Whole"], ["Whole", "Whole"]),
             ("hfsdp", "node", ["Replicate", "Flat"], ["Partial", "Whole"], ["Replicate", "Whole"]),
             ("zero3", "node", ["Replicate", "Flat"], ["Partial", "Whole"], ["Replicate", "Whole"]),
             ("hsdp", "node", ["Replicate", "Flat"], ["Partial", "Whole"], ["Replicate", "Whole"]))
    for layout, owners, weight, grad, main in cases:
        spec = mt.spec_from_module(model, MESH2, layout=layout, matrix_optimizer="whole",
                                   whole_owners=owners)
        tensors, layouts = parse(spec)
        for n in HIDDEN:
            got = layouts[tensors[n]]
            assert (got["weight"], got["grad"], got["main_weight"]) == (weight, grad, main), \
                (layout, owners, n, got)
        assert all(tensors[n] == layout for n in tensors if n not in HIDDEN), tensors
        assert whole_in_schedule(spec) == sorted(HIDDEN)


def test_node_owners_on_one_axis_are_mesh_owners():
    """On a 1-D mesh the innermost axis is the mesh: the same spec."""
    model = HFLike()
    for mo in ("whole", "whole_all"):
        a = mt.spec_from_module(model, MESH1, layout="zero3", matrix_optimizer=mo)
        b = mt.spec_from_module(model, MESH1, layout="zero3", matrix_optimizer=mo,
                                whole_owners="node")
        assert a == b


def test_meta_model():
    """The rule reads modules and shapes only: a model on meta gets the same spec."""
    with torch.device("meta"):
        model = HFLike(tied=True)
    spec = mt.spec_from_module(model, MESH2, layout="hfsdp", matrix_optimizer="whole")
    assert whole_in_spec(spec) == sorted(HIDDEN)


def test_bad_values_name_the_fix():
    model = HFLike()
    with pytest.raises(ValueError, match=r"matrix_optimizer='muon': one of None .*, 'whole' "
                                         r"\(the hidden matrices.* or 'whole_all'"):
        mt.spec_from_module(model, MESH1, layout="zero3", matrix_optimizer="muon")
    with pytest.raises(ValueError, match=r"whole_owners='rack': 'mesh' .* or 'node'"):
        mt.spec_from_module(model, MESH2, matrix_optimizer="whole", whole_owners="rack")
    with pytest.raises(ValueError, match=r"whole_owners='node' places matrix_optimizer's Whole "
                                         r"tensors, and matrix_optimizer is None: give "
                                         r"matrix_optimizer='whole'"):
        mt.spec_from_module(model, MESH2, whole_owners="node")
    with pytest.raises(mfsdp.UsageError, match=r"fully_shard: whole_owners='rack'"):
        mt.fully_shard(model, mesh=MESH2, matrix_optimizer="whole", whole_owners="rack")


def test_fully_shard_passes_the_options(tmp_path, monkeypatch):
    """mt.fully_shard takes matrix_optimizer and whole_owners as spec options
    (one rank, 1 x 1, the local backend): its spec has the node layout and
    sm.whole_parameters() is every hidden matrix (the one rank owns them all),
    full-shape, and nothing else."""
    monkeypatch.setenv("MFSDP_CACHE_DIR", str(tmp_path))
    model = HFLike()
    sm = mt.fully_shard(model, mesh={"dp_outer": 1, "dp_inner": 1}, backend="local",
                        matrix_optimizer="whole", whole_owners="node")
    try:
        tensors, layouts = parse(sm.spec)
        assert layouts[tensors["layers.0.q.weight"]]["main_weight"] == ["Replicate", "Whole"]
        got = {p.full_name: p for p in sm.whole_parameters()}
        assert sorted(got) == sorted(HIDDEN)
        assert all(p.shape == p.full_shape and p.dim() == 2 for p in got.values())
    finally:
        sm.close()


def test_muon_over_a_split_matrix_is_refused(tmp_path, monkeypatch):
    """torch.optim.Muon over every 2-D main parameter (nanoGPT's grouping: the
    embedding and the head are Flat, 1-D shards that answer dim() 2, so Muon
    takes them) is a UsageError at step() naming the first such tensor and
    sm.whole_parameters(), before any update; over sm.whole_parameters() it
    steps (one rank, the local backend)."""
    monkeypatch.setenv("MFSDP_CACHE_DIR", str(tmp_path))
    sm = mt.fully_shard(HFLike(), mesh={"dp_outer": 1, "dp_inner": 1}, backend="local",
                        matrix_optimizer="whole")
    try:
        before = [p.detach().clone() for p in sm.main_parameters()]
        wrong = torch.optim.Muon([p for p in sm.main_parameters() if p.dim() == 2], lr=0.02)
        with pytest.raises(mfsdp.UsageError, match=r"Muon.step\(\) over main parameter "
                           r"'embed_tokens.weight', a 320 shard of its \[40, 8\] tensor.*"
                           r"sm.whole_parameters\(\)"):
            wrong.step()
        assert all(torch.equal(a, b) for a, b in zip(before, sm.main_parameters()))
        torch.optim.Muon(sm.whole_parameters(), lr=0.02).step()
    finally:
        sm.close()
