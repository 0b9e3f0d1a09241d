#!/usr/bin/env python3
"""check_citations: every citation of the design in the tree must resolve.

The design of record is docs/ (docs/design.md §6 defines the citation form):
    docs/semantics.md §4.1
A page of docs/, one space, '§' and the number of a numbered heading of that
page ('## 4. Title' is 4, '### 4.1 Title' is 4.1). Inside a page of docs/ a
section sign and number with no page before it means that page's own section.

For every text file under ROOT (build directories, .git and fuzz corpora
skipped, as .gitignore does) this reports, as 'file:line:col: error: ...':
  - a mention of a page of docs/ that does not exist;
  - a '§N' whose page lacks a heading numbered N;
  - a '§N' with a page that is not under docs/, or a bare '§N' outside docs/;
  - a mention of the old out-of-tree design document or of a shared folder
    outside the repository;
  - in README.md and docs/*.md, a relative Markdown link to a missing file or
    to a '#anchor' that no heading of the target produces.
Exit status: 0 when clean, 1 with errors, 2 on a usage error.

    python3 tests/docs/check_citations.py [ROOT]   (default: this tree)
"""
import os
import re
import sys

# Paths (relative to ROOT) never scanned: what .gitignore lists plus .git.
SKIP_TOP = re.compile(r"^(\.git|build[^/]*|out)$")
SKIP_PATH = re.compile(r"^tests/fuzz/corpus-[^/]*$")

# A page: docs/ then a relative path ending in .md (no '..').
PAGE = re.compile(r"(?<![A-Za-z0-9_./-])docs/(?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_.-]+\.md\b")
# A section number right after '§'; the optional page right before it.
SECTION = re.compile(r"(?:(?<![A-Za-z0-9_./-])([A-Za-z0-9_./-]+\.md) )?§(\d+(?:\.\d+)*)")
# What may not appear: the old design document, paths outside the tree.
# (Built from pieces so that this file does not match itself.)
FORBIDDEN = [
    (re.compile(r"\b" + "DES" + r"IGN\b"), "cites the old design document; cite docs/ instead (docs/design.md §6)"),
    (re.compile(r"\.\./" + "shared" + r"\b"), "refers to a folder outside the repository"),
    (re.compile(r"/work/" + "shared" + r"\b"), "refers to a folder outside the repository"),
]
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?\s")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(title):
    """GitHub's anchor for a heading title: lower case, punctuation dropped,
    spaces as hyphens."""
    t = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return t.replace(" ", "-")


class Page:
    """The numbered headings and anchors of one Markdown file."""

    def __init__(self, text):
        self.numbers = set()
        self.anchors = set()
        seen = {}
        fenced = False
        for line in text.splitlines():
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if not m:
                continue
            title = m.group(2)
            n = NUMBERED.match(title)
            if n:
                self.numbers.add(n.group(1))
            a = slug(title)
            k = seen.get(a, 0)
            seen[a] = k + 1
            self.anchors.add(a if k == 0 else "%s-%d" % (a, k))


class Checker:
    def __init__(self, root):
        self.root = root
        self.pages = {}
        self.errors = []

    def page(self, rel):
        """The parsed page at ROOT/rel, or None when it is not a file."""
        if rel not in self.pages:
            path = os.path.join(self.root, rel)
            if ".." in rel.split("/") or not os.path.isfile(path):
                self.pages[rel] = None
            else:
                with open(path, encoding="utf-8", errors="replace") as f:
                    self.pages[rel] = Page(f.read())
        return self.pages[rel]

    def error(self, rel, lineno, col, msg):
        self.errors.append("%s:%d:%d: error: %s" % (rel, lineno, col, msg))

    def files(self):
        for dirpath, dirnames, filenames in os.walk(self.root):
            reldir = os.path.relpath(dirpath, self.root)
            reldir = "" if reldir == "." else reldir.replace(os.sep, "/")
            keep = []
            for d in sorted(dirnames):
                rel = reldir + "/" + d if reldir else d
                if (not reldir and SKIP_TOP.match(d)) or SKIP_PATH.match(rel):
                    continue
                keep.append(d)
            dirnames[:] = keep
            for name in sorted(filenames):
                rel = reldir + "/" + name if reldir else name
                if ".tmp." in name or os.path.islink(os.path.join(dirpath, name)):
                    continue
                yield rel

    def text(self, rel):
        try:
            with open(os.path.join(self.root, rel), "rb") as f:
                data = f.read()
        except OSError as e:
            self.error(rel, 1, 1, "cannot read: %s" % e.strerror)
            return None
        if b"\0" in data:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def check_file(self, rel):
        text = self.text(rel)
        if text is None:
            return
        in_docs = rel.startswith("docs/") and rel.endswith(".md")
        markdown = in_docs or rel == "README.md"
        for lineno, line in enumerate(text.splitlines(), 1):
            for rx, msg in FORBIDDEN:
                for m in rx.finditer(line):
                    self.error(rel, lineno, m.start() + 1, msg)
            for m in PAGE.finditer(line):
                if self.page(m.group(0)) is None:
                    self.error(rel, lineno, m.start() + 1, "'%s' does not exist" % m.group(0))
            for m in SECTION.finditer(line):
                self.check_section(rel, lineno, m, in_docs)
            if markdown:
                for m in LINK.finditer(line):
                    self.check_link(rel, lineno, m.start(1) + 1, m.group(1))

    def check_section(self, rel, lineno, m, in_docs):
        target, number = m.group(1), m.group(2)
        col = m.start() + 1
        if target is None:
            if not in_docs:
                self.error(rel, lineno, col, "'§%s' names no page; put the page of docs/ before it (docs/design.md §6)" % number)
                return
            target = rel
        elif not target.startswith("docs/"):
            self.error(rel, lineno, col, "'%s §%s': cite a page of docs/ by its path from the root (docs/design.md §6)" % (target, number))
            return
        page = self.page(target)
        if page is None:
            return  # reported once as a missing page
        if number not in page.numbers:
            have = ", ".join("§" + n for n in sorted(page.numbers, key=lambda s: [int(x) for x in s.split(".")]))
            self.error(rel, lineno, col, "%s has no section §%s (it has: %s)" % (target, number, have or "no numbered headings"))

    def check_link(self, rel, lineno, col, url):
        if re.match(r"^[a-z][a-z0-9+.-]*:", url):
            return  # http:, https:, mailto:
        path, _, anchor = url.partition("#")
        if path:
            target = os.path.normpath(os.path.join(os.path.dirname(rel), path)).replace(os.sep, "/")
            if target.startswith("../") or target == ".." or not os.path.exists(os.path.join(self.root, target)):
                self.error(rel, lineno, col, "link to '%s': no such file in the repository" % url)
                return
        else:
            target = rel
        if anchor and target.endswith(".md"):
            page = self.page(target)
            if page is not None and anchor not in page.anchors:
                self.error(rel, lineno, col, "link to '%s': %s has no heading with anchor '#%s'" % (url, target, anchor))

    def run(self):
        for rel in self.files():
            self.check_file(rel)
        return self.errors


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print("usage: check_citations.py [ROOT]", file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    if not os.path.isdir(os.path.join(root, "docs")):
        print("check_citations.py: error: %s has no docs/ folder" % root, file=sys.stderr)
        return 2
    errors = Checker(os.path.normpath(root)).run()
    for e in errors:
        print(e)
    if errors:
        print("check_citations.py: %d error(s); docs/design.md §6 says how to cite" % len(errors), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
