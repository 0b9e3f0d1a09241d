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
"""
from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Optional, Tuple

import torch

from .. import checkpoint as _ck
from .._lib import UsageError
from .tensors import DTYPE_NAMES

if TYPE_CHECKING:
    from .shard import ShardedModel

FORMAT = "mfsdp.torch-checkpoint/1"


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


def _split_state(sm, optimizer):
    """({state key: {tensor name: shard}}, {key: scalar}) of the optimizer."""
    sharded, scalars, first = {}, None, None
    for name, mp, _, _ in sm._main:
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


def save(sm: ShardedModel, path: str, optimizer: Optional[torch.optim.Optimizer] = None,
         step: Optional[int] = None, user_blob: Optional[bytes] = None) -> None:
    """See ShardedModel.save_checkpoint."""
    sm._between_steps("save_checkpoint")
    states, scalars = _split_state(sm, optimizer) if optimizer is not None else ({}, None)
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


def _restore_optimizer(sm, optimizer, doc, states, path):
    opt = doc.get("optimizer")
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


def load(sm: ShardedModel, path: str, optimizer: Optional[torch.optim.Optimizer] = None,
         user_blob_rank: Optional[int] = None,
         verify_files: bool = False) -> Tuple[int, Optional[bytes]]:
    """See ShardedModel.load_checkpoint."""
    sm._between_steps("load_checkpoint")
    manifest = _ck.read_manifest(path) or {}
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
