"""
cache: the schedule cache of mt.fully_shard (compile_cached).

The schedule cache: an entry is the compiled YAML under the sha256 of the
compiler's identity (the sha256 of the mfsdpc binary) and the spec text, in
$MFSDP_CACHE_DIR, else $XDG_CACHE_HOME/mfsdp, else ~/.cache/mfsdp. Its first
line carries the sha256 of the rest, so a truncated or altered entry, or a
schedule whose source_sha256 is another spec's, is recompiled and replaced,
never loaded. Entries are written to a temporary
name and renamed, so ranks that compile the same spec at once each rename a
whole file. A directory that cannot be written gives one RuntimeWarning
naming it and the reason, and compiling goes on without the cache.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import warnings
from typing import Optional, Tuple

from .._lib import MfsdpError
from ..compile import compile_text, mfsdpc_path
from ..schedule import Schedule

CACHE_MAGIC = b"mfsdp-schedule-cache 1 "

# how the calls of this process went: hits, misses (compiled and stored),
# replaced (a corrupt or unreadable entry recompiled), uncached (compiled,
# not stored), compiles (mfsdpc runs)
cache_stats = {"hits": 0, "misses": 0, "replaced": 0, "uncached": 0, "compiles": 0}
_warned = set()        # cache directories already warned about
_identity = {}         # (path, size, mtime_ns) -> sha256 of the binary


def cache_dir() -> str:
    """$MFSDP_CACHE_DIR, else $XDG_CACHE_HOME/mfsdp, else ~/.cache/mfsdp."""
    d = os.environ.get("MFSDP_CACHE_DIR")
    if d:
        return d
    xdg = os.environ.get("XDG_CACHE_HOME")
    return os.path.join(xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache"), "mfsdp")


def compiler_identity(exe: Optional[str] = None) -> str:
    """The sha256 (hex) of the mfsdpc binary (mfsdpc_path() by default)."""
    exe = exe or mfsdpc_path()
    st = os.stat(exe)
    key = (exe, st.st_size, st.st_mtime_ns)
    if key not in _identity:
        h = hashlib.sha256()
        with open(exe, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _identity[key] = h.hexdigest()
    return _identity[key]


def schedule_key(spec: str, exe: Optional[str] = None) -> str:
    """The cache key of spec text: sha256 over the compiler's identity and the spec."""
    h = hashlib.sha256(b"mfsdpc " + compiler_identity(exe).encode() + b"\n")
    h.update(spec.encode("utf-8"))
    return h.hexdigest()


def _read_entry(path):
    """The YAML of a valid entry; None when absent; ValueError when corrupt."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    head, nl, body = data.partition(b"\n")
    if not nl or not head.startswith(CACHE_MAGIC) or \
            head[len(CACHE_MAGIC):].decode("ascii", "replace") != hashlib.sha256(body).hexdigest():
        raise ValueError("its checksum does not match its contents")
    return body


def _check_source(yaml, spec):
    """ValueError unless the entry was compiled from this very spec text (its
    source_sha256, docs/schedule.md): a valid schedule of another spec under
    this key is never loaded."""
    m = re.search(rb'^source_sha256: "([0-9a-f]{64})"$', yaml, re.M)
    if not m or m.group(1).decode() != hashlib.sha256(spec.encode("utf-8")).hexdigest():
        raise ValueError("it was compiled from another spec")


def _write_entry(directory, path, yaml):
    """Writes an entry to a temporary name in `directory` and renames it (OSError on failure)."""
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(CACHE_MAGIC + hashlib.sha256(yaml).hexdigest().encode("ascii") + b"\n" + yaml)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _warn_once(directory, why):
    if directory not in _warned:
        _warned.add(directory)
        warnings.warn("mfsdp: the schedule cache %s is not usable (%s): compiling without it; "
                      "set MFSDP_CACHE_DIR to a writable directory, or pass cache=False"
                      % (directory, why), RuntimeWarning, stacklevel=3)


def compile_cached(spec: str, name: str = "spec", cache: bool = True) -> Tuple[Schedule, str]:
    """(Schedule, how it was found: "hit", "miss", "replaced", "uncached" or
    "off") for spec text, through the schedule cache (module comment)."""
    def build():
        cache_stats["compiles"] += 1
        return compile_text(spec, name=name)

    if not cache:
        return Schedule.from_text(build(), name=name + ".yaml"), "off"
    directory = cache_dir()
    path = os.path.join(directory, schedule_key(spec) + ".yaml")
    status = "miss"
    try:
        yaml = _read_entry(path)
        if yaml is not None:
            _check_source(yaml, spec)
            sched = Schedule.from_text(yaml, name=name + ".yaml")
            cache_stats["hits"] += 1
            return sched, "hit"
    except (ValueError, MfsdpError, OSError):
        status = "replaced"          # corrupt, unloadable or unreadable: never trusted
    yaml = build()
    sched = Schedule.from_text(yaml, name=name + ".yaml")
    try:
        _write_entry(directory, path, yaml)
    except OSError as e:
        _warn_once(directory, "%s: %s" % (type(e).__name__, e.strerror or e))
        cache_stats["uncached"] += 1
        return sched, "uncached"
    cache_stats["misses" if status == "miss" else "replaced"] += 1
    return sched, status


__all__ = ["compile_cached", "cache_dir", "schedule_key", "compiler_identity", "cache_stats"]
