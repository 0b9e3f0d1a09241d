"""
naming: the global names of Distinct tensors (issue #42 item 2;
docs/language.md §3.4's `global` clause, docs/schedule.md's `global` key).

A tensor Distinct on some mesh axes holds a different tensor of the whole
model on each coordinate of those axes. spec_from_module's
global_names={fnmatch pattern on the parameter's full name: value} says which:

  a str      a template of the whole model's full name, `{expr}` over the
             tensor's Distinct axis names and integers (the rename form:
             each coordinate holds the whole tensor of that name);
  split(D)   or (axis, D): the whole tensor is the concatenation along dim D
             of the coordinates' tensors, row-major over the Distinct axes
             (Megatron's column-parallel W1 is split(0), row-parallel W2
             split(1)); its name is the parameter's own;
  a callable name -> one of the above (expert_names makes one).

Invariants: a template written into a spec is relative to its unit (the
unit's name and "." are stripped; a template outside its unit is a
ValueError); only Distinct parameters take a global name; the schedule's
`global` key is the source of truth at run time (global_names_of), never
this module's own expansion.
"""
import fnmatch
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

GlobalName = Union[List[str], Tuple[str, int]]    # rename: names; split: (name, D)


class Split:
    """The split form's value: the whole tensor is the coordinates' tensors
    concatenated along `dim` (row-major over the tensor's Distinct axes)."""

    def __init__(self, dim: int, axis: Optional[str] = None):
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise ValueError("split(%r): the dimension is an integer" % (dim,))
        self.dim, self.axis = dim, axis

    def __repr__(self):
        return "split(%d)" % self.dim


def split(dim: int) -> Split:
    """global_names' value for a tensor-parallel slice along `dim`."""
    return Split(dim)


def expert_names(prefix: str, per_coordinate: int, axis: str = "ep") -> Callable[[str], str]:
    """A global_names value for experts: `prefix` holds `{}` where the local
    expert index stands, e.g. expert_names("moe.experts.{}", 2, "ep") names
    moe.experts.1.w1.weight "moe.experts.{2*ep+1}.w1.weight" (local expert e of
    ep coordinate c is global expert per_coordinate * c + e)."""
    if prefix.count("{}") != 1:
        raise ValueError("expert_names(%r): the prefix holds one '{}' where the local expert "
                         "index stands, e.g. 'moe.experts.{}'" % (prefix,))
    if not isinstance(per_coordinate, int) or per_coordinate < 1:
        raise ValueError("expert_names: per_coordinate=%r is the number of experts per %s "
                         "coordinate (an integer >= 1)" % (per_coordinate, axis))
    head, tail = prefix.split("{}")
    pat = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + r"(\.|$)")

    def name_of(full: str) -> str:
        m = pat.match(full)
        if not m:
            raise ValueError("expert_names(%r): %r does not start with it (an expert index "
                             "where '{}' stands)" % (prefix, full))
        e = int(m.group(1))
        rest = full[m.end(1) + len(tail):]
        return "%s{%d*%s+%d}%s%s" % (head, per_coordinate, axis, e, tail, rest)
    return name_of


def resolve(names: List[str], distinct: Mapping[str, List[str]],
            global_names: Optional[Mapping[str, Any]]) -> Dict[str, Tuple[str, Optional[int]]]:
    """{parameter full name: (full-name template, split dim or None)} of
    spec_from_module's global_names. ValueError for a pattern that matches
    nothing, a match that is not Distinct, a value of another type, a split
    axis that is not the tensor's."""
    if not global_names:
        return {}
    if not isinstance(global_names, Mapping):
        raise ValueError("global_names=%r: give {parameter name pattern: template, split(D) "
                         "or (axis, D)}" % (global_names,))
    out: Dict[str, Tuple[str, Optional[int]]] = {}
    for pat, value in global_names.items():
        hit = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hit:
            raise ValueError("global_names={%r: ...}: the pattern matches no parameter of the "
                             "model (patterns match full names such as %r)"
                             % (pat, names[0] if names else "layers.0.w"))
        for n in hit:
            if n not in distinct:
                raise ValueError("global_names={%r: ...}: %r is not Distinct on any axis (only "
                                 "a tensor in distinct= takes a global name)" % (pat, n))
            out[n] = _one(pat, n, value(n) if callable(value) else value, distinct[n])
    return out


