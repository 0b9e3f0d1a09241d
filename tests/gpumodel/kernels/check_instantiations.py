#!/usr/bin/env python3
"""Every __global__ instantiation nvcc built has a host build in the model.

check_instantiations.py NVCC_OBJECT TEST_GM_KERNELS

Reads the kernels of runtime/backends/mf_cuda_kernels.cu's real nvcc object
from its host stubs (nm: one __device_stub_<device name> per instantiation;
the device name is what __cudaRegisterFunction registers), demangles each
with c++filt, reduces it to the registry's key (return type, namespaces and
parameter list dropped: "combine_kernel<0, 1>") and compares the set with
`TEST_GM_KERNELS --list`. A kernel nvcc built that the model lacks would fail
its launch on the model; a key the object lacks would never be found.
Exit 0 when the sets are equal, 1 otherwise, 2 on bad input.
"""
import re
import subprocess
import sys

STUB = re.compile(r"(\d+)(__device_stub__Z.*)$")


def stub_device_names(obj):
    """The mangled device names in the object's host stubs: a stub's own symbol
    (absent when inlined), its clones and its static locals' guard variables
    all carry <length>__device_stub_<device name>."""
    out = subprocess.run(["nm", obj], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        sym = line.split()[-1] if line.split() else ""
        m = STUB.search(sym)
        if not m:
            continue
        ident = m.group(2)[: int(m.group(1))]  # the stub's own identifier
        names.add(ident[len("__device_stub_"):])
    return names


def top_level_split(text):
    """text without its last top-level parenthesized group (the parameters)."""
    depth, cut = 0, len(text)
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                cut = i
                break
    return text[:cut]


def key_of(demangled):
    """'void (anonymous namespace)::combine_kernel<0, 1>(...)' -> 'combine_kernel<0, 1>'."""
    head = top_level_split(demangled)
    head = head.replace("(anonymous namespace)::", "")
    depth, start = 0, 0
    for i, c in enumerate(head):  # the name starts after the last top-level space or ::
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif depth == 0 and c == " ":
            start = i + 1
        elif depth == 0 and head.startswith("::", i):
            start = i + 2
    return head[start:]


def main(argv):
    if len(argv) != 3:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    try:
        mangled = sorted(stub_device_names(argv[1]))
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"error: nm {argv[1]}: {getattr(e, 'stderr', '') or e}".strip(), file=sys.stderr)
        return 2
    if not mangled:
        print(f"error: {argv[1]}: no __device_stub_ symbols (not an nvcc object with kernels?)", file=sys.stderr)
        return 2
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled) + "\n", check=True,
                               capture_output=True, text=True).stdout.splitlines()
    built = {key_of(d): d for d in demangled}
    listed = subprocess.run([argv[2], "--list"], check=True, capture_output=True, text=True).stdout.split("\n")
    model = {k for k in listed if k}
    missing = sorted(set(built) - model)
    stale = sorted(model - set(built))
    for k in missing:
        print(f"error: nvcc built {built[k]!r} (key {k!r}) but the model has no host build of it")
    for k in stale:
        print(f"error: the model registers {k!r}, which the nvcc object does not define")
    print(f"{len(built)} kernels in {argv[1].rsplit('/', 1)[-1]}, {len(model)} in the model")
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
