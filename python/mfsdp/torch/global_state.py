"""
global_state: the whole model's state dict of a model with Distinct tensors
(issue #42 item 2): ShardedModel.full_state_dict and load_full_state_dict
delegate here for the tensors that have global names (the schedule's
`global` key, naming.global_names_of).

A Distinct tensor with global names G at this rank's coordinate k (the
row-major index of its coordinates on the tensor's Distinct axes):
  rename  G = [N0, N1, ...]: the tensor here is the whole model's G[k];
  split   G = (N, D): the tensor here is slice k of N along dim D, each
          slice dims[D] wide.
Invariants: a coordinate's tensor is assembled from the master shards of
the ranks at that coordinate (every element covered, else a UsageError; the
replicas agree); the exchange runs on torch.distributed's default group,
which must be the runtime's world in the same order (as device_mesh()
checks); loading is local (each rank scatters its own coordinate's tensor).
save_dcp's writer (dcp.py) takes local_shards and writes: which rank
writes which elements of each coordinate, no tensor exchanged.
In shard.py's layer (docs/design.md §5.1): it takes a ShardedModel and
imports none of it; shard.py imports it inside its methods, dcp.py above.
"""
from typing import Dict, List, Mapping, Set, Tuple

import torch

from .._lib import UsageError


def coordinate(sm, name: str) -> int:
    """The row-major index of this rank's coordinates on `name`'s Distinct axes."""
    mesh = sm.schedule.mesh
    axes = list(mesh)
    k = 0
    for a in sm.distinct[name]:
        k = k * mesh[a] + sm.runtime.coords[axes.index(a)]
    return k


def count(sm, name: str) -> int:
    """The number of coordinates of `name`'s Distinct axes."""
    n = 1
    for a in sm.distinct[name]:
        n *= sm.schedule.mesh[a]
    return n


def refuse_unnamed(sm, what: str, names) -> None:
    """UsageError naming a Distinct tensor among `names` without global names."""
    bare = [n for n in names if n in sm.distinct and n not in sm.globals]
    if bare:
        raise UsageError(
            "%s: the Distinct tensor %r (on axis %s; %d without global names) has no global "
            "name: each coordinate holds its own tensor under that name; say which tensor of "
            "the whole model each holds with spec_from_module / fully_shard "
            "global_names={pattern: template, split(D) or (axis, D)} (the spec's global clause)"
            % (what, bare[0], "/".join(sm.distinct[bare[0]]), len(bare)))


def _world(sm, what):
    """torch.distributed, checked to be the runtime's world in the same order."""
    import torch.distributed as dist
    world = sm.runtime.world_size
    if world == 1:
        return None
    if sm._how[0] in ("local", "cuda_local"):
        raise UsageError("%s of Distinct tensors on the %s backend: its ranks are threads of "
                         "one process; the coordinates' tensors are exchanged with "
                         "torch.distributed (use backend=\"mpi\" or \"nccl\")" % (what, sm._how[0]))
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("%s of Distinct tensors needs torch.distributed: call "
                         "torch.distributed.init_process_group(...) on every rank first, rank = "
                         "the mfsdp rank (%d), world_size = %d" % (what, sm.runtime.rank, world))
    if dist.get_world_size() != world or dist.get_rank() != sm.runtime.rank:
        raise UsageError("%s: torch.distributed has rank %d of %d, the mfsdp runtime rank %d "
                         "of %d: the same world in the same order is needed"
                         % (what, dist.get_rank(), dist.get_world_size(), sm.runtime.rank, world))
    return dist


def gather(sm, names: Set[str], dtype, root: int = -1,
           what: str = "full_state_dict") -> Dict[str, torch.Tensor]:
    """{global name: whole tensor} of the Distinct tensors `names` (their
    views' names), in `dtype` (None: each one's main_weight dtype), on every
    rank (root -1; every rank receives every shard) or on rank `root` only
    ({} on the others). Collective."""
    from .tensors import TORCH_DTYPES
    views = {v.name: v for v in sm.runtime.views}
    mine = []
    for n, mp, _, v in sm._main:
        if n in names:
            data = mp.detach().reshape(-1)[:v.shard_count].to(torch.float32).clone()
            mine.append((n, coordinate(sm, n), v.shard_offset, data))
    dist = _world(sm, what)
    every = [mine]
    keep = root < 0 or sm.runtime.rank == root
    if dist is not None:
        every = [None] * sm.runtime.world_size if keep else None
        if root < 0:
            dist.all_gather_object(every, mine)
        else:
            dist.gather_object(mine, every, dst=root)
    if not keep:
        return {}
    local: Dict[Tuple[str, int], torch.Tensor] = {}
    seen: Dict[Tuple[str, int], torch.Tensor] = {}
    for part in every:
        for n, k, off, data in part:
            numel = views[n].numel
            t = local.setdefault((n, k), torch.zeros(numel, dtype=torch.float32))
            hit = seen.setdefault((n, k), torch.zeros(numel, dtype=torch.bool))
            t[off:off + data.numel()] = data
            hit[off:off + data.numel()] = True
    out: Dict[str, torch.Tensor] = {}
    for n in sorted(names, key=lambda x: views[x].index):
        shape = tuple(views[n].shape)
        parts = []
        for k in range(count(sm, n)):
            if (n, k) not in seen or not bool(seen[(n, k)].all()):
                raise UsageError("%s: coordinate %d of %r is not covered by the ranks' master "
                                 "shards" % (what, k, n))
            want = dtype or TORCH_DTYPES[views[n].dtype["main_weight"]]
            parts.append(local[(n, k)].reshape(shape).to(want))
        g = sm.globals[n]
        if isinstance(g, tuple):
            out[g[0]] = torch.cat(parts, dim=g[1])
        else:
            for k, t in enumerate(parts):
                out[g[k]] = t
    return out


