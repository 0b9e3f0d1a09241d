"""PyTorch DCP's cold load of the mfsdp checkpoint bench's bytes (bench/ckpt/run.sh).

    python dcp_reference.py DIR [REPEATS]

Saves, with torch.distributed.checkpoint (DCP) and its defaults, a plain
dict of the tensors the mfsdp bench checkpoints (bench/ckpt/hsdp_2x4.mfsdp:
8 units of weight [2048, 1024] + bias [2048], fp32, each with the master
weight and two Adam states: 48 tensors, 192 MiB) into DIR/dcp, then loads it
REPEATS times (default 5) cold, into destination tensors allocated and
touched beforehand, and prints the median and range. Cold as the mfsdp
bench's cold load: every file of the checkpoint is fdatasync'd and dropped
from the page cache (posix_fadvise(POSIX_FADV_DONTNEED)) before each load;
its resident pages are then counted with mincore(2) on a PROT_READ mapping
(which faults nothing in) and printed, and a load after a drop that left
pages resident is refused. One process, no process group (DCP's
single-process mode). The loaded values are compared with the saved ones
after the timed loads. Bandwidths are the tensors' bytes per second of
the whole dcp.load call. Not a test: no assertion on speed.
"""

import ctypes
import os
import shutil
import statistics
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

UNITS = 8
SHAPES = {"weight": (2048, 1024), "bias": (2048,)}  # per unit, as in hsdp_2x4.mfsdp
STATES = ("main_weight", "exp_avg", "exp_avg_sq")
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024.0 * 1024.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def make_state(fill):
    """Returns the bench's 48 fp32 tensors, each filled (touched) by fill(numel)."""
    out = {}
    for state in STATES:
        for u in range(UNITS):
            for name, shape in SHAPES.items():
                n = 1
                for d in shape:
                    n *= d
                out[f"block.{u}.{name}.{state}"] = fill(n).reshape(shape)
    return out


def checkpoint_files(path):
    return [os.path.join(path, f) for f in sorted(os.listdir(path))]


def resident_bytes(file):
    """Bytes of file resident in the page cache (mincore on a PROT_READ, MAP_SHARED mapping)."""
    size = os.path.getsize(file)
    if size == 0:
        return 0
    fd = os.open(file, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {file}")
        try:
            vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {file}")
            return sum(b & 1 for b in vec.raw) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cache(path):
    """Drops every file of the checkpoint from the page cache; returns the bytes still resident."""
    for file in checkpoint_files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return sum(resident_bytes(f) for f in checkpoint_files(path))


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit("usage: dcp_reference.py DIR [REPEATS]")
    repeats = argv[2] if len(argv) == 3 else "5"
    if not repeats.isdigit() or not 1 <= int(repeats) <= 64:
        sys.exit(f"dcp_reference.py: REPEATS must be 1..64, not {repeats!r}")
    repeats = int(repeats)
    if not os.path.isdir(argv[1]):
        sys.exit(f"dcp_reference.py: {argv[1]}: not a directory")
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    path = os.path.join(argv[1], "dcp")
    shutil.rmtree(path, ignore_errors=True)

    source = make_state(lambda n: torch.arange(n, dtype=torch.float32) * 1e-3)
    nbytes = sum(t.numel() * t.element_size() for t in source.values())
    t0 = time.perf_counter()
    dcp.save(source, checkpoint_id=path)
    save_s = time.perf_counter() - t0

    cached = sum(resident_bytes(f) for f in checkpoint_files(path))  # the check sees the save's pages
    dest = make_state(lambda n: torch.zeros(n, dtype=torch.float32))
    times, resident = [], 0
    for _ in range(repeats):
        for t in dest.values():
            t.zero_()
        left = drop_cache(path)
        resident = max(resident, left)
        if left:
            sys.exit(f"dcp_reference.py: {left} bytes of {path} still in the page cache after the drop")
        t0 = time.perf_counter()
        dcp.load(dest, checkpoint_id=path)
        times.append(time.perf_counter() - t0)
    wrong = [k for k in source if not torch.equal(source[k], dest[k])]
    if wrong:
        sys.exit(f"dcp_reference.py: the loaded {wrong[0]} differs from the saved one ({len(wrong)} tensors)")

    files = checkpoint_files(path)
    mibps = sorted(nbytes / t / MIB for t in times)
    print(f"dcp_bytes={nbytes}")
    print(f"dcp_tensors={len(source)}")
    print(f"dcp_files={len(files)} ({sum(os.path.getsize(f) for f in files)} bytes)")
    print(f"dcp_save_MiBps={nbytes / save_s / MIB:.0f}")
    print(f"dcp_repeats={repeats} (cold loads: the median)")
    print(f"dcp_load_cold_s={statistics.median(times):.4f}")
    print(f"dcp_load_cold_MiBps={statistics.median(mibps):.0f} (range {mibps[0]:.0f} to {mibps[-1]:.0f})")
    print(f"dcp_resident_after_save_bytes={cached} (mincore)")
    print(f"dcp_resident_after_drop_bytes={resident} (mincore, the most over the loads)")
    shutil.rmtree(path)


if __name__ == "__main__":
    main(sys.argv)
