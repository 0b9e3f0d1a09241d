#!/usr/bin/env python3
"""check_reliability_numbers: the counts docs/reliability.md states about the
test suite are the suite's, computed, not typed.

The figures (tests per build and tier, tests per label, SIGKILL trials, fuzz
targets and seconds) come from suite_figures.py, which configures the
presets and lists their tests. Every claim below is a pattern of a sentence
of the page (or a table row) with the figures it states; the check fails

  - when a sentence states another number than the figure computed,
  - when no sentence states a claim any more (the check would test nothing),
  - when a sentence counts tests, targets or trials that no claim covers (a
    new number typed by hand: add a claim, or say it without the number),

printing `PAGE:LINE: error: ...` with the sentence. Exit 1 on any error.

    check_reliability_numbers.py [--fix] PAGE SOURCE_DIR [PYTHON]
    check_reliability_numbers.py [--fix] PAGE --figures FILE   (suite_figures.py's output)

--fix first rewrites the page's claimed numbers to the computed ones (after
adding or removing tests), then checks.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_figures  # noqa: E402

WORDS = {w: i for i, w in enumerate('zero one two three four five six seven eight nine ten eleven twelve '
                                    'thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty'.split())}
N = r'(\d{1,3}(?: \d{3})*|(?i:%s))' % '|'.join(WORDS)

# (what, sentence pattern, the figure of each group: a name or a function of the figures)
CLAIMS = [
    ('fuzz targets', r'\b%s (?:libFuzzer |fuzz )?targets\b' % N, ['fuzz.targets']),
    ('the per-change sanitizer build', r'[Pp]er change\b.*\bthe sanitizer build registers %s tests' % N,
     ['change.sanitize.tests']),
    ('the per-change plain build', r'[Pp]lain build registers %s tests \(%s without the CUDA toolkit\)' % (N, N),
     ['change.plain.tests', 'change.plain_nocuda.tests']),
    ('the tests only the plain build runs per change',
     r'runs only the %s the sanitizer build does not register \(%s without the toolkit\)' % (N, N),
     ['change.plain.only', 'change.plain_nocuda.only']),
    ('the Python tests only the plain build runs', r'\bthe %s Python tests\b' % N, ['change.plain.only.label.python']),
    ('the valgrind tests', r'label `valgrind`, %s tests?\b' % N, ['change.plain.only.label.valgrind']),
    ('the per-change crash smoke',
     r'%s SIGKILL trials on the local backend under the sanitizers and %s under mpirun in the plain build' % (N, N),
     ['change.sanitize.crash_local_kills', 'change.plain.crash_mpi_kills']),
    ('the soak plain suite', r"the plain build's whole suite, %s tests" % N, ['soak.plain.tests']),
    ('the soak crash campaigns',
     r'%s SIGKILL trials on the local backend \(%s tests of %s\) and %s under mpirun \(%s of %s\)' % ((N,) * 6),
     ['soak.plain.crash_local_kills', 'soak.plain.crash_local_tests', lambda f: per_test(f, 'soak.plain', 'local'),
      'soak.plain.crash_mpi_kills', 'soak.plain.crash_mpi_tests', lambda f: per_test(f, 'soak.plain', 'mpi')]),
    ('the soak sanitize suite',
     r'the whole sanitize suite, %s tests \(%s trials on the local backend, %s under mpirun\)' % (N, N, N),
     ['soak.sanitize.tests', 'soak.sanitize.crash_local_kills', 'soak.sanitize.crash_mpi_kills']),
    ('the soak fuzzing', r'for %s s each with fresh seeds' % N, ['soak.fuzz_seconds']),
    ('the bounded fuzz runs', r'\b%s s per target in the `fuzz` preset' % N, ['fuzz.seconds']),
    ('the sanitizer suite per change', r'runs the whole C suite \(%s tests per change\)' % N,
     ['change.sanitize.tests']),
    ('the fault replay trials', r'SIGKILLed at a random point \(%s trials\) or SIGSTOPped \(%s\)' % (N, N),
     ['fault_replay.kills', 'fault_replay.stops']),
    ('the fault replay kills', r'\(%s trials per run\)' % N, ['fault_replay.kills']),
    ('the fault replay stops', r'for the timeout \+ 3 s \(%s trials\)' % N, ['fault_replay.stops']),
]
# A count of the suite typed in a sentence: must be covered by a claim (a
# ratio of a measurement, "7 of 7 trials", is not one).
COUNT = re.compile(r'(?<!of )\b%s (?:tests|(?:libFuzzer |fuzz )?targets|(?:SIGKILL )?trials|kills)\b' % N)


def per_test(fig, key, backend):
    tests = fig.get('%s.crash_%s_tests' % (key, backend))
    kills = fig.get('%s.crash_%s_kills' % (key, backend))
    return None if not tests else kills // tests


def number(text):
    t = text.replace(' ', '').lower()
    return WORDS[t] if t in WORDS else int(t)


def sentences(lines):
    """(line number, text) of every sentence and table row of the page, a
    sentence at the line where it begins; fenced code and headings are
    skipped; a sentence ends at '. ' (or ': ', '; ') before a capital or
    a code span, or at a blank line."""
    out, para, fenced = [], [], False

    def flush():
        text, starts = '', []
        for i, s in para:
            starts.append((len(text), i))
            text += s + ' '
        for m in re.finditer(r'\S.*?(?:[.:;](?=\s+[A-Z`*(])|$)', text.strip()):
            line = max(i for off, i in starts if off <= m.start())
            out.append((line, m.group(0)))
        para.clear()

    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith('```'):
            flush()
            fenced = not fenced
        elif fenced:
            continue
        elif not s or s.startswith('|') or s.startswith('#'):
            flush()
            if s.startswith('|'):
                out.append((i, s))
        else:
            para.append((i, s))
    flush()
    return out


def check(page, fig):
    with open(page) as f:
        lines = f.read().split('\n')
    errors, seen = [], set()
    for line, text in sentences(lines):
        spans = []
        for what, pattern, keys in CLAIMS:
            for m in re.finditer(pattern, text):
                seen.add(what)
                spans.append((m.start(), m.end()))
                for group, key in enumerate(keys, 1):
                    if not callable(key) and key not in fig:
                        raise KeyError('no figure %s (suite_figures.py computes: %s)' % (key, ', '.join(sorted(fig))))
                    want = key(fig) if callable(key) else fig[key]
                    if want is None:
                        continue   # not computable here (no CUDA toolkit, no MPI)
                    said = number(m.group(group))
                    if said != want:
                        errors.append('%s:%d: error: %s: the page says %d, the suite has %d (%s): "%s"'
                                      % (page, line, what, said, want,
                                         key if isinstance(key, str) else 'computed', text))
        for m in COUNT.finditer(text):
            if not any(a <= m.start() < b for a, b in spans):
                errors.append('%s:%d: error: "%s" counts the suite by hand; add a claim to '
                              'tests/docs/check_reliability_numbers.py or drop the number: "%s"'
                              % (page, line, m.group(0), text))
    for what, _, _ in CLAIMS:
        if what not in seen:
            errors.append('%s: error: no sentence states %s any more (the claim of '
                          'tests/docs/check_reliability_numbers.py matches nothing)' % (page, what))
    return errors


def read_figures(path):
    fig = {}
    with open(path) as f:
        for line in f:
            if ' = ' in line:
                k, v = line.rstrip('\n').split(' = ', 1)
                fig[k] = {'True': True, 'False': False, 'None': None}[v] if v in ('True', 'False', 'None') else int(v)
    return fig


def spelled(want, said):
    """want written as the page wrote said: digits, or a word in its case."""
    if said[0].isdigit() or want not in WORDS.values():
        return '{:,}'.format(want).replace(',', ' ')
    word = [w for w, i in WORDS.items() if i == want][0]
    return word.capitalize() if said[0].isupper() else word


def fix(page, fig):
    """Rewrites every claimed number of the page that differs from its figure
    (the claims matched over the raw text, white space between words free);
    returns how many were rewritten. The page is replaced only when it changed."""
    with open(page) as f:
        text = f.read()
    edits = []
    for _, pattern, keys in CLAIMS:
        for m in re.finditer(pattern.replace(' ', r'\s+'), text):
            for group, key in enumerate(keys, 1):
                want = key(fig) if callable(key) else fig.get(key)
                if want is not None and number(re.sub(r'\s+', ' ', m.group(group))) != want:
                    edits.append((m.start(group), m.end(group), spelled(want, m.group(group))))
    for start, end, new in sorted(set(edits), reverse=True):
        text = text[:start] + new + text[end:]
    if edits:
        tmp = page + '.tmp'
        with open(tmp, 'w') as f:
            f.write(text)
        os.replace(tmp, page)
    return len(set(edits))


def main(argv):
    args = argv[1:]
    fixing = '--fix' in args
    if fixing:
        args.remove('--fix')
    if len(args) == 3 and args[1] == '--figures':
        fig = read_figures(args[2])
    elif len(args) in (2, 3):
        src = os.path.abspath(args[1])
        python = args[2] if len(args) == 3 else os.path.join(src, 'build', 'venv', 'bin', 'python')
        try:
            fig = suite_figures.figures(src, python)
        except suite_figures.FigureError as e:
            sys.stderr.write('check_reliability_numbers: %s\n' % e)
            return 1
    else:
        sys.stderr.write(__doc__)
        return 2
    page = args[0]
    if fixing:
        print('check_reliability_numbers: %d number(s) rewritten in %s' % (fix(page, fig), page))
    errors = check(page, fig)
    for e in errors:
        print(e)
    print('check_reliability_numbers: %d claim(s), %d error(s)' % (len(CLAIMS), len(errors)))
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
