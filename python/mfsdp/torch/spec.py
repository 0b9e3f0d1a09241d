"""
spec: spec_from_module(), the .mfsdp spec of a torch module in one call.

Units default to one per block (default_units): the children of the module
that own parameters, in registration order, ModuleList / ModuleDict children
expanded (`blocks` gives `blocks.0`, `blocks.1`, ...), a child that holds such
a list or a module of a class named in `_no_split_modules` (Hugging Face's
decoder layers) opened up the same way; consecutive units with the same
tensors become one `unit "blocks.{i}" for i in A..B` loop. A parameter that
is read outside its unit's windows (tied weights) belongs to the first unit
that reaches it by name, and when the layout shards the compute weight it
gets the override layout `tied` (weight replicated on every axis). Ties are
found by name (a parameter under several names), by use (a forward traced on
an example microbatch: a parameter read while another unit, or no unit, runs)
and as declared (`ties=`). Layouts are emitted as blocks (docs/language.md has
no built-in layout names).

matrix_optimizer="whole" follows the Muon recipe: only the hidden matrices
(hidden_matrices: 2-D, not an embedding's, not the output head's) get their
layout's Whole variant; "whole_all" gives it to every 2-D tensor. whole_owners
picks the owners of a Whole tensor: "mesh" (one rank of the mesh: Whole on
every Flat axis) or "node" (one rank of each innermost-axis group: Whole on
the innermost axis, the outer axes Replicate for main_weight and Partial for
grad, so a matrix optimizer's traffic stays inside a node). Invariant: a
layout this file writes has Whole only on grad and main_weight, never beside
Flat in one placement (_check_roles).

distinct={fnmatch pattern on the parameter's full name: mesh axis} makes the
matching parameters Distinct on that axis (a TP shard, an expert set: each
coordinate holds its own tensor) in all three roles, their other axes as
their layout says (_distinct_of: the layout `<layout>_d_<axis>`). Invariant:
a layout this file writes is Distinct on an axis in all three roles or in
none, and its Flat/Whole axes are a suffix of the mesh with Distinct counted
as Replicate (_check_roles; docs/semantics.md §1).
"""
from __future__ import annotations

import fnmatch
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import torch
from torch.overrides import TorchFunctionMode

from . import naming
from .tensors import tensors_in

# [(unit name, module, [(tensor name, parameter)])] (plan_units)
Plan = List[Tuple[str, torch.nn.Module, List[Tuple[str, torch.nn.Parameter]]]]
# a layout name, or {"name": N, "weight": (dtype, [placements]), "grad": ..., "main_weight": ...}
Layout = Union[str, Dict[str, Any]]
# reshard_after_forward: None, a bool, or {unit name or pattern: bool}
Reshard = Union[None, bool, Mapping[str, bool]]

PLACE = {"R": "Replicate", "F": "Flat", "P": "Partial", "W": "Whole", "D": "Distinct"}
DTYPES = {"fp32", "bf16", "fp16"}
# matrix_optimizer=: None; "whole" (the hidden matrices' grad and main_weight Whole
# on their Flat axes: each entire on one owner for Muon, Shampoo); "whole_all"
# (every 2-D tensor's, the embeddings and the output head included)
MATRIX_OPTIMIZERS = (None, "whole", "whole_all")
# whole_owners=: who owns a Whole tensor: one rank of the mesh, or one of each node
# (innermost-axis group: the NVLink domain)
WHOLE_OWNERS = ("mesh", "node")
EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def _layout_roles(name, naxes):
    """(weight, grad, main_weight) placements of a named layout on naxes axes,
    outermost first; ValueError when the layout needs more axes."""
    if name in WHOLE_LAYOUTS:
        w, g, m = _layout_roles(WHOLE_LAYOUTS[name], naxes)
        return w, _whole(g), _whole(m)
    R, F, P = "R", "F", "P"
    one = {
        "ddp": ([R], [P], [R]),
        "zero1": ([R], [P], [F]),
        "zero2": ([R], [F], [F]),
        "zero3": ([F], [F], [F]),
        "replicated": ([R], [P], [R]),
    }
    if name in one:
        w, g, m = one[name]
        return w * naxes, g * naxes, m * naxes
    if naxes < 2:
        raise ValueError("layout %r needs a mesh of at least 2 axes (this one has %d)"
                         % (name, naxes))
    outer = naxes - 1
    two = {
        "hsdp": ([R] * outer + [F], [P] * outer + [F], [R] * outer + [F]),
        "hsdp_nosync": ([R] * outer + [F], [P] * naxes, [R] * outer + [F]),
        "hfsdp": ([R] * outer + [F], [P] * outer + [F], [F] * naxes),
        "fsdp2d": ([F] * naxes, [F] * naxes, [F] * naxes),
    }
    if name not in two:
        raise ValueError("unknown layout %r: use one of %s, or a layout block (dict)"
                         % (name, ", ".join(LAYOUT_NAMES)))
    return two[name]