def _one(pat, name, value, axes):
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        value = Split(value[1], value[0])
    if isinstance(value, Split):
        if value.axis is not None and value.axis not in axes:
            raise ValueError("global_names={%r: (%r, %d)}: %r is Distinct on %s, not on %r"
                             % (pat, value.axis, value.dim, name, "/".join(axes), value.axis))
        return name, value.dim
    if isinstance(value, str):
        return value, None
    raise ValueError("global_names={%r: %r}: a value is a template string, split(D), "
                     "(axis, D) or a callable giving one of them for %r" % (pat, value, name))


def clause(unit: str, full: str, value: Tuple[str, Optional[int]]) -> str:
    """The ` global "..." [split D]` text of a tensor of `unit`, its template
    made relative to the unit."""
    template, dim = value
    if not template.startswith(unit + "."):
        raise ValueError("global name %r of %r: a global name stays in its unit %r (it "
                         "starts with %r)" % (template, full, unit, unit + "."))
    text = ' global "%s"' % template[len(unit) + 1:].replace("\\", "\\\\").replace('"', '\\"')
    return text + (" split %d" % dim if dim is not None else "")


# ---- the schedule's `global` key ----

def _scalar(s: str, i: int) -> Tuple[str, int]:
    """A flow scalar at s[i:] (double-quoted, single-quoted or plain) and the
    index after it."""
    if s[i] == '"':
        j, buf = i + 1, []
        while s[j] != '"':
            if s[j] == "\\":
                j += 1
            buf.append(s[j])
            j += 1
        return "".join(buf), j + 1
    if s[i] == "'":                                  # '' is a quote
        j, buf = i + 1, []
        while s[j] != "'" or s[j + 1:j + 2] == "'":
            buf.append(s[j])
            j += 2 if s[j] == "'" else 1
        return "".join(buf), j + 1
    m = re.compile(r"[^,\]\}]*").match(s, i)
    return m.group(0).strip(), m.end()


def _skip(s, i):
    while i < len(s) and s[i] in " ,":
        i += 1
    return i


def parse_global(line: str) -> Optional[GlobalName]:
    """The `global` value of one tensor entry's line, None without one:
    [names] (rename) or (name, D) (split). ValueError when malformed."""
    at = line.find("global: ")
    if at < 0:
        return None
    i = at + len("global: ")
    try:
        if line[i] == "[":
            names, i = [], _skip(line, i + 1)
            while line[i] != "]":
                v, i = _scalar(line, i)
                names.append(v)
                i = _skip(line, i)
            return names
        if line[i] == "{":
            fields, i = {}, _skip(line, i + 1)
            while line[i] != "}":
                m = re.compile(r"(\w+):\s*").match(line, i)
                v, i = _scalar(line, m.end())
                fields[m.group(1)] = v
                i = _skip(line, i)
            return fields["name"], int(fields["split"])
    except (AttributeError, IndexError, KeyError, ValueError):
        pass
    raise ValueError("schedule: malformed global key in %r (expected global: [names] or "
                     "global: {name: N, split: D})" % line.strip())


def global_names_of(text: Optional[Union[str, bytes]],
                    path: Optional[str] = None) -> Dict[str, GlobalName]:
    """{tensor name: its global names} of a schedule's YAML (the text, else
    the file at `path`): the tensors whose entry has a `global` key."""
    if text is None and path and os.path.isfile(path):
        with open(path, "rb") as f:
            text = f.read()
    if text is None:
        return {}
    out: Dict[str, GlobalName] = {}
    in_buckets = False
    for line in (text.decode("utf-8") if isinstance(text, bytes) else text).splitlines():
        if line and not line[0].isspace() and not line.startswith("-"):
            in_buckets = line.startswith("buckets:")
            continue
        m = re.match(r'^  - \{name: ', line)
        if not in_buckets or not m:
            continue
        name, _ = _scalar(line, m.end())
        g = parse_global(line[m.end():])
        if g is not None:
            out[name] = g
    return out