def expected(sm, names: Set[str]) -> Dict[str, Tuple[int, ...]]:
    """{global name: whole shape} of the Distinct tensors `names`, in the
    schedule's tensor order (messages list them so, whatever the set's order)."""
    out = {}
    for v in sm.runtime.views:
        n = v.name
        if n not in names:
            continue
        shape, g = list(v.shape), sm.globals[n]
        if isinstance(g, tuple):
            shape[g[1]] *= count(sm, n)
            out[g[0]] = tuple(shape)
        else:
            for name in g:
                out[name] = tuple(shape)
    return out


def local_of(sm, name: str, state_dict: Mapping[str, torch.Tensor]):
    """This rank's tensor of Distinct `name` out of a whole-model state dict
    (None when absent)."""
    g = sm.globals[name]
    k = coordinate(sm, name)
    if isinstance(g, tuple):
        t = state_dict.get(g[0])
        if t is None:
            return None
        width = t.shape[g[1]] // count(sm, name)
        return t.narrow(g[1], k * width, width).contiguous()
    return state_dict.get(g[k])


def problems(sm, names: Set[str], state_dict: Mapping[str, torch.Tensor],
             strict: bool) -> List[str]:
    """load_full_state_dict's problems with the global tensors of `names`:
    the missing ones, then the misshapen ones, each in the schedule's order."""
    missing, shapes = [], []
    for gname, shape in expected(sm, names).items():
        t = state_dict.get(gname)
        if t is None:
            if strict:
                missing.append("missing parameter %r (a global name of a Distinct tensor)" % gname)
        elif tuple(t.shape) != shape:
            shapes.append("%r: shape %s, the global tensor has %s" % (gname, list(t.shape),
                                                                      list(shape)))
    return missing + shapes


# ---- save_dcp's writer: each rank writes the parts it holds (dcp.py) ----

def local_shards(sm, names: Set[str]) -> Dict[str, Tuple[int, int, torch.Tensor]]:
    """{name: (coordinate, shard offset, this rank's master shard)} of the
    Distinct tensors `names` it holds a shard of: 1-D, the main_weight
    dtype, a view of the master parameter (nothing copied)."""
    from .tensors import TORCH_DTYPES
    out = {}
    for n, mp, _, v in sm._main:
        if n in names and v.shard_count:
            data = mp.detach().reshape(-1)[:v.shard_count]
            want = TORCH_DTYPES[v.dtype["main_weight"]]
            out[n] = (coordinate(sm, n), v.shard_offset, data if data.dtype == want
                      else data.to(want))
    return out


def layout(sm, name: str) -> List[Tuple[str, int]]:
    """[(axis, size)] of `name`'s Distinct axes, outermost first."""
    return [(a, sm.schedule.mesh[a]) for a in sm.distinct[name]]


def _minus(ranges: List[Tuple[int, int]], cut: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """The parts of sorted disjoint `ranges` outside the union of `cut`."""
    out = []
    for a, b in ranges:
        pos = a
        for c, d in sorted(cut):
            if d <= pos or c >= b:
                continue
            if c > pos:
                out.append((pos, c))
            pos = max(pos, d)
        if pos < b:
            out.append((pos, b))
    return out


def writes(held: List[List[Tuple[str, int, int, int]]], rank: int, numel: Mapping[str, int],
           counts: Mapping[str, int], what: str) -> Dict[str, List[Tuple[int, int]]]:
    """{name: flat ranges [a, b) of its local tensor} that rank `rank`
    writes, out of every rank's held list [(name, coordinate, offset,
    count)]: each element of each coordinate is written once, by the first
    rank holding it in an order rotated per tensor and coordinate (a
    replica's copy is never written twice, and replicated tensors' writes
    spread over their replicas). UsageError, the same on every rank, when a
    coordinate's elements are not all held."""
    by = {}                                  # (name, coordinate) -> [(rank, a, b)]
    for r, part in enumerate(held):
        for n, k, off, cnt in part:
            by.setdefault((n, k), []).append((r, off, off + cnt))
    for n in sorted(counts):
        for k in range(counts[n]):
            if _minus([(0, numel[n])], [(a, b) for _, a, b in by.get((n, k), [])]):
                raise UsageError("%s: coordinate %d of %r is not covered by the ranks' master "
                                 "shards" % (what, k, n))
    world, turn = len(held), {n: i for i, n in enumerate(sorted(counts))}
    out = {}
    for n, k, off, cnt in held[rank]:
        first = (turn[n] + k) % world                   # who goes first for (n, k)
        before = (rank - first) % world
        lower = [(a, b) for r, a, b in by[(n, k)] if (r - first) % world < before]
        mine = _minus([(off, off + cnt)], lower)
        if mine:
            out[n] = mine
    return out