LAYOUT_NAMES = ("ddp", "zero1", "zero2", "zero3", "hsdp", "hsdp_nosync", "hfsdp", "fsdp2d")
# the built-in Whole layouts (planner/passes/mf_builtin_layouts.c): {name: the layout whose
# grad and main_weight they put on Whole}
WHOLE_LAYOUTS = {"zero3_whole": "zero3", "hsdp_whole": "hsdp", "hfsdp_whole": "hfsdp"}


def _letter(p):
    """R, F, P or W of a placement given by letter or name (any case)."""
    p = str(p).strip()
    for k, v in PLACE.items():
        if p.upper() == k or p.lower() == v.lower():
            return k
    raise ValueError("placement %r: one of %s (or the letters %s)"
                     % (p, ", ".join(PLACE.values()), "/".join(PLACE)))


def _whole(places):
    """A role's placements with its Flat axes on Whole (the role's tensors entire
    on one owner, docs/semantics.md §1)."""
    return ["W" if _letter(p) == "F" else p for p in places]


def _node_whole(places, outer):
    """A role's placements with its owners inside the innermost axis: that
    axis Whole when it is Flat or Whole, the outer Flat or Whole axes `outer`
    (Replicate for main_weight, Partial for grad: every node holds, and
    reduces into, its own owner's copy)."""
    letters = [_letter(p) for p in places]
    if letters[-1] not in ("F", "W"):
        return letters          # no split axis (the Flat axes are a suffix)
    return [outer if x in ("F", "W") else x for x in letters[:-1]] + ["W"]


def _check_roles(name, roles):
    """ValueError for what the compiler refuses too: Whole on weight (it is
    gathered whole for compute), Whole beside Flat in one placement."""
    for role in ("weight", "grad", "main_weight"):
        letters = [_letter(p) for p in roles[role][1]]
        if role == "weight" and "W" in letters:
            raise ValueError("layout %s: weight [%s]: only grad and main_weight may be Whole (the "
                             "weight is all-gathered for compute); put Whole on grad and/or "
                             "main_weight and keep weight Flat or Replicate"
                             % (name, ", ".join(PLACE[x] for x in letters)))
        if "W" in letters and "F" in letters:
            raise ValueError("layout %s: %s [%s] mixes Whole and Flat: a placement's split axes "
                             "are all Whole or all Flat"
                             % (name, role, ", ".join(PLACE[x] for x in letters)))
    ds = [set(j for j, p in enumerate(roles[r][1]) if _letter(p) == "D")
          for r in ("weight", "grad", "main_weight")]
    if not ds[0] == ds[1] == ds[2]:
        raise ValueError("layout %s: Distinct on an axis in some roles only (weight %s, grad %s, "
                         "main_weight %s): a Distinct axis is Distinct in all three roles"
                         % (name, sorted(ds[0]), sorted(ds[1]), sorted(ds[2])))


def layout_block(name: str, naxes: int, dtype: str = "fp32", grad_dtype: str = "fp32") -> str:
    """The text of a named layout block."""
    return _block(name, _named_roles(name, naxes, dtype, grad_dtype))


def _named_roles(name, naxes, dtype, grad_dtype):
    w, g, m = _layout_roles(name, naxes)
    return {"weight": (dtype, w), "grad": (grad_dtype, g), "main_weight": ("fp32", m)}


def _block(name, roles):
    _check_roles(name, roles)
    lines = ["layout %s {" % name]
    for role in ("weight", "grad", "main_weight"):
        dt, places = roles[role]
        places = [PLACE[_letter(p)] for p in places]
        lines.append("  %-11s %s [%s];" % (role, dt, ", ".join(places)))
    lines.append("}")
    return "\n".join(lines)


