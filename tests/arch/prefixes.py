#!/usr/bin/env python3
"""prefixes: every function a source file exports carries its module's prefix.

A module is x.c with its header x.h. A function defined in x.c without
`static` must be named
  - x_... (the file's stem: mf_trace_admit in mf_trace.c), or
  - after the family it belongs to: y_... where y.c or y.h is a module of the
    same folder and x starts with y_ (mf_plan_stats_x in
    passes/mf_plan_stats.c may be mf_plan_x, beside passes/mf_plan.c), or
  - after the module that declares it: y_... where the header y.h of the
    same folder declares y_...( (a module split over files:
    mf_plan_search_lower_bounds in mf_plan_bound.c, declared in
    mf_plan_search.h beside it), or
  - after a type the module's header declares (mf_dtype_name in
    mf_schedule.c, whose header declares mf_dtype), or,
  - in the runtime, the public API (mfsdp_..., declared in
    runtime/include/mfsdp/).
Prints each offender as `file:line name`, exit 1; a DIR that is not a
folder is an error (exit 2).

    prefixes.py ROOT DIR...     (DIR relative to ROOT)
"""
import os
import re
import sys

DEF = re.compile(r'^(?!static\b|typedef\b|struct\b|enum\b|union\b|extern\b|#)'
                 r'[A-Za-z_][\w \*]*?\b((?:mf|mfsdp)_\w+)\s*\(')
TYPE = re.compile(r'\}\s*(mf_\w+)\s*;|^typedef\s+[^;{(]*\b(mf_\w+)\s*;|^(?:struct|enum)\s+(mf_\w+)\s*\{',
                  re.M)


def header_types(header):
    if not os.path.exists(header):
        return set()
    text = open(header, encoding='utf-8', errors='replace').read()
    return {next(g for g in m.groups() if g) for m in TYPE.finditer(text)}


def declared_by_headers(dirpath, files):
    """{function name: stems of the folder's headers that declare it}."""
    out = {}
    for h in files:
        if not h.endswith('.h'):
            continue
        text = open(os.path.join(dirpath, h), encoding='utf-8', errors='replace').read()
        for name in set(re.findall(r'\b((?:mf|mfsdp)_\w+)\s*\(', text)):
            out.setdefault(name, []).append(h[:-2])
    return out


def public_api(root):
    names = set()
    inc = os.path.join(root, 'runtime', 'include', 'mfsdp')
    for h in sorted(os.listdir(inc)) if os.path.isdir(inc) else []:
        if not h.endswith('.h'):
            continue
        names |= set(re.findall(r'\b(mfsdp_\w+)\s*\(', open(os.path.join(inc, h)).read()))
    return names


def offenders(root, rel):
    api = public_api(root)
    for dirpath, _, files in os.walk(os.path.join(root, rel)):
        for f in sorted(files):
            if not f.endswith('.c'):
                continue
            path = os.path.join(dirpath, f)
            stem = f[:-2]
            parts = stem.split('_')
            family = ['_'.join(parts[:k]) for k in range(2, len(parts))]
            family = [y for y in family
                      if os.path.exists(os.path.join(dirpath, y + '.c')) or
                      os.path.exists(os.path.join(dirpath, y + '.h'))]
            allowed = ([stem + '_'] + [y + '_' for y in family] +
                       [t + '_' for t in header_types(path[:-2] + '.h')])
            declared = declared_by_headers(dirpath, files)
            lines = open(path, encoding='utf-8', errors='replace').read().split('\n')
            for i, line in enumerate(lines):
                m = DEF.match(line)
                if not m or line.rstrip().endswith(';'):
                    continue
                # a definition: the body opens on this line or the next ones
                j = i
                while j < len(lines) and '{' not in lines[j] and not lines[j].rstrip().endswith(';'):
                    j += 1
                if j >= len(lines) or not lines[j].startswith('{') and not lines[j].rstrip().endswith('{'):
                    continue
                name = m.group(1)
                if name == stem or any(name.startswith(a) for a in allowed):
                    continue
                if any(name.startswith(y + '_') for y in declared.get(name, ())):
                    continue
                if name.startswith('mfsdp_') and name in api:
                    continue
                yield '%s:%d %s' % (os.path.relpath(path, root), i + 1, name)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    for rel in argv[2:]:
        if not os.path.isdir(os.path.join(argv[1], rel)):
            print('prefixes: %s is not a folder' % os.path.join(argv[1], rel))
            return 2
    bad = [o for rel in argv[2:] for o in offenders(argv[1], rel)]
    for o in bad:
        print(o)
    if bad:
        print('prefixes: %d exported functions do not carry their module\'s prefix' % len(bad))
        return 1
    print('prefixes: every exported function carries its module\'s prefix')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
