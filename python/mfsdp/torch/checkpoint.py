"""
checkpoint: ShardedModel.save_checkpoint / load_checkpoint, a sharded
checkpoint of the model's master weights and of a torch optimizer over
main_parameters() (docs/pytorch.md, "Checkpoints"; docs/checkpoint.md).

The optimizer's per-parameter state splits in two:
  - tensors shaped like the parameter (Adam's exp_avg, exp_avg_sq, SGD's and
    Muon's momentum_buffer) are optimizer states of the checkpoint, laid out
    like main_weight, named by their state key: every rank saves and loads
    only its shards, on any mesh (a Whole main weight's full-shape state is
    its owner's shard, flattened);
  - everything else per parameter (Adam's `step`, a 0-d tensor) must be the
    same for every parameter (it is for torch's elementwise optimizers,
    which step every parameter together) and is stored once, with the param
    groups' hyper-parameters that are plain numbers, strings, booleans or
    lists of them (lr changed by a scheduler), in the rank's user blob as
    JSON, next to the caller's own blob (bytes, kept exactly).
Loading fills optimizer.state for each master parameter of the loading
runtime (whatever its shard) and the param groups' hyper-parameters.

Several optimizers (optimizer=[muon, adamw]: a list or tuple, each over its
own main parameters, together over some or all) are saved together: a state
key is one state of the checkpoint over every tensor (the format's rule),
holding each tensor's value from the optimizer that steps it and zeros for
tensors whose optimizer has no such key. Before writing, the ranks agree
(Runtime.allreduce) on which optimizer and group steps each tensor and on
each optimizer's state keys and scalars, so every rank's blob holds the
global picture under "optimizers" (a list: class, param_groups, members,
keys, scalars), whatever tensors that rank holds; a load checks the list it
is given against it on every rank before anything is read. One optimizer
(or a list of one) is saved exactly as before, under "optimizer".

Distinct tensors (fully_shard distinct=) need nothing here: the runtime's
checkpoint writes each under its global name (global_names=: a renamed
tensor per coordinate, or the split form's whole tensor, each coordinate its
slice), and the optimizer states follow main_weight's pieces, so this
module keys states by the local tensor names as for any tensor;
ShardedModel.save_checkpoint refuses a Distinct tensor without global names.
"""
from __future__ import annotations

import base64
import json
import os
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import checkpoint as _ck
from .._lib import UsageError
from .tensors import DTYPE_NAMES, TORCH_DTYPES

if TYPE_CHECKING:
    from .shard import ShardedModel

FORMAT = "mfsdp.torch-checkpoint/1"

# optimizer=: one torch optimizer, or a list or tuple of them (each over its own
# main parameters)
Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]


def _plain(x):
    if isinstance(x, (bool, int, float, str)) or x is None:
        return True
    return isinstance(x, (list, tuple)) and all(_plain(y) for y in x)