def _unit_modules(model, units):
    """[(name, module)] of the units, in order."""
    if units is not None:
        out = []
        for n in units:
            try:
                mod = model.get_submodule(n)
            except AttributeError:
                raise ValueError("unit %r is not a submodule of the model" % n) from None
            if isinstance(mod, (torch.nn.ModuleList, torch.nn.ModuleDict)):
                raise ValueError("unit %r is a %s, which has no forward to hook: name its "
                                 "children (%r, ...)" % (n, type(mod).__name__, n + ".0"))
            out.append((n, mod))
        return out
    return default_units(model)


def _has_params(mod):
    return any(True for _ in mod.parameters())


def _holds_blocks(mod, no_split):
    """Whether a ModuleList/ModuleDict with parameters, or a module of a
    class named in no_split, lies below `mod` (then `mod` is opened up)."""
    for sub in mod.modules():
        if sub is mod:
            continue
        if type(sub).__name__ in no_split:
            return True
        if isinstance(sub, (torch.nn.ModuleList, torch.nn.ModuleDict)) and _has_params(sub):
            return True
    return False


def default_units(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    """[(name, module)] of the default units, in registration order: per
    block, as FSDP2 users wrap them. A module whose class the model names in
    `_no_split_modules` (Hugging Face's decoder layers) is a unit; the
    elements of a ModuleList/ModuleDict are units; a child that holds either
    below it (LlamaForCausalLM's `model`) is opened up and its own children
    follow the same rules; every other child that owns parameters is a unit."""
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    out = []

    def visit(prefix, mod, in_list):
        for n, child in mod.named_children():
            full = prefix + n
            if not _has_params(child):
                continue
            if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
                visit(full + ".", child, True)
            elif type(child).__name__ in no_split:
                out.append((full, child))
            elif not in_list and _holds_blocks(child, no_split) and \
                    not any(True for _ in child.parameters(recurse=False)):
                visit(full + ".", child, False)
            else:
                out.append((full, child))
    visit("", model, False)
    return out


def plan_units(model: torch.nn.Module, units: Optional[Sequence[str]] = None) -> Plan:
    """[(unit name, module, [(tensor name, parameter)])], every parameter in
    exactly one unit (the first that reaches it), units without parameters of
    their own dropped. Raises ValueError naming uncovered parameters."""
    seen = set()
    plan = []
    for name, mod in _unit_modules(model, units):
        tensors = []
        for pname, p in mod.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            tensors.append((pname, p))
        if tensors:
            plan.append((name, mod, tensors))
    missing = [n for n, p in model.named_parameters() if id(p) not in seen]
    if missing:
        raise ValueError("parameters not covered by any unit: %s (give units= explicitly)"
                         % ", ".join(missing))
    return plan


def tied_parameters(model: torch.nn.Module) -> Set[int]:
    """ids of parameters reachable under more than one name."""
    count = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        count[id(p)] = count.get(id(p), 0) + 1
    return {i for i, c in count.items() if c > 1}


def _module_of(model, getter):
    """model.<getter>() (Hugging Face's get_input_embeddings /
    get_output_embeddings) when the model has it and it returns a module,
    else None."""
    fn = getattr(model, getter, None)
    if not callable(fn):
        return None
    try:
        mod = fn()
    except NotImplementedError:       # a Hugging Face model that has no such module
        return None
    return mod if isinstance(mod, torch.nn.Module) else None


def _vocab(model):
    """The input embedding's num_embeddings: model.get_input_embeddings()
    when it is an embedding, else the first nn.Embedding / EmbeddingBag in
    model.modules() order; None without one."""
    emb = _module_of(model, "get_input_embeddings")
    if not isinstance(emb, EMBEDDINGS):
        emb = next((m for m in model.modules() if isinstance(m, EMBEDDINGS)), None)
    return emb.num_embeddings if emb is not None else None


def hidden_matrices(model: torch.nn.Module) -> List[str]:
    """Qualified names of the model's hidden matrices, matrix_optimizer="whole"'s
    share (the Muon recipe), in model.named_parameters() order: every 2-D
    parameter except those held by
      - an nn.Embedding or nn.EmbeddingBag (so also a weight tied to one),
      - the output head: the module model.get_output_embeddings() returns
        (Hugging Face), and every nn.Linear outside the blocks (not below a
        ModuleList or ModuleDict) whose out_features is the input embedding's
        num_embeddings (the vocabulary: _vocab).
    The vocabulary is the input embedding's only (get_input_embeddings(), else
    the first embedding registered), not any embedding's: a learned position
    table of 1024 rows would otherwise exclude every Linear(d, 1024) of a
    d = 1024 model; and a block's Linear is never the head, so a toy model
    whose width is its vocabulary keeps its hidden Linear(d, d). A parameter
    is judged by every module that holds it."""
    head = _module_of(model, "get_output_embeddings")
    vocab = _vocab(model)
    in_blocks = {id(sub) for mod in model.modules()
                 if isinstance(mod, (torch.nn.ModuleList, torch.nn.ModuleDict))
                 for sub in mod.modules()}
    excluded = set()
    for mod in model.modules():
        if isinstance(mod, EMBEDDINGS) or mod is head or (
                isinstance(mod, torch.nn.Linear) and mod.out_features == vocab
                and id(mod) not in in_blocks):
            excluded.update(id(p) for p in mod.parameters(recurse=False))
    return [n for n, p in model.named_parameters() if p.dim() == 2 and id(p) not in excluded]


class _ParameterReads(TorchFunctionMode):
    """Calls on_read(parameter) for every parameter a torch function reads."""

    def __init__(self, on_read):
        super().__init__()
        self.on_read = on_read

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tensors_in([args, kwargs]):
            if isinstance(t, torch.nn.Parameter):
                self.on_read(t)
        return func(*args, **kwargs)


def used_ties(model: torch.nn.Module, plan: Plan, example: Any) -> Set[int]:
    """ids of parameters that the forward of `model` on `example` (a tuple of
    positional arguments, a dict of keywords, or one tensor) reads outside
    their own unit: while another unit runs, or between units. The forward
    runs once under torch.no_grad(); the buffers and the random number
    generators (dropout draws from them) are restored after it.
    Raises ValueError when such a parameter is read before its own unit's
    forward began (mfsdp gathers a tied weight in its unit's forward_pre)."""
    owner = {id(p): (uname, n) for uname, _, tensors in plan for n, p in tensors}
    running = []         # unit names, innermost last
    started = set()
    ties = set()

    def on_read(p):
        if id(p) not in owner:
            return
        own, tname = owner[id(p)]
        where = running[-1] if running else None
        if where == own:
            return
        if own not in started:
            raise ValueError(
                "parameter %r (unit %r) is read %s before its own unit runs: a weight read "
                "outside its unit must belong to a unit that runs before every reader (give "
                "units= so that %r comes first, or put the readers in that unit)"
                % (own + "." + tname, own, "by unit %r" % where if where else "outside every unit",
                   own))
        ties.add(id(p))

    def enter(uname):
        def hook(module, args):
            running.append(uname)
            started.add(uname)
        return hook

    def leave(module, args, output):
        running.pop()

    handles = []
    for uname, mod, _ in plan:
        handles.append(mod.register_forward_pre_hook(enter(uname)))
        handles.append(mod.register_forward_hook(leave))
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    args, kwargs = (example, {}) if isinstance(example, tuple) else \
        ((), example) if isinstance(example, dict) else ((example,), {})
    try:
        with torch.no_grad(), torch.random.fork_rng(), _ParameterReads(on_read):
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return ties


def declared_ties(model: torch.nn.Module, names: Union[str, Iterable[str]]) -> Set[int]:
    """ids of the parameters named in `names` (any of their qualified names);
    ValueError listing the names the model does not have."""
    names = [names] if isinstance(names, str) else list(names)
    by_name = dict(model.named_parameters(remove_duplicate=False))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError("ties= names %s, which %s not a parameter of the model"
                         % (", ".join(map(repr, unknown)), "is" if len(unknown) == 1 else "are"))
    return {id(by_name[n]) for n in names}


def _q(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spec_from_module(model: torch.nn.Module, mesh: Mapping[str, int], layout: Layout = "hfsdp",
                     units: Optional[Sequence[str]] = None, microbatches: int = 1,
                     dtype: str = "fp32", grad_dtype: str = "fp32", reduce: str = "avg",
                     overrides: Optional[Mapping[str, Layout]] = None,
                     prefetch: Optional[int] = None,
                     reshard_last: bool = False, example: Any = None,
                     ties: Union[str, Iterable[str]] = (),
                     reshard_after_forward: Reshard = None,
                     matrix_optimizer: Optional[str] = None,
                     whole_owners: str = "mesh",
                     distinct: Optional[Mapping[str, str]] = None,
                     global_names: Optional[Mapping[str, Any]] = None) -> str:
    """The .mfsdp text of `model` on `mesh` ({axis: size}, outermost first).

    layout      a name (ddp, zero1, zero2, zero3, hsdp, hsdp_nosync, hfsdp,
                fsdp2d; zero3_whole, hsdp_whole, hfsdp_whole) or a dict
                {"name": N, "weight": (dtype, [placements]), "grad": ...,
                "main_weight": ...} with placements "Replicate", "Flat",
                "Partial", "Whole" (or R/F/P/W; Whole on grad and main_weight
                only), outermost axis first
    units       module names (default: the children that own parameters)
    dtype       the compute weight's dtype (fp32, bf16, fp16)
    overrides   {fnmatch pattern on the full tensor name: layout}, e.g.
                {"*.ln_*": "replicated"}; a layout is a name or a dict as above
    reshard_last  when False, the last unit keeps its weights unsharded from
                forward to backward (`reshard_after_forward false`)
    reshard_after_forward  None (the rule of reshard_last), True or False
                for every unit, or {unit name or fnmatch pattern on unit
                names: bool} (the last matching pattern wins; units that
                no pattern matches follow reshard_last's rule); a pattern
                that matches no unit is a ValueError
    example     a microbatch (tuple of arguments, dict of keywords, or one
                tensor): the forward runs once on it, under torch.no_grad(),
                to find the parameters read outside their own unit (tied by
                use, e.g. F.linear(h, self.tok.weight) in a head)
    ties        parameter names read outside their own unit, declared
                (instead of, or besides, `example`)
    matrix_optimizer  None; "whole": the hidden matrices (hidden_matrices:
                every 2-D parameter but an nn.Embedding's / EmbeddingBag's,
                one tied to it, and the output head's: the module
                get_output_embeddings() returns, an nn.Linear outside the
                ModuleLists whose out_features is the input embedding's
                num_embeddings) get their layout's Whole variant
                (`<layout>_whole`: grad and main_weight Whole on their Flat
                axes, so each matrix is entire on one owner for a matrix
                optimizer such as Muon); "whole_all": every 2-D tensor does
                (the embeddings and the head included). 1-D
                tensors and tensors that `overrides` names keep their layout:
                an override to a plain layout takes one matrix out, one to a
                `_whole` layout puts one in
    whole_owners  "mesh" (default): a Whole tensor's owner is one rank of the
                mesh (Whole on every Flat axis); "node": one rank of each
                innermost-axis group (`<layout>_whole_node` where it differs:
                main_weight Whole on the innermost axis and Replicate on the
                outer ones, grad Partial on them), so the matrix optimizer's
                traffic stays inside a node and every node steps its own copy.
                On a 1-D mesh the innermost axis is the mesh: "node" is "mesh"
    distinct    {fnmatch pattern on the parameter's full name (as
                model.named_parameters() names it): mesh axis}: the matching
                parameters are Distinct on that axis in weight, grad and
                main_weight (each coordinate holds its own tensor: a TP shard,
                an expert set; no collective runs on that axis for them), their
                other axes as their layout says; a parameter matched by patterns
                of several axes is Distinct on each. The axis must lie outside
                every axis the layout splits (Flat/Whole): with layout "hfsdp"
                or "fsdp2d" on {"ep": 2, "dp": 2} put ep first. An unknown axis
                or a pattern that matches nothing is a ValueError
    global_names  {fnmatch pattern on the parameter's full name: the whole
                model's name of the matching Distinct parameters} (naming.py;
                the spec's `global` clause): a template string of the full
                global name with {expr} over the Distinct axes, e.g.
                "moe.experts.{2*ep+1}.w1.weight"; split(D) or (axis, D) for a
                slice along dim D; or a callable of the full name giving one
                (expert_names("moe.experts.{}", 2, "ep")). Needed by the
                whole-model state dicts and DCP of Distinct tensors
    """
    _check_spec_args(mesh, dtype, grad_dtype, matrix_optimizer, whole_owners)
    naxes = len(mesh)
    lays = _Layouts(naxes, dtype, grad_dtype, list(mesh), distinct_axes(model, mesh, distinct))
    lays.globals = naming.resolve([n for n, _ in model.named_parameters()], lays.distinct,
                                  global_names)
    base = lays.declare(layout)
    plan = plan_units(model, units)
    tied = tied_parameters(model) | declared_ties(model, ties)
    if example is not None:
        tied |= used_ties(model, plan, example)
    over = [(pat, lays.declare(lay)) for pat, lay in (overrides or {}).items()]
    tied_name = lays.declare_tied(layout, base) if tied else None
    rows = _unit_rows(plan, lays, (base, over, tied, tied_name),
                      _whole_ids(model, matrix_optimizer), whole_owners)
    reshard = unit_reshard([r[0] for r in rows], reshard_after_forward, reshard_last)
    head = ["# generated by mfsdp.torch.spec_from_module (%s, %d units)" % (
        type(model).__name__, len(rows)),
        "mesh %s;" % ", ".join("%s = %d" % (k, v) for k, v in mesh.items()),
        "microbatches %d;" % microbatches, "reduce %s;" % reduce]
    if prefetch:
        head.append("prefetch %d;" % prefetch)
    blocks = [line for b in lays.blocks.values() for line in (b, "")]
    return "\n".join(head + [""] + blocks + _units_text(rows, base, reshard)) + "\n"


def _whole_ids(model, matrix_optimizer):
    """ids of the parameters matrix_optimizer puts on their layout's Whole
    variant: the hidden matrices ("whole") or every 2-D one ("whole_all")."""
    if matrix_optimizer is None:
        return set()
    names = set(hidden_matrices(model)) if matrix_optimizer == "whole" else None
    return {id(p) for n, p in model.named_parameters()
            if p.dim() == 2 and (names is None or n in names)}


def _check_spec_args(mesh, dtype, grad_dtype, matrix_optimizer, whole_owners):
    """spec_from_module's arguments that need no model: ValueError naming the fix."""
    if not mesh:
        raise ValueError("mesh must name at least one axis, e.g. {'dp': 4}")
    if dtype not in DTYPES or grad_dtype not in DTYPES:
        raise ValueError("dtype and grad_dtype are fp32, bf16 or fp16")
    if matrix_optimizer not in MATRIX_OPTIMIZERS:
        raise ValueError("matrix_optimizer=%r: one of None (every tensor as its layout says), "
                         "'whole' (the hidden matrices' grad and main_weight Whole, the Muon "
                         "recipe: not the embeddings nor the output head) or 'whole_all' (every "
                         "2-D tensor's)" % (matrix_optimizer,))
    if whole_owners not in WHOLE_OWNERS:
        raise ValueError("whole_owners=%r: 'mesh' (a Whole tensor's owner is one rank of the "
                         "mesh) or 'node' (one rank of each innermost-axis group, the outer "
                         "axes replicated)" % (whole_owners,))
    if whole_owners != "mesh" and matrix_optimizer is None:
        raise ValueError("whole_owners=%r places matrix_optimizer's Whole tensors, and "
                         "matrix_optimizer is None: give matrix_optimizer='whole' (or "
                         "'whole_all'), or leave whole_owners out" % (whole_owners,))


class _Layouts:
    """The layout blocks of one spec, in the order they are declared (the
    order of the text): `blocks` {name: block text}, `roles_of` {name: its
    roles}, for the Whole variants."""

    def __init__(self, naxes, dtype, grad_dtype, mesh_names=(), distinct=None):
        self.naxes, self.dtype, self.grad_dtype = naxes, dtype, grad_dtype
        self.mesh_names = list(mesh_names)
        self.distinct = distinct or {}     # {parameter name: [axes]} (distinct_axes)
        self.globals = {}                  # {parameter name: (template, split D)} (naming)
        self.blocks = {}
        self.roles_of = {}

    def declare(self, lay):
        """The name of layout `lay` (a name or a dict), its block declared."""
        blocks, roles_of = self.blocks, self.roles_of
        if isinstance(lay, str):
            if lay not in blocks:
                if lay in LAYOUT_NAMES or lay in WHOLE_LAYOUTS or lay == "replicated":
                    roles_of[lay] = _named_roles(lay, self.naxes, self.dtype, self.grad_dtype)
                    blocks[lay] = _block(lay, roles_of[lay])
                else:
                    raise ValueError("unknown layout %r: use one of %s, replicated, or a dict"
                                     % (lay, ", ".join(LAYOUT_NAMES + tuple(WHOLE_LAYOUTS))))
            return lay
        name = lay.get("name", "custom")
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ValueError("layout name %r is not an identifier" % name)
        blocks[name] = _block(name, lay)
        roles_of[name] = lay
        return name

    def declare_tied(self, layout, base):
        """The `tied` layout (the base layout with its weight Replicate on
        every axis) declared, its name; None when the base weight is
        replicated already."""
        naxes = self.naxes
        if all(_letter(p) == "R" for p in self.roles_of[base]["weight"][1]):
            return None
        w, g, m = ((["R"] * naxes), *_layout_roles(base, naxes)[1:]) if isinstance(layout, str) \
            else (["R"] * naxes, layout["grad"][1], layout["main_weight"][1])
        gd = self.grad_dtype if isinstance(layout, str) else layout["grad"][0]
        self.roles_of["tied"] = {"weight": (self.dtype, w), "grad": (gd, g),
                                 "main_weight": ("fp32", m)}
        self.blocks["tied"] = _block("tied", self.roles_of["tied"])
        return "tied"

    def distinct_of(self, name, axes, tensor):
        """The variant of declared layout `name` Distinct on `axes` (mesh axis
        names) in all three roles, `<name>_d_<axis>...`, declared; ValueError
        when a Flat or Whole axis of the layout lies outside a Distinct one
        (the suffix rule counts Distinct as Replicate)."""
        idx = sorted(self.mesh_names.index(a) for a in axes)
        dname = name + "".join("_d_" + self.mesh_names[j] for j in idx)
        if dname in self.blocks:
            return dname
        r = self.roles_of[name]
        roles = {}
        for role in ("weight", "grad", "main_weight"):
            letters = [_letter(p) for p in r[role][1]]
            for j in idx:
                outer = [i for i in range(j) if letters[i] in ("F", "W")]
                if outer:
                    order = [self.mesh_names[j]] + [a for a in self.mesh_names
                                                    if a != self.mesh_names[j]]
                    raise ValueError(
                        "distinct axis %r of %r lies inside axis %r, which layout %s splits "
                        "(%s %s [%s]): the split (Flat) axes are the innermost ones and a "
                        "Distinct axis counts as Replicate; put %r outermost in the mesh "
                        "(mesh={%s}), or give %r a layout that does not split %r"
                        % (self.mesh_names[j], tensor, self.mesh_names[outer[0]], name, role,
                           r[role][0], ", ".join(PLACE[x] for x in letters),
                           self.mesh_names[j], ", ".join("%r: ..." % a for a in order),
                           tensor, self.mesh_names[outer[0]]))
                letters[j] = "D"
            roles[role] = (r[role][0], letters)
        self.roles_of[dname] = roles
        self.blocks[dname] = _block(dname, roles)
        return dname

    def whole_of(self, name, owners="mesh"):
        """The Whole variant of a declared layout for `owners` (WHOLE_OWNERS):
        `<name>_whole` (grad and main_weight Whole on their Flat axes), or
        with "node" `<name>_whole_node` (_node_whole) unless that places them
        as `<name>_whole` does; itself when neither placement changes."""
        r = self.roles_of[name]
        g, m = [_letter(p) for p in r["grad"][1]], [_letter(p) for p in r["main_weight"][1]]
        w = [_letter(p) for p in r["weight"][1]]
        mesh = (_whole(g), _whole(m))
        want = (_node_whole(g, "P"), _node_whole(m, "R")) if owners == "node" else mesh
        if want == (g, m):
            return name
        wname = name + ("_whole" if want == mesh else "_whole_node")
        if wname not in self.blocks:
            # a whole bucket's shards follow its owners (ragged shards,
            # docs/semantics.md §4.6): with the owners inside the innermost axis the weight may not
            # split the outer axes either (zero3's [Flat, Flat] becomes [Replicate, Flat])
            wt = _node_whole(w, "R") if owners == "node" and w[-1] == "F" else w
            wt = [("F" if x == "W" else x) for x in wt]
            self.roles_of[wname] = dict(r, weight=(r["weight"][0], wt), grad=(r["grad"][0], want[0]),
                                        main_weight=(r["main_weight"][0], want[1]))
            self.blocks[wname] = _block(wname, self.roles_of[wname])
        return wname


def distinct_axes(model: torch.nn.Module, mesh: Mapping[str, int],
                  distinct: Optional[Mapping[str, str]]) -> Dict[str, List[str]]:
    """{parameter name: [mesh axes]} of spec_from_module's `distinct`
    ({fnmatch pattern on the parameter's full name, as model.named_parameters()
    gives it: axis}), every name of a tied parameter included. ValueError for
    an axis the mesh lacks or a pattern that matches no parameter."""
    out: Dict[str, List[str]] = {}
    if not distinct:
        return out
    if not isinstance(distinct, Mapping):
        raise ValueError("distinct=%r: give {parameter name pattern: mesh axis}, e.g. "
                         "{'layers.*.experts.*': 'ep'}" % (distinct,))
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    for pat, axis in distinct.items():
        if axis not in mesh:
            raise ValueError("distinct={%r: %r}: %r is not an axis of the mesh (its axes are %s)"
                             % (pat, axis, axis, ", ".join(mesh)))
        hit = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hit:
            raise ValueError("distinct={%r: %r}: the pattern matches no parameter of the model "
                             "(patterns match full parameter names such as %r)"
                             % (pat, axis, names[0] if names else "layers.0.w"))
        for n in hit:
            if axis not in out.setdefault(n, []):
                out[n].append(axis)
    return out


def _unit_rows(plan, lays, layouts, whole, owners):
    """[(unit name, [(tensor, shape, layout or None: the base)])]: the last
    override matching a tensor's full name, else `tied_name` for a tied
    parameter; a parameter in `whole` (ids) that no override names takes its
    layout's Whole variant for `owners`. layouts: (base, [(pattern, layout)],
    tied ids, tied_name)."""
    base, over, tied, tied_name = layouts
    rows = []
    for uname, _, tensors in plan:
        items = []
        for tname, p in tensors:
            full = uname + "." + tname
            lay = None
            for pat, ln in over:
                if fnmatch.fnmatchcase(full, pat):
                    lay = ln
            overridden = lay is not None
            if lay is None and id(p) in tied and tied_name:
                lay = tied_name
            if not overridden and id(p) in whole:
                lay = lays.whole_of(lay or base, owners)
                lay = None if lay == base else lay
            if full in lays.distinct:
                lay = lays.distinct_of(lay or base, lays.distinct[full], full)
            g = lays.globals.get(full)
            items.append((tname, tuple(p.shape), lay, naming.clause(uname, full, g) if g else ""))
        rows.append((uname, items))
    return rows


def unit_reshard(names: Sequence[str], reshard_after_forward: Reshard,
                 reshard_last: bool = False) -> List[bool]:
    """reshard_after_forward of each unit (names in order): by default every
    unit but the last (unless reshard_last); a bool for every unit; a dict
    {unit name or fnmatch pattern: bool}, the last matching pattern winning
    over the default. ValueError for a value that is not a bool or a
    pattern that matches no unit."""
    out = [True] * len(names)
    if names and not reshard_last:
        out[-1] = False
    if reshard_after_forward is None:
        return out
    if isinstance(reshard_after_forward, bool):
        return [reshard_after_forward] * len(names)
    if not isinstance(reshard_after_forward, Mapping):
        raise ValueError("reshard_after_forward is None, True, False or {unit pattern: bool}, "
                         "not %r" % (reshard_after_forward,))
    for pat, value in reshard_after_forward.items():
        if not isinstance(value, bool):
            raise ValueError("reshard_after_forward[%r] is %r: each value is True or False"
                             % (pat, value))
        hit = [u for u, n in enumerate(names) if fnmatch.fnmatchcase(n, pat)]
        if not hit:
            raise ValueError("reshard_after_forward names %r, which matches no unit (the units "
                             "are %s)" % (pat, ", ".join(names)))
        for u in hit:
            out[u] = value
    return out


def _units_text(rows, base, reshard):
    """Unit declarations, with loops over runs of `prefix.N` units whose
    tensors and reshard_after_forward match."""
    out = []
    i = 0
    last = len(rows) - 1
    while i < len(rows):
        name, items = rows[i]
        m = re.match(r"^(.*\.)(\d+)$", name)
        j = i
        if m:
            k = int(m.group(2))
            while (j + 1 < len(rows) and j + 1 != last and rows[j + 1][1] == items
                   and reshard[j + 1] == reshard[i]
                   and rows[j + 1][0] == "%s%d" % (m.group(1), k + (j + 1 - i))):
                j += 1
        if j > i and i != last:
            out.append('unit %s for i in %d..%d layout %s {' % (
                _q(m.group(1) + "{i}"), int(m.group(2)), int(m.group(2)) + (j - i + 1), base))
        else:
            j = i
            out.append("unit %s layout %s {" % (_q(name), base))
        if not reshard[i]:
            out.append("  reshard_after_forward false;")
        for tname, shape, lay, glob in items:
            tail = (" layout %s" % lay if lay else "") + glob
            out.append("  tensor %s [%s]%s;" % (_q(tname), ", ".join(map(str, shape)), tail))
        out.append("}")
        i = j + 1
    return out
