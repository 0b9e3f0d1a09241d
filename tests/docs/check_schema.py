#!/usr/bin/env python3
"""Holds the key table of docs/schedule.md (section 2.5) to the schedule's
schema table (core/mf_schema.h), printed by the schema_keys program: the page
must document every key of the table, with its type, presence and version,
in the table's order, and no key the table lacks.

    python3 tests/docs/check_schema.py SCHEMA_KEYS docs/schedule.md
    python3 tests/docs/check_schema.py --selftest SCHEMA_KEYS docs/schedule.md

Exit 0 when they agree; 1 with one 'file:line: error: ...' per difference;
2 for a usage error, an unreadable page or a page without the table. The
self-test runs the check on copies of the page with one fault each (a row
missing, a row the table lacks, a wrong version, two rows swapped) and
requires exit 1 and the fault named, and exit 0 on the page itself.
"""
import os
import re
import subprocess
import sys
import tempfile

HEADING = "### 2.5 "
ROW = re.compile(r"^\| `([^`]+)` \| `([^`]+)` \| ([^|]+?) \| ([^|]+?) \| (\d+) \|$")


def table_rows(program):
    """The schema's rows: (section, key, type, presence, since) tuples."""
    out = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    return [tuple(line.split("\t")) for line in out.splitlines()]


def page_rows(path):
    """The line of the page's section 2.5 and its rows as (line number, row
    tuple); None when the page has no such section."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADING)), None)
    if start is None:
        return None
    rows = []
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("#"):
            break
        m = ROW.match(lines[i])
        if m:
            rows.append((i + 1, m.groups()))
    return start + 1, rows


def fmt(row):
    return "`%s` `%s` (%s, %s, since %s)" % row


def check(program, path):
    """The differences, as messages; [] when the page agrees."""
    want = table_rows(program)
    page = page_rows(path)
    if page is None:
        return None
    heading_line, got = page
    errors = []
    keys_want = {r[:2]: r for r in want}
    keys_got = {}
    for line, row in got:
        if row[:2] in keys_got:
            errors.append("%s:%d: error: key %s is listed twice" % (path, line, fmt(row)))
        keys_got[row[:2]] = (line, row)
    for key, row in keys_want.items():
        if key not in keys_got:
            errors.append("%s:%d: error: the key table lacks %s of core/mf_schema.h" % (path, heading_line, fmt(row)))
        elif keys_got[key][1] != row:
            line, have = keys_got[key]
            errors.append("%s:%d: error: %s, but core/mf_schema.h says %s" % (path, line, fmt(have), fmt(row)))
    for key, (line, row) in keys_got.items():
        if key not in keys_want:
            errors.append("%s:%d: error: %s is not a key of core/mf_schema.h" % (path, line, fmt(row)))
    if not errors:
        order = [row[:2] for _, row in got]
        for i, key in enumerate(order):
            if key != want[i][:2]:
                errors.append("%s:%d: error: `%s` `%s` is out of order (core/mf_schema.h has `%s` `%s` here)"
                              % (path, got[i][0], key[0], key[1], want[i][0], want[i][1]))
                break
    return errors


def run(program, path):
    try:
        errors = check(program, path)
    except OSError as e:
        print("%s: error: %s" % (path, e.strerror), file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print("%s: error: exit status %d" % (program, e.returncode), file=sys.stderr)
        return 2
    if errors is None:
        print("%s: error: no section starting '%s' (the key table)" % (path, HEADING.strip()), file=sys.stderr)
        return 2
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


def selftest(program, path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if ROW.match(line.rstrip("\n"))]
    first, second = rows[0], rows[1]
    extra = "| `ops` | `priority` | int | data ops | 4 |\n"
    faults = {
        "a row missing": (lines[:first] + lines[first + 1:], "the key table lacks"),
        "a row the table lacks": (lines[:first] + [extra] + lines[first:], "`ops` `priority` (int, data ops, since 4) is not a key"),
        "a wrong version": (lines[:first] + [re.sub(r"\| 1 \|$", "| 4 |", lines[first].rstrip("\n")) + "\n"]
                            + lines[first + 1:], "but core/mf_schema.h says"),
        "two rows swapped": (lines[:first] + [lines[second], lines[first]] + lines[second + 1:], "is out of order"),
    }
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (body, expect) in faults.items():
            page = os.path.join(tmp, "schedule.md")
            with open(page, "w", encoding="utf-8") as f:
                f.writelines(body)
            errors = check(program, page) or []
            if not any(expect in e for e in errors):
                print("selftest: %s: expected an error with '%s', got %r" % (name, expect, errors), file=sys.stderr)
                failed += 1
    if check(program, path):
        print("selftest: the page itself does not pass", file=sys.stderr)
        failed += 1
    return 1 if failed else 0


def main(argv):
    args = argv[1:]
    test = args[:1] == ["--selftest"]
    if test:
        args = args[1:]
    if len(args) != 2:
        print("usage: check_schema.py [--selftest] SCHEMA_KEYS PAGE", file=sys.stderr)
        return 2
    return selftest(*args) if test else run(*args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
