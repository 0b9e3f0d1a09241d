#!/usr/bin/env python3
"""suite_figures: the numbers of the test suite, computed from the build system.

Configures the plain and the sanitizer presets for each tier of
MFSDP_TEST_TIER into a scratch folder (configure only, nothing is built),
lists each one's tests with `ctest --show-only=json-v1`, and derives from the
lists and from the sources the figures docs/reliability.md states: tests per
build and tier, the tests only the plain build registers, tests per label,
SIGKILL trials per backend, fuzz targets, fuzz seconds. The plain build is
configured once more without CUDA (MFSDP_WITH_CUDA=OFF) when CUDA was found,
since the CUDA-linked tests are registered only with the toolkit.

    suite_figures.py SOURCE_DIR [PYTHON]   prints every figure as `name = value`

MFSDP_CMAKE and MFSDP_CTEST name the cmake and ctest to use (default: PATH's).

PYTHON is the tests' Python (MFSDP_PYTHON; by default the source tree's
build/venv, as in tests/CMakeLists.txt), so the Python tests are registered
exactly as in the build that runs this.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TIERS = ('change', 'soak')
CMAKE = os.environ.get('MFSDP_CMAKE', 'cmake')    # the build's own cmake and ctest, when set
CTEST = os.environ.get('MFSDP_CTEST', 'ctest')


class FigureError(Exception):
    """A figure that cannot be computed (a configure that failed, a source
    that no longer has the line read)."""


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise FigureError('%s failed (exit %d):\n%s' % (' '.join(cmd), p.returncode, p.stdout[-3000:]))
    return p.stdout


def cache_value(build, name):
    with open(os.path.join(build, 'CMakeCache.txt')) as f:
        for line in f:
            if line.startswith(name + ':'):
                return line.rstrip('\n').split('=', 1)[1]
    return ''


def list_tests(src, build):
    """{name: {'command': [...], 'labels': [...]}} of a configured build.
    ctest runs on a copy of the build's CTestTestfile.cmake files, so that
    nothing is written into the build (ctest -N leaves a log there)."""
    with tempfile.TemporaryDirectory() as copy:
        for dirpath, _, names in os.walk(build):
            if 'CTestTestfile.cmake' in names:
                dst = os.path.join(copy, os.path.relpath(dirpath, build))
                os.makedirs(dst, exist_ok=True)
                shutil.copy(os.path.join(dirpath, 'CTestTestfile.cmake'), dst)
        out = run([CTEST, '--show-only=json-v1', '--test-dir', copy], src)
    tests = {}
    for t in json.loads(out[out.index('{'):])['tests']:
        props = {p['name']: p['value'] for p in t.get('properties', [])}
        tests[t['name']] = {'command': t.get('command', []), 'labels': props.get('LABELS', [])}
    return tests


def configure(src, build, preset, options):
    run([CMAKE, '--preset', preset, '-B', build] + ['-D%s=%s' % kv for kv in options], src)


def kills(tests, backend):
    """(tests, SIGKILL trials in all) of crash.sh on the backend: its TRIALS
    argument is the one after the schedule (crash.sh BACKEND TRAINER CKPT
    SCHEDULE TRIALS SEED)."""
    crash = [t for n, t in tests.items() if n.startswith('ckpt_crash_%s_' % backend)]
    return len(crash), sum(int(t['command'][-2]) for t in crash)


def source_figure(path, pattern, what):
    with open(path) as f:
        m = re.search(pattern, f.read(), re.M)
    if not m:
        raise FigureError('%s: no longer has %s (/%s/)' % (path, what, pattern))
    return m.group(1)


def build_figures(fig, key, tests):
    fig[key + '.tests'] = len(tests)
    for label in ('python', 'valgrind', 'fuzz', 'ckpt', 'hardening', 'mpi', 'gpu', 'arch', 'docs'):
        fig['%s.label.%s' % (key, label)] = sum(label in t['labels'] for t in tests.values())
    for backend in ('local', 'mpi'):
        fig['%s.crash_%s_tests' % (key, backend)], fig['%s.crash_%s_kills' % (key, backend)] = kills(tests, backend)


def only_figures(fig, key, names, sanitize_names):
    """The tests of `names` that the sanitizer build does not register: their
    count and their Python and valgrind tests."""
    only = [t for n, t in names.items() if n not in sanitize_names]
    fig[key + '.only'] = len(only)
    for label in ('python', 'valgrind'):
        fig['%s.only.label.%s' % (key, label)] = sum(label in t['labels'] for t in only)


def figures(src, python):
    """Every figure by name. A figure that depends on the CUDA toolkit is None
    when there is none (the CUDA-linked tests are then not registered)."""
    fig = {}
    fuzz_cmake = os.path.join(src, 'tests', 'fuzz', 'CMakeLists.txt')
    targets = source_figure(fuzz_cmake, r'^set\(MFSDP_FUZZ_TARGETS ([^)]*)\)', 'the list of fuzz targets').split()
    fig['fuzz.targets'] = len(targets)
    fig['fuzz.seconds'] = int(source_figure(fuzz_cmake, r'^set\(MFSDP_FUZZ_SECONDS (\d+) CACHE', 'MFSDP_FUZZ_SECONDS'))
    fig['soak.fuzz_seconds'] = int(source_figure(os.path.join(src, '.ci', 'soak'),
                                                 r'MFSDP_SOAK_FUZZ_SECONDS:-(\d+)', 'the soak fuzz seconds'))
    names = {}
    with tempfile.TemporaryDirectory() as scratch:
        for preset, kind in (('test', 'plain'), ('sanitize', 'sanitize')):
            build = os.path.join(scratch, preset)
            for tier in TIERS:
                configure(src, build, preset, [('MFSDP_TEST_TIER', tier), ('MFSDP_PYTHON', python)])
                names[tier, kind] = list_tests(src, build)
                build_figures(fig, '%s.%s' % (tier, kind), names[tier, kind])
            if kind == 'plain':
                fig['cuda'] = cache_value(build, 'MFSDP_HAVE_CUDA') == 'ON'
                names['nocuda'] = names['change', 'plain']
                if fig['cuda']:
                    configure(src, build, preset, [('MFSDP_TEST_TIER', 'change'), ('MFSDP_PYTHON', python),
                                                   ('MFSDP_WITH_CUDA', 'OFF')])
                    names['nocuda'] = list_tests(src, build)
    sanitize_names = names['change', 'sanitize']
    fig['change.plain_nocuda.tests'] = len(names['nocuda'])
    only_figures(fig, 'change.plain', names['change', 'plain'], sanitize_names)
    only_figures(fig, 'change.plain_nocuda', names['nocuda'], sanitize_names)
    if not fig['cuda']:
        for key in ('change.plain.tests', 'change.plain.only', 'soak.plain.tests'):
            fig[key] = None
    corpus = [n for n in sanitize_names if re.match(r'fuzz_\w+_corpus$', n)]
    if len(corpus) != len(targets):
        raise FigureError('%d fuzz targets in %s but %d corpus replays registered'
                          % (len(targets), fuzz_cmake, len(corpus)))
    replay = sanitize_names.get('fault_replay_mpi')
    fig['fault_replay.kills'] = int(replay['command'][-2]) if replay else None
    fig['fault_replay.stops'] = int(replay['command'][-1]) if replay else None
    return fig


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    src = os.path.abspath(argv[1])
    python = argv[2] if len(argv) == 3 else os.path.join(src, 'build', 'venv', 'bin', 'python')
    try:
        for k, v in sorted(figures(src, python).items()):
            print('%s = %s' % (k, v))
    except FigureError as e:
        sys.stderr.write('suite_figures: %s\n' % e)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
