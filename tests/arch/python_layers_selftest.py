#!/usr/bin/env python3
"""Self-test of python_layers.py: a layered package (pkg/: top over mid over
base, with a subpackage) passes with its type-only and function-local
imports of a layer above, the latter allowed by --local-up; then a
module-level import of a layer above (relative, absolute, in a class body,
under try), a function-local one not allowed, a module in no layer, a layer
naming no module and a --local-up pair nothing uses are each reported at
their file and line; an `else:` of `if TYPE_CHECKING:` is run, so counted."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'python_layers.py')
LAYERS = ['--layer', '__init__,sub/__init__', '--layer', 'top', '--layer', 'sub/mid',
          '--layer', 'base,sub/low']


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def run(pkg, *args):
    p = subprocess.run([sys.executable, SCRIPT, pkg] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def clean_tree(root):
    pkg = os.path.join(root, 'pkg')
    write(root, 'pkg/__init__.py', 'from .top import T\nfrom . import base\n')
    write(root, 'pkg/sub/__init__.py', 'from .mid import M\n')
    write(root, 'pkg/top.py', 'import os\nfrom .sub.mid import M\nimport pkg.base\n'
                              'class T:\n    pass\n')
    write(root, 'pkg/sub/mid.py',
          'from typing import TYPE_CHECKING\nfrom .low import L\nfrom .. import base\n'
          'if TYPE_CHECKING:\n    from ..top import T\n\n'
          'def save(m):\n    from ..top import T\n    return T\n')
    write(root, 'pkg/sub/low.py', 'from ..base import B\n')
    write(root, 'pkg/base.py', 'import json\nB = 1\n\ndef f():\n    from .sub import low\n'
                               '    return low\n')
    return pkg


def main():
    failures = []
    with tempfile.TemporaryDirectory() as root:
        pkg = clean_tree(root)
        up = ['--local-up', 'sub/mid:top']
        rc, out = run(pkg, *(LAYERS + up))
        if rc != 0 or 'no import of a layer above' not in out:
            failures.append('the layered package should pass (rc %d):\n%s' % (rc, out))
        rc, out = run(pkg, *LAYERS)
        want = 'pkg/sub/mid.py:8: function-local import of top (layer top) in sub/mid'
        if rc != 1 or want not in out or 'not an allowed --local-up sub/mid:top' not in out:
            failures.append('an upward function-local import not allowed should be refused '
                            '(rc %d):\n%s' % (rc, out))
        write(root, 'pkg/sub/low.py', 'from ..base import B\nfrom ..top import T\n')
        write(root, 'pkg/base.py', 'import json\n\nclass K:\n    import pkg.sub.mid\n'
                                   'try:\n    from .sub import mid\nexcept ImportError:\n'
                                   '    pass\n')
        write(root, 'pkg/sub/mid.py',
              'from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n'
              '    from .. import top\n\ndef save(m):\n    from ..top import T\n')
        write(root, 'pkg/extra.py', 'X = 1\n')
        rc, out = run(pkg, *(LAYERS + up + ['--local-up', 'base:top',
                                            '--layer', 'gone']))
        want = [os.path.join(pkg, 'sub', 'low.py') + ':2: module-level import of top (layer top) '
                'in sub/low (layer base,sub/low): a layer above',
                os.path.join(pkg, 'base.py') + ':4: module-level import of sub/mid',
                os.path.join(pkg, 'base.py') + ':6: module-level import of sub/mid',
                os.path.join(pkg, 'sub', 'mid.py') + ':5: module-level import of top',
                "module 'extra' is in no layer",
                "layer gone names 'gone', which is no module",
                '--local-up base:top is used by no function-local import',
                'python_layers: 7 problems']
        missing = [w for w in want if w not in out]
        if rc != 1 or missing:
            failures.append('violations not reported, missing %s (rc %d):\n%s' % (missing, rc, out))
        if 'mid.py:8' in out:
            failures.append('the allowed function-local import was reported:\n%s' % out)
        rc, out = run(os.path.join(root, 'nowhere'), *LAYERS)
        if rc != 2:
            failures.append('a package folder that does not exist should be exit 2 (rc %d):\n%s'
                            % (rc, out))
    for f in failures:
        print('FAIL: ' + f)
    if failures:
        return 1
    print('python_layers_selftest: all cases as expected')
    return 0


if __name__ == '__main__':
    sys.exit(main())
