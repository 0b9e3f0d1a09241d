"""
tools: the `mfsdp-ckpt` console script.

`to-dcp` and `from-dcp` convert between mfsdp checkpoints and PyTorch
Distributed Checkpoints (docs/checkpoint.md, "PyTorch DCP") in this one
process, on a world-of-one local runtime whose schedule has the same
tensors (so its main_weight is the whole tensor), through
mfsdp/torch/dcp.py; they need torch. Every other command goes to the C
tool (bin/mfsdp-ckpt inside the package, $MFSDP_CKPT, or the first
mfsdp-ckpt on PATH that is not this script) with argv and exit status
unchanged; `mfsdp-replay` (replay_main) likewise runs bin/mfsdp-replay. Exit status: 0 success, 1 refused input or a failure (one line on stderr,
`mfsdp-ckpt CMD: error: ...`, never a traceback: DCP's CheckpointException,
a BaseException, included), 2 usage error; an output is committed by
rename (complete or absent, no OUT.tmp-* left), and from-dcp reads a DCP
under dcp_files' rules (regular files inside it, checksums when mfsdp wrote it).
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._lib import MfsdpError
from .compile import is_script

USAGE = """\
  to-dcp CKPT OUT [--tie NAME=SOURCE]...
                                   an mfsdp checkpoint (weights and the optimizer
                                   state mfsdp.torch saved) as a PyTorch DCP directory
                                   in FSDP2's layout; --tie adds model.NAME = SOURCE
  from-dcp DCP SCHEDULE.yaml OUT [--tie NAME=SOURCE]... [--optimizer CLASS]
                                   a PyTorch DCP (FSDP2's layout) as an mfsdp checkpoint
                                   of SCHEDULE's tensors, loadable on any mesh; --tie
                                   names a tied copy to skip, --optimizer the torch
                                   class (default: found from the param groups)
"""


class _Usage(Exception):
    pass


def binary(name: str, env: str) -> str:
    """A C tool shipped with the package: $ENV, the one inside this package
    (bin/NAME), else the first NAME on PATH that is not a script (this
    package's console scripts are)."""
    given = os.environ.get(env)
    if given:
        return os.path.abspath(given)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)
    if os.access(here, os.X_OK):
        return here
    for d in os.environ.get("PATH", "").split(os.pathsep):
        found = os.path.join(d, name)
        if os.path.isfile(found) and os.access(found, os.X_OK) and not is_script(found):
            return found
    raise FileNotFoundError("the %s binary was not found: install the package with "
                            "`pip install .` or set %s to its path" % (name, env))


def ckpt_path() -> str:
    """The C mfsdp-ckpt binary ($MFSDP_CKPT, bin/mfsdp-ckpt, PATH)."""
    return binary("mfsdp-ckpt", "MFSDP_CKPT")


def replay_main(argv: Optional[Sequence[str]] = None) -> int:
    """The `mfsdp-replay` console script: runs bin/mfsdp-replay ($MFSDP_REPLAY)
    with argv, its exit status passed through."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        exe = binary("mfsdp-replay", "MFSDP_REPLAY")
    except FileNotFoundError as e:
        print("mfsdp-replay: %s" % e, file=sys.stderr)
        return 2
    return subprocess.call([exe] + argv)


def _names(tensors, ties, where):
    """The state-dict names of a model of `tensors` [(name, shape)]: each
    tensor under its own name, plus every --tie ALIAS=SOURCE as a second key of
    SOURCE (a tied parameter's other name); `where` names what lacks a SOURCE."""
    from .torch import dcp
    names = dcp.Names({t: t for t, _ in tensors}, {t: t for t, _ in tensors})
    for alias, source in ties:
        if source not in names.fqn:
            raise MfsdpError(1, "--tie %s=%s: %s has no tensor %r" % (alias, source, where,
                                                                    source))
        names.keys[alias] = source
    return names


def _options(argv: Sequence[str], npos: int, allowed: Sequence[str]) -> Tuple[List[str], Dict]:
    pos, opts = [], {"--tie": []}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in allowed:
            if i + 1 >= len(argv):
                raise _Usage("%s needs a value" % a)
            if a == "--tie":
                if "=" not in argv[i + 1]:
                    raise _Usage("--tie %s: NAME=SOURCE" % argv[i + 1])
                opts[a].append(tuple(argv[i + 1].split("=", 1)))
            else:
                opts[a] = argv[i + 1]
            i += 2
        elif a.startswith("-"):
            raise _Usage("unknown option %s" % a)
        else:
            pos.append(a)
            i += 1
    if len(pos) != npos:
        raise _Usage("%d operands expected, %d given" % (npos, len(pos)))
    return pos, opts


def _one_rank_runtime(tensors: Sequence[Tuple[str, Sequence[int]]]):
    """A local runtime of one rank whose schedule holds these tensors (full
    names, shapes), each a whole replicated main_weight."""
    from .runtime import Runtime
    from .schedule import Schedule
    units: Dict[str, List[str]] = {}
    for name, shape in tensors:
        unit, _, leaf = name.rpartition(".")
        if not unit or not shape:
            raise MfsdpError(1, "tensor %r: a name UNIT.TENSOR with a shape is needed for the "
                                "one-rank schedule of the conversion" % name)
        units.setdefault(unit, []).append('  tensor "%s" [%s];' % (
            leaf, ", ".join(str(int(d)) for d in shape)))
    spec = ["mesh dp = 1;", "microbatches 1;",
            "layout one { weight fp32 [Replicate]; grad fp32 [Partial]; "
            "main_weight fp32 [Replicate]; }"]
    for unit, lines in units.items():
        spec += ['unit "%s" layout one {' % unit] + lines + ["}"]
    return Runtime(Schedule.compile("\n".join(spec) + "\n", name="conversion"), backend="local")


def _blobs(path: str, manifest: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every rank's user blob parsed as mfsdp.torch's JSON (those that are)."""
    out = []
    for f in manifest.get("files", []):
        where = f.get("user_blob")
        if not where:
            continue
        with open(os.path.join(path, f["name"]), "rb") as fh:
            fh.seek(int(where[0]))
            data = fh.read(int(where[1]))
        try:
            out.append(json.loads(data.decode("utf-8")))
        except (ValueError, UnicodeDecodeError):
            pass
    return out


def _tuples(v):
    return tuple(v) if isinstance(v, list) else v


def to_dcp(argv: Sequence[str]) -> None:
    import torch
    from . import checkpoint as ck
    from .torch import checkpoint as tck
    from .torch import dcp
    (src, out), opts = _options(argv, 2, ["--tie"])
    if os.path.lexists(out):
        raise MfsdpError(1, "%s exists; a checkpoint is never overwritten" % out)
    manifest = ck.read_manifest(src)
    if manifest is None:
        raise MfsdpError(1, "%s: no readable manifest.json: not an mfsdp checkpoint" % src)
    tensors = [(t["name"], t["shape"]) for t in manifest["tensors"]]
    docs = [d for d in _blobs(src, manifest) if isinstance(d, dict)
            and d.get("format") == tck.FORMAT and d.get("optimizer")]
    names = _names(tensors, opts["--tie"], "the checkpoint")
    if any(isinstance(d, dict) and d.get("optimizers") for d in _blobs(src, manifest)):
        raise MfsdpError(1, "%s: saved with several optimizers (optimizer=[...]); to-dcp converts "
                            "one optimizer's state: load it with sm.load_checkpoint and write the "
                            "DCP with sm.save_dcp(path, [the same optimizers])" % src)
    rt = _one_rank_runtime(tensors)
    try:
        states = [s["name"] for s in manifest["states"][1:]] if docs else None
        loaded = rt.load_checkpoint(src, states=states, user_blob_rank=0)
        opt = None
        if docs:
            o = docs[0]["optimizer"]
            groups = [{k: _tuples(v) for k, v in g.items()} for g in o["param_groups"]]
            member = _members(docs, groups, [t for t, _ in tensors], src)
            scalars = {k: (torch.tensor(d["value"], dtype=getattr(torch, d["tensor"]))
                           if "tensor" in d else d["value"]) for k, d in (o["scalars"] or {}).items()}
            state = {}
            for t, _ in tensors:
                st = {k: torch.from_numpy(loaded.states[k][t]).reshape(-1) for k in states}
                st.update({k: v.clone() if isinstance(v, torch.Tensor) else v
                           for k, v in scalars.items()})
                state[t] = st
            opt = dcp.OptimizerState(groups, member, state)
        dcp.save(rt, names, out, opt, what="to-dcp")
    finally:
        rt.close()


def _members(docs, groups, tensors, src):
    if len(groups) == 1:
        return {t: 0 for t in tensors}
    member = {}
    for d in docs:
        for gi, names in enumerate(d["optimizer"].get("members") or []):
            member.update({n: gi for n in names if n})
    lost = [t for t in tensors if t not in member]
    if lost:
        raise MfsdpError(1, "%s: the optimizer had %d param groups and the checkpoint does not "
                            "say which group holds %s (saved by an older mfsdp)"
                         % (src, len(groups), ", ".join(lost[:4])))
    return member


def _optimizer_class(groups, given):
    import torch
    if given:
        if not isinstance(getattr(torch.optim, given, None), type):
            raise _Usage("--optimizer %s: no such class in torch.optim" % given)
        return given
    keys = set(groups[0]) - {"params", "initial_lr"} if groups else set()
    found = []
    for name in ("Adam", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "Adadelta"):
        sig = set(inspect.signature(getattr(torch.optim, name).__init__).parameters)
        if sig - {"self", "params"} == keys:
            found.append(name)
    if found == ["Adam"] and groups[0].get("decoupled_weight_decay"):
        return "AdamW"    # AdamW is Adam with decoupled_weight_decay=True
    if len(found) != 1:
        raise MfsdpError(1, "the param groups' options %s do not name one torch.optim class: "
                            "give --optimizer CLASS" % sorted(keys))
    return found[0]


def from_dcp(argv: Sequence[str]) -> None:
    import numpy as np
    import torch
    from .schedule import Schedule
    from .torch import checkpoint as tck
    from .torch import dcp
    (src, sched_path, out), opts = _options(argv, 3, ["--tie", "--optimizer"])
    sched = Schedule.load(sched_path)
    tensors = [(t.name, t.shape) for t in sched.tensors]
    if os.path.lexists(out):
        raise MfsdpError(1, "%s exists; a checkpoint is never overwritten" % out)
    names = _names(tensors, opts["--tie"], "the schedule")
    md = dcp._metadata(src, "from-dcp")
    with_optim = any(k.startswith("optim.") for k in md)
    rt = _one_rank_runtime(tensors)
    try:
        opt = dcp.load(rt, names, src, [] if with_optim else None, lambda saved: [],
                       what="from-dcp")
        states, blob, step = {}, None, 0
        if opt is not None:
            cls = _optimizer_class(opt.groups, opts.get("--optimizer"))
            scalars, first = None, None
            for t, _ in tensors:
                mine = {}
                for k, x in opt.state[t].items():
                    if isinstance(x, torch.Tensor) and x.dim() == 1:
                        states.setdefault(k, {})[t] = np.ascontiguousarray(x.numpy())
                    else:
                        mine[k] = tck._scalar(x)
                if scalars is None:
                    scalars, first = mine, t
                elif mine != scalars:
                    raise MfsdpError(1, "%s: the scalar optimizer state of %r (%r) differs from "
                                        "that of %r (%r); an mfsdp checkpoint keeps one for all"
                                     % (src, t, mine, first, scalars))
            groups = [{k: v for k, v in g.items() if tck._plain(v)} for g in opt.groups]
            members = [[t for t, _ in tensors if opt.member.get(t) == gi]
                       for gi in range(len(groups))]
            doc = {"format": tck.FORMAT, "user": None,
                   "optimizer": {"class": cls, "scalars": scalars, "param_groups": groups,
                                 "members": members}}
            blob = json.dumps(doc, sort_keys=True).encode("utf-8")
            if scalars and "step" in scalars:
                step = int(scalars["step"]["value"])
        rt.save_checkpoint(out, step=step, states=states, user_blob=blob)
    finally:
        rt.close()


def one_line(e: BaseException, cmd: str) -> str:
    """An error's message on one line: mfsdp's without its code name and the
    command's own prefix, a problem list joined by '; ', any other exception
    as its type and first line (DCP's CheckpointException by its cause)."""
    from .torch.dcp import _reason
    msg = e.message if isinstance(e, MfsdpError) else _reason(e)
    if msg.startswith(cmd + ": "):
        msg = msg[len(cmd) + 2:]
    return "; ".join(line.strip() for line in msg.splitlines() if line.strip())


def _help(out) -> int:
    try:
        text = subprocess.run([ckpt_path(), "--help"], capture_output=True, text=True).stdout
    except FileNotFoundError as e:
        text = "usage: mfsdp-ckpt COMMAND ARGS\n\n(%s)\n" % e
    head, sep, tail = text.partition("\nexit status")
    print(head.rstrip("\n") + "\n" + USAGE + (sep + tail if sep else ""), end="", file=out)
    return 0 if out is sys.stdout else 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        return _help(sys.stderr)
    if argv[0] in ("--help", "-h", "help"):
        return _help(sys.stdout)
    if argv[0] in ("to-dcp", "from-dcp"):
        cmd = argv[0]
        if any(a in ("--help", "-h") for a in argv[1:]):
            print("usage: mfsdp-ckpt COMMAND ARGS\n\n" + USAGE, end="")
            return 0
        try:
            import torch  # noqa: F401
        except ImportError:
            print("mfsdp-ckpt %s: needs torch (pip install torch)" % cmd, file=sys.stderr)
            return 1
        from torch.distributed.checkpoint.api import CheckpointException
        try:
            (to_dcp if cmd == "to-dcp" else from_dcp)(argv[1:])
        except _Usage as e:
            print("mfsdp-ckpt %s: error: %s\nusage: mfsdp-ckpt\n%s" % (cmd, e, USAGE),
                  file=sys.stderr)
            return 2
        except (Exception, CheckpointException) as e:   # noqa: BLE001 -- one line, never a traceback
            print("mfsdp-ckpt %s: error: %s" % (cmd, one_line(e, cmd)), file=sys.stderr)
            return 1
        return 0
    try:
        exe = ckpt_path()
    except FileNotFoundError as e:
        print("mfsdp-ckpt: %s" % e, file=sys.stderr)
        return 2
    return subprocess.call([exe] + argv)


if __name__ == "__main__":
    sys.exit(main())
