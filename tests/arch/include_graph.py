#!/usr/bin/env python3
"""include_graph: no include circle among the modules of the tree.

A module is x.c with its header x.h (either may be missing; x.cu counts as
x.c). Module A depends on module B when a file of A has `#include "b.h"` and
b.h is one of the files read. Every cycle of that graph is printed with its
path, each step with the file and line of the include that makes it; exit 1
when there is one.

With --layer, the folders are also layers, named top to bottom:
    --layer planner/cli --layer planner/reports ... --layer core,ckpt
(one --layer per layer; a comma joins folders into one layer). A file under
a layer may include the headers of its own layer and of the layers below it,
never one above: each such include is printed as a layer violation with its
file and line, exit 1. Headers of folders in no layer are not constrained.

    include_graph.py ROOT DIR... [--layer DIR[,DIR]...]...   (DIR relative to ROOT)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = ('.c', '.h', '.cu')


def module_of(name):
    return os.path.splitext(os.path.basename(name))[0]


def read_files(root, dirs):
    """Every source file under the folders: {path relative to root: text}."""
    files = {}
    for rel in dirs:
        top = os.path.join(root, rel)
        if not os.path.isdir(top):
            raise SystemExit('include_graph: %s is not a folder' % top)
        for dirpath, _, names in os.walk(top):
            for f in sorted(names):
                if f.endswith(SOURCES):
                    path = os.path.join(dirpath, f)
                    with open(path, encoding='utf-8', errors='replace') as fh:
                        files[os.path.relpath(path, root)] = fh.read()
    return files


def build_graph(files):
    """{module: {module it depends on: 'file:line' of the first include}}."""
    headers = {os.path.basename(p) for p in files if p.endswith('.h')}
    graph = {module_of(p): {} for p in files}
    for path in sorted(files):
        a = module_of(path)
        for i, line in enumerate(files[path].split('\n')):
            m = INCLUDE.match(line)
            if not m or os.path.basename(m.group(1)) not in headers:
                continue
            b = module_of(m.group(1))
            if b != a:
                graph[a].setdefault(b, '%s:%d' % (path, i + 1))
    return graph


def layer_of(path, layers):
    """The index of the layer holding path (0 the top), or None."""
    for i, folders in enumerate(layers):
        if any(path == f or path.startswith(f.rstrip('/') + '/') for f in folders):
            return i
    return None


def layer_violations(files, layers):
    """'file:line includes x.h (its layer), a layer above' for every include
    of a header whose layer is above the including file's."""
    where = {}
    for p in files:
        if p.endswith('.h'):
            where.setdefault(os.path.basename(p), p)
    out = []
    for path in sorted(files):
        mine = layer_of(path, layers)
        if mine is None:
            continue
        for i, line in enumerate(files[path].split('\n')):
            m = INCLUDE.match(line)
            target = m and where.get(os.path.basename(m.group(1)))
            theirs = layer_of(target, layers) if target else None
            if theirs is not None and theirs < mine:
                out.append('%s:%d includes %s (%s), a layer above %s'
                           % (path, i + 1, os.path.basename(target), ','.join(layers[theirs]),
                              ','.join(layers[mine])))
    return out


def parse_args(argv):
    """(root, folders, layers top to bottom) from the command line."""
    root, dirs, layers, i = argv[1], [], [], 2
    while i < len(argv):
        if argv[i] == '--layer':
            if i + 1 >= len(argv):
                raise SystemExit('include_graph: --layer needs a folder')
            layers.append([os.path.normpath(f) for f in argv[i + 1].split(',') if f])
            i += 2
        else:
            dirs.append(argv[i])
            i += 1
    if not dirs:
        raise SystemExit(__doc__)
    return root, dirs, layers


def components(graph):
    """The strongly connected components (Tarjan, iterative), each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def shortest_cycle(graph, comp):
    """A shortest cycle through the component's first module, as a list."""
    members, first = set(comp), comp[0]
    parent, frontier = {first: None}, [first]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == first:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return list(reversed(path)) + [first]
                if w in members and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return [first, first]


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    root, dirs, layers = parse_args(argv)
    files = read_files(root, dirs)
    graph = build_graph(files)
    above = layer_violations(files, layers)
    for v in above:
        print('layer violation: ' + v)
    tangles = [c for c in components(graph) if len(c) > 1]
    cycles = [shortest_cycle(graph, c) for c in tangles]
    for comp, cycle in zip(tangles, cycles):
        print('include circle: ' + ' -> '.join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            print('  %s -> %s  (%s)' % (a, b, graph[a][b]))
        if len(comp) > len(cycle) - 1:
            print('  (modules of this tangle: %s)' % ', '.join(comp))
    if above:
        print('include_graph: %d include%s of a layer above' % (len(above), '' if len(above) == 1 else 's'))
    if cycles:
        print('include_graph: %d include circle%s among %d modules'
              % (len(cycles), '' if len(cycles) == 1 else 's', len(graph)))
    if cycles or above:
        return 1
    print('include_graph: no include circle among %d modules%s'
          % (len(graph), ', no include of a layer above among %d layers' % len(layers) if layers else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