def _scalar(v):
    """A JSON description of a per-parameter scalar state value."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.dim() != 0:
            return None
        return {"tensor": str(v.dtype).replace("torch.", ""), "value": v.item()}
    if isinstance(v, (bool, int, float)):
        return {"value": v}
    return None


def _split_state(mains, optimizer):
    """({state key: {tensor name: shard}}, {key: scalar}) of the optimizer
    over mains, [(tensor name, main parameter)]."""
    sharded, scalars, first = {}, None, None
    for name, mp in mains:
        st = optimizer.state.get(mp)
        if not st:
            if first is not None:
                raise UsageError("save_checkpoint: %r has no optimizer state but %r has "
                                 "(save before the first optimizer.step(), or after it)"
                                 % (name, first))
            continue
        mine = {}
        for key, v in st.items():
            if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(mp.shape):
                if v.dtype not in DTYPE_NAMES or v.device.type != "cpu":
                    raise UsageError("save_checkpoint: optimizer state %r of %r is a %s %s tensor "
                                     "(fp32, bf16 or fp16 on the CPU)" % (key, name, v.device.type,
                                                                          v.dtype))
                sharded.setdefault(key, {})[name] = v.detach().reshape(-1).contiguous()
            else:
                d = _scalar(v)
                if d is None:
                    raise UsageError("save_checkpoint: optimizer state %r of %r is neither shaped "
                                     "like the parameter nor a scalar" % (key, name))
                mine[key] = d
        if scalars is None:
            scalars, first = mine, name
        elif mine != scalars:
            raise UsageError("save_checkpoint: the scalar optimizer state of %r (%r) differs from "
                             "that of %r (%r); only a state shared by every parameter is saved"
                             % (name, mine, first, scalars))
        if set(sharded) and any(name not in sharded[k] for k in sharded):
            raise UsageError("save_checkpoint: %r lacks some of the optimizer states %s"
                             % (name, sorted(sharded)))
    return sharded, scalars


def _blob(optimizer, scalars, user_blob):
    doc = {"format": FORMAT, "user": None, "optimizer": None}
    if user_blob is not None:
        doc["user"] = base64.b64encode(bytes(user_blob)).decode("ascii")
    if optimizer is not None:
        groups = [{k: v for k, v in g.items() if k != "params" and _plain(v)}
                  for g in optimizer.param_groups]
        doc["optimizer"] = {"class": type(optimizer).__name__, "scalars": scalars,
                            "param_groups": groups,
                            "members": [[getattr(p, "full_name", None) for p in g["params"]]
                                        for g in optimizer.param_groups]}   # this rank's
    return json.dumps(doc, sort_keys=True).encode("utf-8")


def save(sm: ShardedModel, path: str, optimizer: Optional[Optimizers] = None,
         step: Optional[int] = None, user_blob: Optional[bytes] = None) -> None:
    """See ShardedModel.save_checkpoint."""
    sm._between_steps("save_checkpoint")
    opts = optimizers_of(optimizer, "save_checkpoint")
    if opts is not None and len(opts) > 1:
        _save_several(sm, path, opts, step, user_blob)
        return
    optimizer = opts[0] if opts else None
    states, scalars = _split_state([(n, mp) for n, mp, _, _ in sm._main], optimizer) \
        if optimizer is not None else ({}, None)
    blob = _blob(optimizer, scalars, user_blob)
    sm.runtime.save_checkpoint(path, sm.steps if step is None else step, states, blob)


def _parse_blob(data, path):
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError("format")
        user = doc.get("user")
        return doc, None if user is None else base64.b64decode(user)
    except (ValueError, UnicodeDecodeError, TypeError) as e:
        raise UsageError("load_checkpoint: the user blob in %s was not written by "
                         "mfsdp.torch's save_checkpoint (%s); load it with "
                         "Runtime.load_checkpoint" % (path, e))


def _restore_optimizer(sm, optimizer, doc, states, path, check=False):
    """Restores optimizer from doc's state, or with check only refuses a doc
    of several optimizers."""
    opt = doc.get("optimizer")
    if opt is None and doc.get("optimizers"):
        raise UsageError("load_checkpoint: %s holds the state of %d optimizers (%s): pass "
                         "optimizer= a list of the same classes in the same order"
                         % (path, len(doc["optimizers"]), _classes(doc["optimizers"])))
    if check:
        return
    if opt is None:
        raise UsageError("load_checkpoint: %s holds no optimizer state (saved without "
                         "optimizer=)" % path)
    if opt.get("class") != type(optimizer).__name__ or \
            len(opt.get("param_groups", [])) != len(optimizer.param_groups):
        raise UsageError("load_checkpoint: %s holds the state of a %s with %d param groups, "
                         "not of this %s with %d" % (path, opt.get("class"),
                                                     len(opt.get("param_groups", [])),
                                                     type(optimizer).__name__,
                                                     len(optimizer.param_groups)))
    for g, saved in zip(optimizer.param_groups, opt["param_groups"]):
        for k, v in saved.items():
            g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
    scalars = opt.get("scalars")
    for name, mp, _, _ in sm._main:
        st = {}
        for key, shards in states.items():
            st[key] = torch.from_numpy(shards[name]).view(mp.shape)
        for key, d in (scalars or {}).items():
            st[key] = torch.tensor(d["value"], dtype=getattr(torch, d["tensor"])) \
                if "tensor" in d else d["value"]
        if st:
            optimizer.state[mp] = st


def load(sm: ShardedModel, path: str, optimizer: Optional[Optimizers] = None,
         user_blob_rank: Optional[int] = None,
         verify_files: bool = False) -> Tuple[int, Optional[bytes]]:
    """See ShardedModel.load_checkpoint."""
    sm._between_steps("load_checkpoint")
    opts = optimizers_of(optimizer, "load_checkpoint")
    if opts is not None and len(opts) > 1:
        return _load_several(sm, path, opts, user_blob_rank, verify_files)
    optimizer = opts[0] if opts else None
    manifest = _ck.read_manifest(path) or {}
    if optimizer is not None and manifest:     # several optimizers' file: refused before the load
        data = _blob_of(path, manifest, sm.runtime.rank if user_blob_rank is None
                        else int(user_blob_rank))
        if data is not None:
            _restore_optimizer(sm, optimizer, _parse_blob(data, path)[0], None, path, check=True)
    names = [s.get("name") for s in manifest.get("states", [])[1:] if isinstance(s, dict)]
    loaded = sm.runtime.load_checkpoint(path, names if optimizer is not None else None,
                                        user_blob_rank, verify_files)
    doc, user = {"optimizer": None}, None
    if loaded.user_blob is not None:
        doc, user = _parse_blob(loaded.user_blob, path)
    elif optimizer is not None:
        raise UsageError("load_checkpoint: rank %d saved no user blob in %s (the checkpoint has "
                         "%s ranks): pass user_blob_rank= a rank that did, e.g. 0"
                         % (sm.runtime.rank if user_blob_rank is None else user_blob_rank, path,
                            manifest.get("world", "?")))
    if optimizer is not None:
        _restore_optimizer(sm, optimizer, doc, loaded.states, path)
    sm.steps = loaded.step
    return loaded.step, user


# ---- several optimizers (optimizer=[muon, adamw]) ----

_BIG = float(1 << 40)      # "no rank" in a max-allreduce of negated ranks
_GROUPS = 1 << 16          # code of (optimizer i, group g): i * _GROUPS + g + 1; 0: none


def optimizers_of(optimizer: Optional[Optimizers],
                  what: str) -> Optional[List[torch.optim.Optimizer]]:
    """The optimizers of an optimizer= argument (one, or a list or tuple of
    them) as a list; None for None."""
    if optimizer is None:
        return None
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if not opts:
        raise UsageError("%s: optimizer= is an empty %s (give None for no optimizer state)"
                         % (what, type(optimizer).__name__))
    for i, o in enumerate(opts):
        if not isinstance(o, torch.optim.Optimizer):
            raise UsageError("%s: optimizer %d is a %s, not a torch.optim.Optimizer"
                             % (what, i, type(o).__name__))
    return opts


def _name(opts, i):
    return "optimizer %d (%s)" % (i, type(opts[i]).__name__)


def _classes(saved):
    return ", ".join(str(o.get("class")) for o in saved)


def owners(sm: ShardedModel, opts: List[torch.optim.Optimizer],
           what: str) -> Dict[str, Tuple[int, int]]:
    """{tensor name: (optimizer index, group index)} of this rank's main
    parameters in opts; a tensor that is not a main parameter, or is in two
    optimizers (or twice in one), is refused naming it."""
    by_id = {id(mp): name for name, mp, _, _ in sm._main}
    out = {}
    for i, o in enumerate(opts):
        for gi, g in enumerate(o.param_groups):
            for p in g["params"]:
                name = by_id.get(id(p))
                if name is None:
                    raise UsageError("%s: %s steps a tensor of shape %s that is not a main "
                                     "parameter of this model (give it sm.main_parameters())"
                                     % (what, _name(opts, i), list(p.shape)))
                if name in out:
                    raise UsageError("%s: %r is in %s and in %s; a parameter may be in one "
                                     "optimizer only" % (what, name, _name(opts, out[name][0]),
                                                         _name(opts, i)))
                out[name] = (i, gi)
    return out


def _refuse_together(rt, problem, what, nothing):
    """Raises on every rank when any rank has a problem (collective)."""
    if rt.allreduce([1.0 if problem else 0.0], "max")[0]:
        raise UsageError(problem or "%s: another rank refused the call (its error says why); "
                                    "%s" % (what, nothing))


def _from_lowest(rt, descs):
    """Per slot, the JSON-able description of the lowest rank that has one
    (None where no rank has), for every rank (two allreduces)."""
    data = [json.dumps(d, sort_keys=True).encode("utf-8") if d is not None else b""
            for d in descs]
    head = rt.allreduce([-float(rt.rank) if d else -_BIG for d in data] +
                        [float(len(d)) for d in data], "max")
    n = len(descs)
    lowest, sizes = [int(-x) if x > -_BIG else None for x in head[:n]], \
        [int(x) for x in head[n:]]
    body = []
    for d, low, size in zip(data, lowest, sizes):
        mine = d if low == rt.rank else b""
        body += [float(c) for c in mine] + [0.0] * (size - len(mine))
    got = rt.allreduce(body, "sum") if body else []
    out, at = [], 0
    for low, size in zip(lowest, sizes):
        raw = bytes(int(x) for x in got[at:at + size]).rstrip(b"\0")
        at += size
        out.append(json.loads(raw.decode("utf-8")) if low is not None else None)
    return out, lowest


def _save_several(sm, path, opts, step, user_blob):
    what, rt = "save_checkpoint", sm.runtime
    views = rt.views
    problem, owner, sharded, descs = None, {}, {}, [None] * len(opts)
    try:
        owner = owners(sm, opts, what)
        for i, o in enumerate(opts):
            mains = [(n, mp) for n, mp, _, _ in sm._main if owner.get(n, (-1,))[0] == i]
            if not mains:
                continue
            st, scalars = _split_state(mains, o)
            for k, shards in st.items():
                sharded.setdefault(k, {}).update(shards)
            descs[i] = {"keys": {k: DTYPE_NAMES[next(iter(d.values())).dtype]
                                 for k, d in st.items()}, "scalars": scalars}
    except UsageError as e:
        problem = e.message
    held = {n for n, _, _, _ in sm._main}
    codes = [float(owner[v.name][0] * _GROUPS + owner[v.name][1] + 1) if v.name in owner
             else 0.0 for v in views]
    low = [-c if v.name in held else -_BIG for c, v in zip(codes, views)]
    got = rt.allreduce([1.0 if problem else 0.0] + codes + low, "max")
    if got[0]:
        raise UsageError(problem or "%s: another rank refused the call (its error says why); "
                                    "nothing was saved" % what)
    T = len(views)
    code = [int(x) for x in got[1:1 + T]]
    split = [v.name for v, hi, lo in zip(views, code, got[1 + T:]) if hi != int(-lo)]
    if split:
        raise UsageError("%s: %s %s in one optimizer (or param group) on some ranks and in "
                         "another, or none, on others: every rank must give each tensor to "
                         "the same one" % (what, ", ".join(repr(n) for n in split[:8]),
                                           "is" if len(split) == 1 else "are"))
    saved, lowest = _from_lowest(rt, descs)
    problem = None
    for i, (d, s) in enumerate(zip(descs, saved)):
        if d is not None and d != s:
            problem = "%s: the state of %s on rank %d (%s) differs from that on rank %d (%s)" % (
                what, _name(opts, i), rt.rank, d, lowest[i], s)
    dtypes = {}
    for i, s in enumerate(saved):
        for k, d in (s or {}).get("keys", {}).items():
            if dtypes.setdefault(k, (d, i))[0] != d:
                problem = "%s: state %r is %s in %s and %s in %s (one dtype per state)" % (
                    what, k, dtypes[k][0], _name(opts, dtypes[k][1]), d, _name(opts, i))
    _refuse_together(rt, problem, what, "nothing was saved")
    zeros = {d: torch.zeros(max([v.shard_count for v in views] + [1]), dtype=TORCH_DTYPES[d])
             for d, _ in dtypes.values()}
    states = {}
    for k, (d, _) in dtypes.items():
        states[k] = {n: sharded[k][n] if n in sharded.get(k, {}) else zeros[d][:v.shard_count]
                     for n, v in ((v.name, v) for v in views) if n in held}
    members = [[[] for _ in o.param_groups] for o in opts]
    for v, c in zip(views, code):
        if c:
            members[(c - 1) // _GROUPS][(c - 1) % _GROUPS].append(v.name)
    doc = {"format": FORMAT, "user": None, "optimizer": None, "optimizers": []}
    if user_blob is not None:
        doc["user"] = base64.b64encode(bytes(user_blob)).decode("ascii")
    for i, o in enumerate(opts):
        s = saved[i] or {"keys": {}, "scalars": None}
        doc["optimizers"].append({
            "class": type(o).__name__, "members": members[i], "keys": sorted(s["keys"]),
            "scalars": s["scalars"],
            "param_groups": [{k: v for k, v in g.items() if k != "params" and _plain(v)}
                             for g in o.param_groups]})
    blob = json.dumps(doc, sort_keys=True).encode("utf-8")
    sm.runtime.save_checkpoint(path, sm.steps if step is None else step, states, blob)


def _blob_of(path, manifest, who):
    """Rank who's user blob, read from its data file (None when it saved none)."""
    for f in manifest.get("files", []):
        if isinstance(f, dict) and f.get("rank") == who and f.get("user_blob"):
            try:
                with open(os.path.join(path, str(f["name"])), "rb") as fh:
                    fh.seek(int(f["user_blob"][0]))
                    return fh.read(int(f["user_blob"][1]))
            except (OSError, KeyError, TypeError, ValueError, IndexError) as e:
                raise UsageError("load_checkpoint: reading the user blob of rank %d in %s: %s"
                                 % (who, path, e))
    return None


