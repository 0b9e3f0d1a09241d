"""
cache: the schedule cache of mt.fully_shard (compile_cached).

An entry is the compiled YAML under the sha256 of the compiler's identity
(the sha256 of the mfsdpc binary) and the spec text, in $MFSDP_CACHE_DIR,
else $XDG_CACHE_HOME/mfsdp, else ~/.cache/mfsdp, behind one line
(CACHE_MAGIC and the sha256 of the YAML) that only finds torn writes.

What a hit trusts: nothing the entry says about itself. The spec is compiled
every time and an entry is a hit only when its YAML is byte for byte what
this compiler emits for this spec (mfsdpc is deterministic:
docs/schedule.md §1), so a planted or edited entry (another spec's schedule, bf16 compute,
`reduce sum`, a rewritten source_sha256) is never loaded: it is replaced.
That check is the cheapest sound one: mfsdpc compiles an 8B Llama's spec in
about 6 ms, less than the loader's own verification of the result (about 23
ms, run on every schedule either way) and less than reading the model
section of the entry in Python (12 ms), let alone comparing it with
`mfsdpc explain`'s (4 ms to emit, 120 ms to parse). A hit therefore saves no
compile; cache_stats counts it under "checks", not "compiles".

Permissions, as ssh checks ~/.ssh: the directory (created 0700) must be a
directory owned by this user and writable by no one else, its parent not
writable by others unless sticky; otherwise one RuntimeWarning "the schedule
cache D is not usable (bad permissions on D: ...)" and the call compiles
without the cache. An entry that is not a regular file of this user,
writable only by them (opened O_NOFOLLOW | O_NONBLOCK), gives one warning
"bad permissions on PATH: ..." and is replaced. Entries are written 0600 to
a temporary name and renamed, so ranks that compile the same spec at once
each rename a whole file. A directory that cannot be created or written
gives one RuntimeWarning naming it and why, and compiling goes on without it.
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import warnings
from typing import Optional, Tuple

from ..compile import compile_text, mfsdpc_path
from ..schedule import Schedule

CACHE_MAGIC = b"mfsdp-schedule-cache 1 "

# how the calls of this process went: hits, misses (compiled and stored),
# replaced (an entry unlike the compiler's output, corrupt, unreadable or of
# bad permissions, recompiled and stored), uncached (compiled, not stored),
# compiles (mfsdpc runs whose schedule was not in the cache), checks (mfsdpc
# runs that confirmed a hit)
cache_stats = {"hits": 0, "misses": 0, "replaced": 0, "uncached": 0, "compiles": 0,
               "checks": 0}
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


def _mode_problem(st, what):
    """Why a file or directory of stat `st` is not trusted, or None."""
    me = os.geteuid()
    if st.st_uid != me:
        return "owned by uid %d, not by you (uid %d)" % (st.st_uid, me)
    if st.st_mode & 0o022:
        return "%s is writable by its group or others (mode %04o)" % (what,
                                                                    stat.S_IMODE(st.st_mode))
    return None


def _dir_problem(directory):
    """None when the cache directory exists (created 0700 if missing) and is
    trusted (module comment); else why not."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.stat(directory)
        if not stat.S_ISDIR(st.st_mode):
            return "NotADirectoryError: it is not a directory"
        why = _mode_problem(st, "it")
        if why:
            return "bad permissions on %s: %s" % (directory, why)
        parent = os.path.dirname(os.path.realpath(directory)) or "/"
        pst = os.stat(parent)
        sticky = pst.st_mode & stat.S_ISVTX
        if (pst.st_mode & 0o002 and not sticky) or \
                (pst.st_uid not in (0, os.geteuid()) and pst.st_mode & 0o022 and not sticky):
            return "bad permissions on %s: others may replace the cache in it (mode %04o, uid " \
                   "%d)" % (parent, stat.S_IMODE(pst.st_mode), pst.st_uid)
    except OSError as e:
        return "%s: %s" % (type(e).__name__, e.strerror or e)
    return None


class Untrusted(Exception):
    """An entry of bad permissions (its message says why)."""


def _read_entry(path):
    """The YAML of an entry; None when absent; Untrusted for bad permissions,
    ValueError when torn or not an entry, OSError when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        if os.path.islink(path):
            raise Untrusted("bad permissions on %s: a symbolic link" % path) from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        why = None if stat.S_ISREG(st.st_mode) else "not a regular file"
        why = why or _mode_problem(st, "it")
        if why:
            raise Untrusted("bad permissions on %s: %s" % (path, why))
        data = f.read()
    head, nl, body = data.partition(b"\n")
    if not nl or not head.startswith(CACHE_MAGIC) or \
            head[len(CACHE_MAGIC):].decode("ascii", "replace") != hashlib.sha256(body).hexdigest():
        raise ValueError("its checksum does not match its contents")
    return body


def _write_entry(directory, path, yaml):
    """Writes an entry to a temporary name in `directory` and renames it (OSError on failure)."""
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


def _warn_once(key, text):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def _unusable(directory, why):
    _warn_once(directory, "mfsdp: the schedule cache %s is not usable (%s): compiling without "
                          "it; set MFSDP_CACHE_DIR to a directory of yours that only you can "
                          "write, or pass cache=False" % (directory, why))


def compile_cached(spec: str, name: str = "spec", cache: bool = True) -> Tuple[Schedule, str]:
    """(Schedule, how it was found: "hit", "miss", "replaced", "uncached" or
    "off") for spec text, through the schedule cache (module comment). The
    schedule is always the one this compiler emits for `spec`."""
    yaml = compile_text(spec, name=name)
    sched = Schedule.from_text(yaml, name=name + ".yaml")
    if not cache:
        cache_stats["compiles"] += 1
        return sched, "off"
    directory = cache_dir()
    why = _dir_problem(directory)
    if why:
        _unusable(directory, why)
        cache_stats["compiles"] += 1
        cache_stats["uncached"] += 1
        return sched, "uncached"
    path = os.path.join(directory, schedule_key(spec) + ".yaml")
    try:
        entry = _read_entry(path)
    except Untrusted as e:
        _warn_once(str(e), "mfsdp: %s: the entry is not used and is replaced" % e)
        entry = b""
    except (ValueError, OSError):
        entry = b""                      # torn or unreadable: replaced
    if entry == yaml:
        cache_stats["checks"] += 1
        cache_stats["hits"] += 1
        return sched, "hit"
    status = "miss" if entry is None else "replaced"
    cache_stats["compiles"] += 1
    try:
        _write_entry(directory, path, yaml)
    except OSError as e:
        _unusable(directory, "%s: %s" % (type(e).__name__, e.strerror or e))
        cache_stats["uncached"] += 1
        return sched, "uncached"
    cache_stats["misses" if status == "miss" else "replaced"] += 1
    return sched, status


__all__ = ["compile_cached", "cache_dir", "schedule_key", "compiler_identity", "cache_stats"]
