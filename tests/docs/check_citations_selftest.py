#!/usr/bin/env python3
"""Self-test of check_citations.py: builds small trees in a temporary folder,
one fault each, and requires that the checker exits 1 and names the fault at
its file, line and column; a clean tree must pass with exit 0 and no output.

    python3 tests/docs/check_citations_selftest.py
"""
import os
import subprocess
import sys
import tempfile

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_citations.py")

# The pages of every tree: numbered headings, one unnumbered one.
PAGES = {
    "DOCS/semantics.md": "# Semantics\n\n## 1. Placements\n\nSee @4.1.\n\n## 4. Transitions\n\n### 4.1 Legality\n",
    "DOCS/guide.md": "# Guide\n\n## Limits\n\nSee [semantics](semantics.md#41-legality).\n",
    "README.md": "# x\n\nRead [the guide](DOCS/guide.md#limits).\n",
}

# A clean tree: every form of citation the checker accepts. The old design
# document's name is built from pieces so that this file passes the checker.
CLEAN = {
    "src/a.c": "/* placements (DOCS/semantics.md @1), legality (DOCS/semantics.md @4.1) */\n",
    "src/b.mfsdp": "# the rules of DOCS/semantics.md @4, see DOCS/guide.md\n",
    "src/CMakeLists.txt": "# DOCS/semantics.md @4.1 and DOCS/semantics.md @1\n",
    "build/junk.c": "/* ignored: build folders are skipped (bad @9) */\n",
}

OLD = "DES" + "IGN"

# name -> (extra files, expected error texts, each 'file:line:col: error: ...' prefix + words)
FAULTS = {
    "missing section": ({"src/a.c": "int x; /* see DOCS/semantics.md @4.2 */\n"},
                        ["src/a.c:1:15: error: DOCS/semantics.md has no section @4.2"]),
    "missing page": ({"src/a.c": "/* DOCS/nope.md @1 */\n"},
                     ["src/a.c:1:4: error: 'DOCS/nope.md' does not exist"]),
    "page without numbered headings": ({"src/a.c": "/* DOCS/guide.md @1 */\n"},
                                       ["src/a.c:1:4: error: DOCS/guide.md has no section @1 (it has: no numbered headings)"]),
    "bare section outside docs": ({"src/a.c": "/* the rules of @4 */\n"},
                                  ["src/a.c:1:17: error: '@4' names no page"]),
    "page not under docs": ({"src/a.c": "/* semantics.md @4 */\n"},
                            ["src/a.c:1:4: error: 'semantics.md @4': cite a page of DOCS/"]),
    "old design document": ({"src/a.c": "/* " + OLD + " @3.1 */\n"},
                            ["src/a.c:1:4: error: cites the old design document",
                             "src/a.c:1:11: error: '@3.1' names no page"]),
    "old design file": ({"CMakeLists.txt": "# see " + OLD + ".md\n"},
                        ["CMakeLists.txt:1:7: error: cites the old design document"]),
    "folder outside the tree": ({"src/x.sh": "cat ../" + "shared/notes.md\n"},
                                ["src/x.sh:1:5: error: refers to a folder outside the repository"]),
    "bare section in docs missing on its page": ({"DOCS/semantics.md": PAGES["DOCS/semantics.md"] + "\nAs @7 says.\n"},
                                                 ["DOCS/semantics.md:11:4: error: DOCS/semantics.md has no section @7"]),
    "broken link": ({"DOCS/guide.md": "# Guide\n\n## Limits\n\nSee [x](missing.md).\n"},
                    ["DOCS/guide.md:5:9: error: link to 'missing.md': no such file"]),
    "broken anchor": ({"README.md": "# x\n\n[g](DOCS/guide.md#limitz)\n"},
                      ["README.md:3:5: error: link to 'DOCS/guide.md#limitz': DOCS/guide.md has no heading with anchor '#limitz'"]),
}


def fx(text):
    """The fixtures spell '§' as '@' and 'docs/' as 'DOCS/', so that this file
    itself passes the checker; the trees get the real spelling."""
    return text.replace("@", "\u00a7").replace("DOCS/", "docs/")


def write_tree(root, files):
    for rel, text in files.items():
        rel, text = fx(rel), fx(text)
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def run(root):
    p = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        clean = os.path.join(tmp, "clean")
        write_tree(clean, {**PAGES, **CLEAN})
        rc, out, err = run(clean)
        if rc != 0 or out:
            print("FAIL clean tree: exit %d, output:\n%s%s" % (rc, out, err))
            failures += 1
        else:
            print("ok   clean tree passes")
        for i, (name, (files, expected)) in enumerate(sorted(FAULTS.items())):
            root = os.path.join(tmp, "fault%d" % i)
            write_tree(root, {**PAGES, **CLEAN, **files})
            rc, out, err = run(root)
            lines = out.splitlines()
            expected = [fx(e) for e in expected]
            missing = [e for e in expected if not any(l.startswith(e) for l in lines)]
            if rc != 1 or missing or len(lines) != len(expected):
                print("FAIL %s: exit %d (want 1), expected %s, got:\n%s%s" % (name, rc, expected, out, err))
                failures += 1
            else:
                print("ok   %s: %s" % (name, lines[0]))
        rc, out, err = run(os.path.join(tmp, "no-such-root"))
        if rc != 2:
            print("FAIL a root without a docs folder: exit %d (want 2)" % rc)
            failures += 1
        else:
            print("ok   a root without a docs folder is a usage error")
    print("%d failure(s)" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