def _check_several(sm, opts, owner, doc, path):
    """The problems of loading doc's optimizers into opts on this rank."""
    saved = doc.get("optimizers")
    if not saved:
        one = doc.get("optimizer")
        return ["%s holds %s; pass %s" % (
            path, "the state of one %s" % one.get("class") if one else "no optimizer state",
            "that one optimizer, not a list of %d" % len(opts) if one else "no optimizer=")]
    if len(saved) != len(opts):
        return ["%s holds the state of %d optimizers (%s), %d given (%s)" % (
            path, len(saved), _classes(saved), len(opts),
            ", ".join(type(o).__name__ for o in opts))]
    problems = []
    for i, (o, s) in enumerate(zip(opts, saved)):
        if s.get("class") != type(o).__name__:
            problems.append("optimizer %d is a %s, the checkpoint's optimizer %d a %s (the same "
                            "classes in the same order)" % (i, type(o).__name__, i, s.get("class")))
        elif len(s.get("param_groups", [])) != len(o.param_groups):
            problems.append("%s has %d param groups, the checkpoint's %d" % (
                _name(opts, i), len(o.param_groups), len(s.get("param_groups", []))))
    if problems:
        return problems
    was = {}
    for i, s in enumerate(saved):
        for gi, names in enumerate(s.get("members", [])):
            was.update({n: (i, gi) for n in names})
    for n, _, _, _ in sm._main:
        now, then = owner.get(n), was.get(n)
        if now == then:
            continue
        if then is None:
            problems.append("%r is in %s here and in no optimizer in the checkpoint"
                            % (n, _name(opts, now[0])))
        elif now is None:
            problems.append("%r is in no optimizer here and in %s in the checkpoint"
                            % (n, _name(opts, then[0])))
        elif now[0] != then[0]:
            problems.append("%r is in %s here and in %s in the checkpoint"
                            % (n, _name(opts, now[0]), _name(opts, then[0])))
        else:
            problems.append("%r is in param group %d of %s here and in group %d in the "
                            "checkpoint" % (n, now[1], _name(opts, now[0]), then[1]))
    return problems


