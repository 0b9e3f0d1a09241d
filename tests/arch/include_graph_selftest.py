#!/usr/bin/env python3
"""Self-test of include_graph.py: a tree with a circle through a header and
a source is refused with the circle's path; the same tree without it passes;
a folder that does not exist is an error; with --layer, an include of a
header of a layer above is refused at its file and line, those of the same
layer, of a layer below and of a folder in no layer are not."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'include_graph.py')


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def run(root, *dirs):
    p = subprocess.run([sys.executable, SCRIPT, root] + list(dirs),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def layer_cases():
    """--layer: top over mid over base,lib (one layer of two folders)."""
    failures = []
    layers = ['--layer', 'top', '--layer', 'mid', '--layer', 'base,lib']
    with tempfile.TemporaryDirectory() as root:
        write(root, 'top/t.h', '#include "m.h"\n')
        write(root, 'top/t.c', '#include "t.h"\n#include "b.h"\n#include "free.h"\n')
        write(root, 'mid/m.h', '#include "b.h"\n')
        write(root, 'mid/m2.c', '#include "m.h"\n')
        write(root, 'base/b.h', '#include "l.h"\n')
        write(root, 'lib/l.h', '#include "b2.h"\n')
        write(root, 'base/b2.h', '\n')
        write(root, 'free/free.h', '#include <stddef.h>\n')
        dirs = ['top', 'mid', 'base', 'lib', 'free']
        rc, out = run(root, *(dirs + layers))
        if rc != 0 or 'no include of a layer above among 3 layers' not in out:
            failures.append('the layered tree should pass (rc %d):\n%s' % (rc, out))
        write(root, 'mid/m2.c', '#include "m.h"\n\n#include "t.h"\n')
        write(root, 'lib/l2.c', '#include "l.h"\n#include "m.h"\n')
        rc, out = run(root, *(dirs + layers))
        want = ['layer violation: mid/m2.c:3 includes t.h (top), a layer above mid',
                'layer violation: lib/l2.c:2 includes m.h (mid), a layer above base,lib',
                'include_graph: 2 includes of a layer above']
        missing = [w for w in want if w not in out]
        if rc != 1 or missing:
            failures.append('layer violations not reported, missing %s (rc %d):\n%s' % (missing, rc, out))
        rc, out = run(root, *dirs)
        if rc != 0:
            failures.append('without --layer the same tree has no circle (rc %d):\n%s' % (rc, out))
    return failures


def main():
    failures = []
    with tempfile.TemporaryDirectory() as root:
        write(root, 'lib/a.h', '#include "b.h"\n')
        write(root, 'lib/a.c', '#include "a.h"\n#include <stdio.h>\n')
        write(root, 'lib/b.h', '#include <stdint.h>\n')
        write(root, 'lib/b.c', '#include "b.h"\n\n#include "c.h"\n')
        write(root, 'other/c.h', '#include "a.h"\n')
        rc, out = run(root, 'lib', 'other')
        if rc != 1 or 'include circle: a -> b -> c -> a' not in out or 'lib/b.c:3' not in out:
            failures.append('circle a -> b -> c -> a not reported (rc %d):\n%s' % (rc, out))
        # c.h outside the folders read: no module c, no circle.
        rc, out = run(root, 'lib')
        if rc != 0 or 'no include circle among 2 modules' not in out:
            failures.append('lib alone should pass (rc %d):\n%s' % (rc, out))
        write(root, 'other/c.h', '#include <stddef.h>\n')
        rc, out = run(root, 'lib', 'other')
        if rc != 0 or 'no include circle among 3 modules' not in out:
            failures.append('the tree without the circle should pass (rc %d):\n%s' % (rc, out))
        rc, out = run(root, 'missing')
        if rc != 1 or 'missing is not a folder' not in out:
            failures.append('a missing folder should be an error (rc %d):\n%s' % (rc, out))
    failures += layer_cases()
    for f in failures:
        print('FAIL: ' + f)
    print('include_graph_selftest: %d failure(s)' % len(failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
