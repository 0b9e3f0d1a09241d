#!/usr/bin/env python3
"""Self-test of check_reliability_numbers.py on small pages with given
figures (--figures, so nothing is configured): a page whose every claim is
right passes; a wrong number (digits or a word, in prose or a table row, in a
sentence over several lines), a claim no sentence states any more and a count
typed outside any claim each fail naming the line and the sentence; --fix
rewrites stale numbers to the page that passes."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'check_reliability_numbers.py')

FIGURES = {
    'fuzz.targets': 5, 'fuzz.seconds': 60, 'soak.fuzz_seconds': 300,
    'change.sanitize.tests': 170, 'change.plain.tests': 190, 'change.plain_nocuda.tests': 181,
    'change.plain.only': 20, 'change.plain_nocuda.only': 11,
    'change.plain.only.label.python': 9, 'change.plain.only.label.valgrind': 1,
    'change.sanitize.crash_local_kills': 10, 'change.plain.crash_mpi_kills': 10,
    'soak.plain.tests': 196, 'soak.plain.crash_local_kills': 200, 'soak.plain.crash_local_tests': 4,
    'soak.plain.crash_mpi_kills': 200, 'soak.plain.crash_mpi_tests': 4,
    'soak.sanitize.tests': 173, 'soak.sanitize.crash_local_kills': 40, 'soak.sanitize.crash_mpi_kills': 10,
    'fault_replay.kills': 3, 'fault_replay.stops': 2,
}

# Every claim, right; line 3's sentence runs over two lines.
GOOD = """# Reliability

Five targets, each a fuzzer. Per change the sanitizer build registers 170 tests
and runs them all. The plain build registers 190 tests (181 without the CUDA toolkit) and
runs only the 20 the sanitizer build does not register (11 without the toolkit): the 9 Python
tests, valgrind's leak check (label `valgrind`, 1 test).
The smoke is 10 SIGKILL trials on the local backend under the sanitizers and 10 under mpirun in the plain build.

Nightly: the plain build's whole suite, 196 tests: 200 SIGKILL trials on the local backend
(4 tests of 50) and 200 under mpirun (4 of 50); the whole sanitize suite, 173 tests (40
trials on the local backend, 10 under mpirun); every target for 300 s each with fresh seeds.

| fuzzing | 60 s per target in the `fuzz` preset | one rank SIGKILLed at a random point (3 trials) or SIGSTOPped (2) |
| faults | killed (3 trials per run) | stopped for the timeout + 3 s (2 trials) |

The sanitize preset runs the whole C suite (170 tests per change). It hung in 7 of 7 trials before.

```sh
bash .ci/test   # 12 tests here are not prose
```
"""


def run(page_text, *flags):
    """(exit status, output, the page afterwards) of the check on page_text."""
    with tempfile.TemporaryDirectory() as d:
        page, figs = os.path.join(d, 'page.md'), os.path.join(d, 'figures.txt')
        with open(page, 'w') as f:
            f.write(page_text)
        with open(figs, 'w') as f:
            f.write(''.join('%s = %s\n' % kv for kv in FIGURES.items()))
        p = subprocess.run([sys.executable, SCRIPT] + list(flags) + [page, '--figures', figs],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with open(page) as f:
            return p.returncode, p.stdout.replace(page, 'page.md'), f.read()


def edit(old, new):
    assert GOOD.count(old) == 1, old
    return GOOD.replace(old, new)


# (what, the edit of GOOD, what the output must say)
FAULTS = [
    ('a number word wrong', ('Five targets', 'Four targets'),
     ['page.md:3: error: fuzz targets: the page says 4, the suite has 5 (fuzz.targets): "Four targets']),
    ('a sentence over two lines', ('(181 without', '(180 without'),
     ['page.md:4: error: the per-change plain build: the page says 180, the suite has 181', 'runs only the 20']),
    ('a table row', ('(3 trials per run)', '(4 trials per run)'),
     ['page.md:14: error: the fault replay kills: the page says 4, the suite has 3']),
    ('a derived figure (kills per test)', ('(4 tests of 50)', '(4 tests of 40)'),
     ['the soak crash campaigns: the page says 40, the suite has 50 (computed)']),
    ('a claim stated nowhere', ('for 300 s each with fresh seeds', 'with fresh seeds'),
     ['page.md: error: no sentence states the soak fuzzing any more']),
    ('a count outside every claim', ('It hung in 7 of 7 trials before.', 'It also has 12 tests of its own.'),
     ['page.md:16: error: "12 tests" counts the suite by hand']),
]


class ReliabilityNumbers(unittest.TestCase):
    def test_every_claim_right(self):
        rc, out, _ = run(GOOD)
        self.assertEqual(rc, 0, out)
        self.assertIn('16 claim(s), 0 error(s)', out)

    def test_each_fault_named(self):
        for what, (old, new), present in FAULTS:
            with self.subTest(what):
                rc, out, _ = run(edit(old, new))
                self.assertEqual(rc, 1, out)
                for p in present:
                    self.assertIn(p, out)

    def test_fix_rewrites_stale_numbers(self):
        stale = GOOD.replace('Five targets', 'Four targets').replace('190 tests (181', '188 tests (179')
        stale = stale.replace('(4 tests of 50)', '(4 tests of 40)')
        rc, out, fixed = run(stale, '--fix')
        self.assertEqual(rc, 0, out)
        self.assertIn('4 number(s) rewritten', out)
        self.assertEqual(fixed, GOOD)


if __name__ == '__main__':
    unittest.main()
