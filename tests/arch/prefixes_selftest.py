#!/usr/bin/env python3
"""Self-test of prefixes.py on a small tree: an exported function named for
its file's stem, its family (a shorter stem that is a module of the same
folder), a type its header declares or the runtime's public API passes; any
other is reported at its file and line; static functions and prototypes are
not read; the tree without the offenders passes; a folder that does not
exist is an error (exit 2)."""
import os
import subprocess
import sys
import tempfile

from include_graph_selftest import write   # the same tree writer (this folder)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'prefixes.py')


def run(root, *dirs):
    p = subprocess.run([sys.executable, SCRIPT, root] + list(dirs),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


OFFENDERS = {
    'lib/mf_a.c': 'int mf_stray(void)\n{\n    return 0;\n}\n',
    'lib/mf_b_part.c': 'int mf_c_thing(int x) {\n    return x;\n}\n',
    # mf_b is a module of lib/, not of other/: no family here.
    'other/mf_b_far.c': 'int mf_b_far_ok(void)\n{\n    return 0;\n}\n\n'
                        'int mf_b_elsewhere(void)\n{\n    return 0;\n}\n',
    'runtime/engine/mf_e.c': 'int mfsdp_unlisted(void)\n{\n    return 0;\n}\n',
    # mf_c.h declares mf_c_split, not mf_c_undeclared.
    'lib/mf_d.c': 'int mf_c_undeclared(void)\n{\n    return 0;\n}\n',
}


def tree(root):
    write(root, 'lib/mf_a.h', 'typedef struct mf_thing {\n    int n;\n} mf_thing;\n'
                              'typedef enum { MF_X } mf_kind;\n')
    write(root, 'lib/mf_a.c', '#include "mf_a.h"\n\n'
                              'int mf_a(void)\n{\n    return 0;\n}\n\n'
                              'int mf_a_count(const mf_thing *t)\n{\n    return t->n;\n}\n\n'
                              'const char *mf_thing_name(void)\n{\n    return "t";\n}\n\n'
                              'int mf_kind_of(void)\n{\n    return MF_X;\n}\n\n'
                              'static int mf_helper(void)\n{\n    return 0;\n}\n\n'
                              'int mf_declared_elsewhere(void);\n')
    write(root, 'lib/mf_b.h', 'int mf_b_thing(void);\n')
    write(root, 'lib/mf_b_part.c', '#include "mf_b.h"\n\n'
                                   'int mf_b_thing(void)\n{\n    return 1;\n}\n')
    write(root, 'other/mf_b_far.c', 'int mf_b_far_ok(void)\n{\n    return 0;\n}\n')
    # a module split over files: mf_c.h declares what mf_d.c defines
    write(root, 'lib/mf_c.h', 'int mf_c_split(void);\n')
    write(root, 'lib/mf_d.c', '#include "mf_c.h"\n\nint mf_c_split(void)\n{\n    return 2;\n}\n')
    write(root, 'runtime/include/mfsdp/mfsdp.h', 'int mfsdp_start(int n);\n')
    write(root, 'runtime/engine/mf_e.c', 'int mfsdp_start(int n)\n{\n    return n;\n}\n')


def expect(failures, ok, what, rc, out):
    """Records `what` with the run's exit status and output unless ok."""
    if not ok:
        failures.append('%s (rc %d):\n%s' % (what, rc, out))


def main():
    failures = []
    with tempfile.TemporaryDirectory() as root:
        tree(root)
        rc, out = run(root, 'lib', 'other', 'runtime')
        expect(failures, rc == 0 and "every exported function carries its module's prefix" in out,
               'the clean tree should pass', rc, out)
        for rel, text in OFFENDERS.items():
            with open(os.path.join(root, rel), 'a') as f:
                f.write('\n' + text)
        rc, out = run(root, 'lib', 'other', 'runtime')
        want = ['lib/mf_a.c:30 mf_stray', 'lib/mf_b_part.c:8 mf_c_thing',
                'other/mf_b_far.c:11 mf_b_elsewhere', 'runtime/engine/mf_e.c:6 mfsdp_unlisted',
                'lib/mf_d.c:8 mf_c_undeclared',
                "prefixes: 5 exported functions do not carry their module's prefix"]
        missing = [w for w in want if w not in out]
        expect(failures, rc == 1 and not missing, 'offenders not reported, missing %s' % missing, rc, out)
        passing = ('mf_a\n', 'mf_a_count', 'mf_thing_name', 'mf_kind_of', 'mf_helper',
                   'mf_declared_elsewhere', 'mf_b_thing', 'mf_b_far_ok', 'mfsdp_start', 'mf_c_split')
        reported = [name.strip() for name in passing if name in out]
        expect(failures, not reported, '%s reported, but carry their prefix or are not exported'
               % reported, rc, out)
        # only the folders named are read
        rc, out = run(root, 'other')
        expect(failures, rc == 1 and 'lib/' not in out and '1 exported functions' in out,
               'other alone: one offender, nothing of lib', rc, out)
        rc, out = run(root, 'missing')
        expect(failures, rc == 2 and 'missing is not a folder' in out,
               'a missing folder should be an error', rc, out)
    sys.stdout.write(''.join('FAIL: %s\n' % f for f in failures))
    print('prefixes_selftest: %d failure(s)' % len(failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