def _load_several(sm, path, opts, user_blob_rank, verify_files):
    what, rt = "load_checkpoint", sm.runtime
    manifest = _ck.read_manifest(path) or {}
    who = rt.rank if user_blob_rank is None else int(user_blob_rank)
    problem, doc, owner = None, None, {}
    try:
        owner = owners(sm, opts, what)
        data = _blob_of(path, manifest, who) if manifest else None
        if manifest and data is None:
            raise UsageError("load_checkpoint: rank %d saved no user blob in %s (the checkpoint "
                             "has %s ranks): pass user_blob_rank= a rank that did, e.g. 0"
                             % (who, path, manifest.get("world", "?")))
        if data is not None:
            doc, _ = _parse_blob(data, path)
            problems = _check_several(sm, opts, owner, doc, path)
            if problems:
                raise UsageError("load_checkpoint: %s does not match these optimizers (%d "
                                 "problem%s; nothing was loaded):\n  %s" % (
                                     path, len(problems), "" if len(problems) == 1 else "s",
                                     "\n  ".join(problems[:16])))
    except UsageError as e:
        problem = e.message
    _refuse_together(rt, problem, what, "nothing was loaded")
    names = [s.get("name") for s in manifest.get("states", [])[1:] if isinstance(s, dict)]
    loaded = rt.load_checkpoint(path, names, user_blob_rank, verify_files)   # a bad path: here
    doc, user = _parse_blob(loaded.user_blob, path)
    for i, (o, s) in enumerate(zip(opts, doc["optimizers"])):
        for g, sg in zip(o.param_groups, s["param_groups"]):
            for k, v in sg.items():
                g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
        for n, mp, _, _ in sm._main:
            if owner.get(n, (-1,))[0] != i:
                continue
            st = {k: torch.from_numpy(loaded.states[k][n]).view(mp.shape) for k in s["keys"]}
            for k, d in (s.get("scalars") or {}).items():
                st[k] = torch.tensor(d["value"], dtype=getattr(torch, d["tensor"])) \
                    if "tensor" in d else d["value"]
            if st:
                o.state[mp] = st
    sm.steps = loaded.step
    return loaded.step, user
