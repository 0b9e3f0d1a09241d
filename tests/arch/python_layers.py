#!/usr/bin/env python3
"""python_layers: the Python package's modules import by layer.

Every .py file under PKG (hidden folders and __pycache__ skipped) is a
module named by its path under PKG without `.py` (`_lib`, `torch/shard`,
`torch/__init__`) and belongs to exactly one layer; the layers are given top
to bottom, each a comma-separated list of modules:

    python_layers.py PKG --layer A,B --layer C ... [--local-up SRC:DST ...]

Each import of a module of the package (relative, or absolute through PKG's
own name; other packages are not looked at) is read with `ast` and is one of
  - module-level: run when the module is imported (at the top, in a class
    body, under try/if), it may name a module of its own layer or a layer
    below, never one above;
  - type-only: inside `if TYPE_CHECKING:` (never run), it may name any module;
  - function-local: inside a def (run when the function is called), it may
    name its own layer or one below, and a layer above only where
    --local-up SRC:DST allows that pair (a facade method of SRC delegating to
    DST, which takes SRC's objects).
Reported, each as one line, exit 1: a module in no layer or in two, a layer
naming a module that does not exist, an import of a layer above
(`file:line: module-level import of DST (layer ...) in SRC (layer ...)`),
and a --local-up pair no function-local import uses (stale: drop it).
`from P import n` names module P/n when that is a module, else P (its
`__init__` for a package); importing a submodule's parent packages is
Python's doing, not the file's, and is not counted.
"""
import ast
import os
import sys


def modules(pkg):
    """{module name: file path} of every .py file under pkg."""
    out = {}
    for dirpath, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if not d.startswith('.') and d != '__pycache__')
        rel = os.path.relpath(dirpath, pkg)
        for n in sorted(names):
            if n.endswith('.py'):
                key = n[:-3] if rel == '.' else rel.replace(os.sep, '/') + '/' + n[:-3]
                out[key] = os.path.join(dirpath, n)
    return out


def _module_of(mods, parts):
    """The module that a dotted path (a list of names under the package) is:
    a module file or a package's __init__; None when neither exists."""
    key = '/'.join(parts)
    if key in mods:
        return key
    init = (key + '/__init__') if key else '__init__'
    return init if init in mods else None


def targets(mods, pkgname, src, node):
    """The package's modules that import statement `node` of module `src` names."""
    if isinstance(node, ast.Import):
        out = [_module_of(mods, a.name.split('.')[1:]) for a in node.names
               if a.name.split('.')[0] == pkgname]
        return sorted({t for t in out if t})
    named = node.module.split('.') if node.module else []
    if node.level:
        here = src.split('/')[:-1]      # the package src is in
        if node.level - 1 > len(here):
            return []
        base = here[:len(here) - (node.level - 1)] + named
    elif named and named[0] == pkgname:
        base = named[1:]
    else:
        return []
    out = []
    for a in node.names:
        sub = _module_of(mods, base + [a.name]) if a.name != '*' else None
        out.append(sub or _module_of(mods, base))
    return sorted({t for t in out if t})


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or \
        (isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING')


def imports(tree):
    """(node, kind) of every import statement: kind 'module' (run at import),
    'type' (under `if TYPE_CHECKING:`) or 'local' (inside a def or lambda)."""
    out = []

    def visit(node, kind):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append((node, kind))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                visit(stmt, 'type')
            for stmt in node.orelse:
                visit(stmt, kind)
            return
        if kind == 'module' and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda)):
            kind = 'local'
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(tree, 'module')
    return out


def parse_args(argv):
    if len(argv) < 2 or argv[1].startswith('-'):
        raise SystemExit('usage: python_layers.py PKG --layer A,B --layer C ... '
                         '[--local-up SRC:DST ...]')
    pkg, layers, ups = argv[1], [], []
    i = 2
    while i < len(argv):
        if argv[i] in ('--layer', '--local-up') and i + 1 < len(argv):
            if argv[i] == '--layer':
                layers.append([m for m in argv[i + 1].split(',') if m])
            else:
                src, sep, dst = argv[i + 1].partition(':')
                if not sep or not src or not dst:
                    raise SystemExit('python_layers: --local-up %r: give SRC:DST' % argv[i + 1])
                ups.append((src, dst))
            i += 2
        else:
            raise SystemExit('python_layers: unknown argument %r' % argv[i])
    return pkg, layers, ups


def check(pkg, layers, ups):
    """The problems (one line each) and a summary line."""
    mods = modules(pkg)
    if not mods:
        return ['python_layers: no .py file under %s' % pkg], ''
    problems = []
    level = {}                          # module -> layer index (0: top)
    for li, layer in enumerate(layers):
        for m in layer:
            if m not in mods:
                problems.append('python_layers: layer %s names %r, which is no module of %s'
                                % (','.join(layer), m, pkg))
            elif m in level:
                problems.append('python_layers: %r is in two layers' % m)
            level.setdefault(m, li)
    for m in mods:
        if m not in level:
            problems.append('%s: module %r is in no layer (add it to one: docs/design.md §5.1 '
                            'and tests/arch/CMakeLists.txt)' % (mods[m], m))
    pkgname = os.path.basename(os.path.normpath(pkg))
    used_ups = set()
    counts = {'module': 0, 'type': 0, 'local': 0}
    for src in sorted(mods):
        path = mods[src]
        with open(path, encoding='utf-8') as f:
            try:
                tree = ast.parse(f.read(), path)
            except SyntaxError as e:
                problems.append('%s:%s: does not parse: %s' % (path, e.lineno, e.msg))
                continue
        for node, kind in imports(tree):
            for dst in targets(mods, pkgname, src, node):
                if dst == src:
                    continue
                counts[kind] += 1
                if kind == 'type' or src not in level or dst not in level:
                    continue
                if level[dst] >= level[src]:
                    continue
                if kind == 'local' and (src, dst) in ups:
                    used_ups.add((src, dst))
                    continue
                where = 'module-level' if kind == 'module' else 'function-local'
                why = '' if kind == 'module' else \
                    ' (not an allowed --local-up %s:%s)' % (src, dst)
                problems.append('%s:%d: %s import of %s (layer %s) in %s (layer %s): '
                                'a layer above%s' % (path, node.lineno, where, dst,
                                                     ','.join(layers[level[dst]]), src,
                                                     ','.join(layers[level[src]]), why))
    for src, dst in ups:
        if (src, dst) not in used_ups:
            problems.append('python_layers: --local-up %s:%s is used by no function-local import '
                            'of a layer above (drop it)' % (src, dst))
    summary = ('python_layers: %d modules in %d layers, no import of a layer above '
               '(%d module-level, %d type-only, %d function-local imports; %d allowed upward '
               'pairs)' % (len(mods), len(layers), counts['module'], counts['type'],
                           counts['local'], len(ups)))
    return problems, summary


def main(argv):
    pkg, layers, ups = parse_args(argv)
    if not os.path.isdir(pkg):
        print('python_layers: %s is not a folder' % pkg)
        return 2
    problems, summary = check(pkg, layers, ups)
    for p in problems:
        print(p)
    if problems:
        print('python_layers: %d problem%s' % (len(problems), '' if len(problems) == 1 else 's'))
        return 1
    print(summary)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
