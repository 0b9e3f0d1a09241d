"""
migration_worker: one MPI rank of test_migration.py (mpirun -np 4). Runs
every example of docs/pytorch.md's section "Coming from FSDP2: call by call"
in order, each in a fresh namespace as a script (__name__ == "__main__"),
compiled under the docs file's name with its own line numbers, so a failure
points at the line of the docs. MASTER_ADDR and MASTER_PORT are set as
torchrun would set them (the port from the command line); rank 0 prints
"example at line N: ok" after each.

    mpirun -np 4 python migration_worker.py DOCS_MD PORT
"""
import os
import re
import sys
import traceback

SECTION = "## Coming from FSDP2: call by call"
MARKER = "# runs in tests/python/test_migration.py (mpirun -np 4)"


def examples(path, section=SECTION, marker=MARKER):
    """[(line of the first code line, code, marked)] of every python block of the section."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = lines.index(section)
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^## ", lines[i])),
               len(lines))
    out, i = [], start
    while i < end:
        if lines[i].strip() == "```python":
            j = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "```")
            code = "\n".join(lines[i + 1:j])
            out.append((i + 2, code, lines[i + 1].strip() == marker))
            i = j
        i += 1
    return out


def run_examples(path, rank, section=SECTION, marker=MARKER):
    """Runs every example of the section in order, each as a script in a fresh
    namespace under the docs file's name and line numbers; an unmarked one
    fails; a failing one exits this rank at once."""
    for line, code, marked in examples(path, section, marker):
        if not marked:
            raise SystemExit("%s:%d: an example without the marker %r" % (path, line, marker))
        try:
            exec(compile("\n" * (line - 1) + code, path, "exec"), {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)     # at once: the other ranks' collectives must not wait for this one
        if rank == 0:
            print("example at line %d: ok" % line, flush=True)


def main():
    path, port = sys.argv[1], sys.argv[2]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = port
    run_examples(path, int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


if __name__ == "__main__":
    main()
