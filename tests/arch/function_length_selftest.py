#!/usr/bin/env python3
"""Self-test of function_length.py on a small tree: a function of exactly
100 lines passes and one of 101 is reported at its file, line and name (in
each brace style of the tree); initializers and structs are not functions;
tests/ (but tests/gpumodel), build folders and .cu files are not read; a bad root or limit is an
error (exit 2). With --python: the same limit over python/**.py, a function
or method from its `def` line to its last, decorators aside."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'function_length.py')


def body(lines):
    """`lines` lines from the opening brace to the closing one, both included."""
    return '{\n' + '    x++;\n' * (lines - 2) + '}\n'


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


class FunctionLength(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = cls.tmp.name
        files = {
            'lib/a.c': '/* a file */\nstatic const int table[] =\n{\n' + '    1,\n' * 120 + '};\n\n'
                       'typedef struct {\n' + '    int a;\n' * 120 + '} big;\n\n'
                       'static int exactly_limit(int x)\n' + body(100) + '\n'
                       'int\nlong_one(int x,\n         int y)   /* a comment */\n' + body(101) + '\n'
                       'struct timespec returns_struct(void) {\n' + '    x++;\n' * 101 + '}\n',
            'tests/t.c': 'int in_tests(void)\n' + body(300),
            'tests/gpumodel/m.c': 'int in_the_model(void)\n' + body(101),
            'build/gen.c': 'int generated(void)\n' + body(300),
            'lib/k.cu': 'int kernel_host(void)\n' + body(300),
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(cls.root, rel)), exist_ok=True)
            with open(os.path.join(cls.root, rel), 'w') as f:
                f.write(text)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_over_the_limit_reported(self):
        rc, out = run(self.root)
        self.assertEqual(rc, 1, out)
        # long_one's brace: after the table (122 lines), the struct (122), the
        # 100-line function and the blank lines between them.
        self.assertIn('lib/a.c:354 long_one 101 lines', out)
        self.assertIn('returns_struct 103 lines', out)
        self.assertIn('tests/gpumodel/m.c:2 in_the_model 101 lines', out)
        self.assertIn('3 of 4 functions in 2 files over 100 lines', out)
        for name in ('exactly_limit', 'in_tests', 'generated', 'kernel_host', 'table', 'big'):
            self.assertNotIn(name, out)

    def test_higher_limit_passes(self):
        rc, out = run(self.root, '103')
        self.assertEqual(rc, 0, out)
        self.assertIn('all 4 functions in 2 files at most 103 lines', out)

    def test_bad_arguments(self):
        rc, out = run(self.root, 'many')
        self.assertEqual((rc, "LIMIT must be a whole number, not 'many'" in out), (2, True), out)
        rc, out = run(os.path.join(self.root, 'missing'))
        self.assertEqual((rc, 'missing is not a folder' in out), (2, True), out)


def py_def(name, lines, indent=''):
    """A def of `lines` lines from its `def` line to its last, both included."""
    return (indent + '@decorated\n' + indent + 'def %s(x):\n' % name
            + (indent + '    x += 1\n') * (lines - 2) + indent + '    return x\n')


class PythonFunctionLength(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = cls.tmp.name
        files = {
            'python/pkg/a.py': '"""a module"""\n' + py_def('exactly_limit', 100) + '\n'
                               'class Thing:\n' + py_def('long_method', 101, '    ') + '\n'
                               + py_def('outer', 30),
            'python/pkg/__pycache__/b.py': py_def('cached', 300),
            'lib/c.py': py_def('outside_python', 300),
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(cls.root, rel)), exist_ok=True)
            with open(os.path.join(cls.root, rel), 'w') as f:
                f.write(text)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_over_the_limit_reported(self):
        rc, out = run('--python', self.root)
        self.assertEqual(rc, 1, out)
        # the docstring, a decorator, 100 lines, a blank, `class`, a decorator: line 106
        self.assertIn('python/pkg/a.py:106 Thing.long_method 101 lines', out)
        self.assertIn('1 of 3 Python functions in 1 files over 100 lines', out)
        for name in ('exactly_limit', 'outer', 'cached', 'outside_python'):
            self.assertNotIn(name, out)

    def test_higher_limit_passes(self):
        rc, out = run('--python', self.root, '101')
        self.assertEqual(rc, 0, out)
        self.assertIn('all 3 Python functions in 1 files at most 101 lines', out)

    def test_no_python_folder(self):
        rc, out = run('--python', os.path.join(self.root, 'lib'))
        self.assertEqual((rc, 'is not a folder' in out), (2, True), out)


if __name__ == '__main__':
    unittest.main()
