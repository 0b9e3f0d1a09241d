#!/usr/bin/env python3
"""function_length: no function of the libraries and tools over 100 lines.

Every function defined in a .c file of the tree, outside tests/ (and outside
CUDA sources: .cu files are not read), is at most LIMIT lines long -- and so
is every function of tests/gpumodel, the CPU model of CUDA and NCCL, a
library in its own right (docs/design.md §5) -- counted
from the line of its opening `{` to the line of its closing `}` at column 0,
both included. The tree's style puts a function's braces at column 0 and
everything inside them indented, so the first `}` at column 0 after the
opening brace closes it. Each offender is printed as `file:line name N lines`
(the line of the opening brace); exit 1 when there is one.

    function_length.py ROOT [LIMIT]      (LIMIT: 100)

Skipped: tests/ but tests/gpumodel, build folders (build*), out/ and hidden
folders.

With --python, the same limit for every function and method of the .py
files under ROOT/python (hidden folders and __pycache__ skipped), counted
from its `def` line to its last line, both included (decorators aside; a
nested function counts in its own right and inside the one around it):

    function_length.py --python ROOT [LIMIT]
"""
import ast
import os
import re
import sys

LIMIT = 100
SKIPPED_TOP = ('tests', 'out')
# Folders under tests/ that hold libraries, read all the same.
READ_UNDER_TESTS = ('gpumodel',)
# The last identifier before the parameter list's `(`: the function's name.
NAME = re.compile(r'([A-Za-z_]\w*)\s*\(')
# A signature that opens its body on the same line: `int f(void) {`.
SAME_LINE = re.compile(r'^[A-Za-z_].*\)\s*\{\s*$')
# A comment after the signature: `int f(void)   /* why */`.
TRAILING_COMMENT = re.compile(r'\s*(/\*.*\*/|//.*)$')


def c_files(root):
    """The .c files to read, relative to root, sorted."""
    out = []
    tops = [('.', root)] + [(os.path.join('tests', d), os.path.join(root, 'tests', d))
                            for d in READ_UNDER_TESTS]
    for top, path in tops:
        for dirpath, dirs, names in os.walk(path):
            rel = os.path.normpath(os.path.join(top, os.path.relpath(dirpath, path)))
            if rel == '.':
                dirs[:] = [d for d in dirs if d not in SKIPPED_TOP and not d.startswith('build')]
            dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
            out += [os.path.normpath(os.path.join(rel, n)) for n in sorted(names) if n.endswith('.c')]
    return out


def signature_before(lines, brace):
    """The text of the signature that ends just above line `brace` (the
    lines back to the last one starting at column 0), or None when the brace
    opens no function (an initializer, a struct, a blank line above)."""
    k = brace - 1
    while k >= 0 and lines[k].strip() == '':
        k -= 1
    if k < 0 or not TRAILING_COMMENT.sub('', lines[k].rstrip()).endswith(')'):
        return None
    start = k
    while start > 0 and lines[start][:1] in (' ', '\t'):
        start -= 1
    return ' '.join(l.strip() for l in lines[start:k + 1])


def functions(lines):
    """(opening line index, name, length in lines) of every function."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i].rstrip('\n')
        sig = None
        if line.rstrip() == '{':
            sig = signature_before(lines, i)
        elif SAME_LINE.match(line):
            sig = line
        if sig is None:
            i += 1
            continue
        names = NAME.findall(sig.split('(')[0] + '(')
        end = i + 1
        while end < len(lines) and not lines[end].startswith('}'):
            end += 1
        out.append((i, names[-1] if names else '?', end - i + 1))
        i = end + 1
    return out


def py_files(top):
    """The .py files under top, relative to top, sorted."""
    out = []
    for dirpath, dirs, names in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        dirs[:] = sorted(d for d in dirs if not d.startswith('.') and d != '__pycache__')
        out += [os.path.normpath(os.path.join(rel, n)) for n in sorted(names) if n.endswith('.py')]
    return out


def py_functions(text, path):
    """(def line, qualified name, length in lines) of every function."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((child.lineno, name, child.end_lineno - child.lineno + 1))
                visit(child, name + '.')
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + '.')
            else:
                visit(child, prefix)
    visit(ast.parse(text, filename=path), '')
    return out


def python_main(root, limit):
    top = os.path.join(root, 'python')
    if not os.path.isdir(top):
        sys.stderr.write('function_length: %s is not a folder\n' % top)
        return 2
    files = py_files(top)
    over, count = [], 0
    for rel in files:
        path = os.path.join(top, rel)
        with open(path, encoding='utf-8', errors='replace') as f:
            text = f.read()
        try:
            found = py_functions(text, path)
        except SyntaxError as e:
            print('python/%s:%s: error: does not parse: %s' % (rel, e.lineno, e.msg))
            return 1
        for line, name, n in found:
            count += 1
            if n > limit:
                over.append('python/%s:%d %s %d lines' % (rel, line, name, n))
    for o in over:
        print(o)
    if over:
        print('function_length: %d of %d Python functions in %d files over %d lines'
              % (len(over), count, len(files), limit))
        return 1
    print('function_length: all %d Python functions in %d files at most %d lines' % (count, len(files), limit))
    return 0


def main(argv):
    python = len(argv) > 1 and argv[1] == '--python'
    if python:
        argv = argv[:1] + argv[2:]
    if len(argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    root = argv[1]
    if not os.path.isdir(root):
        sys.stderr.write('function_length: %s is not a folder\n' % root)
        return 2
    try:
        limit = int(argv[2]) if len(argv) == 3 else LIMIT
    except ValueError:
        sys.stderr.write('function_length: LIMIT must be a whole number, not %r\n' % argv[2])
        return 2
    if python:
        return python_main(root, limit)
    files = c_files(root)
    over, count = [], 0
    for rel in files:
        with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
            lines = f.readlines()
        for i, name, n in functions(lines):
            count += 1
            if n > limit:
                over.append('%s:%d %s %d lines' % (rel, i + 1, name, n))
    for o in over:
        print(o)
    if over:
        print('function_length: %d of %d functions in %d files over %d lines'
              % (len(over), count, len(files), limit))
        return 1
    print('function_length: all %d functions in %d files at most %d lines' % (count, len(files), limit))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
