#!/usr/bin/env python3
"""Self-test of function_length.py on a small tree: a function of exactly
100 lines passes and one of 101 is reported at its file, line and name (in
each brace style of the tree); initializers and structs are not functions;
tests/, build folders and .cu files are not read; a bad root or limit is an
error (exit 2)."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'function_length.py')


def body(lines):
    """`lines` lines from the opening brace to the closing one, both included."""
    return '{\n' + '    x++;\n' * (lines - 2) + '}\n'


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def main():
    failures = []

    def expect(what, rc, out, want_rc, present=(), absent=()):
        if rc != want_rc or any(p not in out for p in present) or any(a in out for a in absent):
            failures.append('%s (rc %d, wanted %d):\n%s' % (what, rc, want_rc, out))

    with tempfile.TemporaryDirectory() as root:
        write(root, 'lib/a.c',
              '/* a file */\nstatic const int table[] =\n{\n' + '    1,\n' * 120 + '};\n\n'
              'typedef struct {\n' + '    int a;\n' * 120 + '} big;\n\n'
              'static int exactly_limit(int x)\n' + body(100) + '\n'
              'int\nlong_one(int x,\n         int y)   /* a comment */\n' + body(101) + '\n'
              'struct timespec returns_struct(void) {\n' + '    x++;\n' * 101 + '}\n')
        write(root, 'tests/t.c', 'int in_tests(void)\n' + body(300))
        write(root, 'build/gen.c', 'int generated(void)\n' + body(300))
        write(root, 'lib/k.cu', 'int kernel_host(void)\n' + body(300))
        rc, out = run(root)
        expect('the 101-line functions are reported', rc, out, 1,
               present=['lib/a.c:%d long_one 101 lines' % (2 + 122 + 1 + 122 + 1 + 102 + 4),
                        'returns_struct 103 lines', '2 of 3 functions in 1 files over 100 lines'],
               absent=['exactly_limit', 'in_tests', 'generated', 'kernel_host', 'table', 'big'])
        rc, out = run(root, '103')
        expect('a limit of 103 passes the tree', rc, out, 0,
               present=['all 3 functions in 1 files at most 103 lines'])
        rc, out = run(root, 'many')
        expect('a limit that is not a number', rc, out, 2, present=["LIMIT must be a whole number, not 'many'"])
        rc, out = run(os.path.join(root, 'missing'))
        expect('a root that does not exist', rc, out, 2, present=['missing is not a folder'])
    for f in failures:
        print('FAIL: ' + f)
    print('function_length_selftest: %d failure(s)' % len(failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
