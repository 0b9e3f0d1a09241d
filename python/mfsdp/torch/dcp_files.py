"""
dcp_files: the files of a PyTorch DCP directory as mfsdp reads and writes
them (docs/checkpoint.md, "PyTorch DCP", "What a DCP load trusts").

torch's FileSystemReader opens whatever `.metadata` names (a path with
`../`, a symlink, a FIFO, on which open() blocks forever) and copies each
stored tensor into a template of the dtype `.metadata` declares, converting
silently. Here, instead:

- every file read is a regular file directly inside the checkpoint
  directory: a storage path with a separator, `.`, `..` or a NUL is refused,
  and a file is lstat'ed, then opened with O_NOFOLLOW | O_NONBLOCK and
  fstat'ed, so a symlink, a FIFO, a device or a directory is refused before
  any byte is read and no open or read blocks (open_regular);
- check_storage: before anything is read, every byte range a load will read
  lies inside its file and holds at least the bytes its chunk's elements
  take in the declared dtype, and each tensor's chunks lie inside it and
  cover its elements;
- SafeReader.read_data: each stored tensor has the dtype and shape that
  `.metadata` declares; storage transforms (compression) are refused;
- checksums: a DCP that mfsdp writes carries SUMS (`.mfsdp-sha256`, JSON,
  a file torch ignores): the sha256 of `.metadata` and of every storage
  item's byte range (item_sums on every rank, write_sums on the committing
  rank). A load verifies `.metadata`'s before unpickling it and each item's
  before deserializing it. A DCP without SUMS (torch's or another tool's) is
  read without: its bit flips cannot be detected.

Every refusal is a UsageError naming the checkpoint, the file and the key.

Planners for tensors no rank holds whole (Distinct tensors' global ones):
make_chunk_planner writes a rank's boxes of a global tensor as DCP chunks
at their offsets (boxes cuts a flat range into them), make_box_planner
reads one box of a stored tensor; both are torch's default planners plus
those items, so torch's own dcp.load reads what they write.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import stat
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint import FileSystemReader

from .._lib import UsageError

SUMS = ".mfsdp-sha256"
SUMS_FORMAT = "mfsdp-dcp-sha256/1"
METADATA = ".metadata"


def _kind(mode):
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISLNK, "symbolic link"),
                       (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _plain(rel):
    return isinstance(rel, str) and rel not in ("", ".", "..") and "/" not in rel \
        and os.sep not in rel and "\0" not in rel


def file_size(root: str, rel: str, what: str) -> int:
    """The size of regular file `rel` directly inside `root` (lstat: a
    symlink is refused, not followed); UsageError otherwise."""
    if not _plain(rel):
        raise UsageError("%s: %s: the storage path %r is not a file name inside the checkpoint "
                         "directory (paths leaving it are refused)" % (what, root, rel))
    p = os.path.join(root, rel)
    try:
        st = os.lstat(p)
    except OSError as e:
        raise UsageError("%s: %s: %s" % (what, p, e.strerror or e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError("%s: %s is a %s, not a regular file (a checkpoint's files are read "
                         "only as regular files inside its directory)" % (what, p,
                                                                         _kind(st.st_mode)))
    return st.st_size


def open_regular(root: str, rel: str, what: str) -> Tuple[Any, int]:
    """(binary file object, size) of regular file `rel` directly inside
    `root`, opened so that nothing blocks or follows a link (module comment)."""
    file_size(root, rel, what)
    p = os.path.join(root, rel)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise UsageError("%s: cannot open %s: %s" % (what, p, why)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):       # replaced between lstat and open
        os.close(fd)
        raise UsageError("%s: %s is a %s, not a regular file" % (what, p, _kind(st.st_mode)))
    return os.fdopen(fd, "rb"), st.st_size


def _read_range(f, size, info, root, what):
    if info.offset < 0 or info.length < 0 or info.offset + info.length > size:
        raise UsageError("%s: %s: bytes %d to %d of %s, which has %d (truncated or changed)"
                         % (what, root, info.offset, info.offset + info.length,
                            info.relative_path, size))
    f.seek(info.offset)
    data = f.read(info.length)
    if len(data) != info.length:
        raise UsageError("%s: %s: %s ended at %d bytes, %d were expected"
                         % (what, root, info.relative_path, info.offset + len(data),
                            info.offset + info.length))
    return data


def item_key(info: Any) -> str:
    """How SUMS names a storage item: its file, offset and length."""
    return "%s:%d:%d" % (info.relative_path, info.offset, info.length)


def read_sums(root: str, what: str) -> Optional[Dict[str, Any]]:
    """The checkpoint's SUMS, None when it has none."""
    if not os.path.lexists(os.path.join(root, SUMS)):
        return None
    f, _ = open_regular(root, SUMS, what)
    with f:
        try:
            doc = json.loads(f.read().decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise UsageError("%s: %s/%s is not valid JSON (%s)" % (what, root, SUMS, e)) from None
    if not isinstance(doc, dict) or doc.get("format") != SUMS_FORMAT or \
            not isinstance(doc.get("metadata"), str) or not isinstance(doc.get("items"), dict):
        raise UsageError("%s: %s/%s is not an mfsdp checksum file (%s)" % (what, root, SUMS,
                                                                         SUMS_FORMAT))
    return doc


class SafeReader(FileSystemReader):
    """DCP's file-system reader under the rules of the module comment."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(path)
        self.root = os.fspath(path)
        self.what = what
        self.sums = read_sums(self.root, what)
        self._md = None

    def use_metadata(self, md: Any) -> None:
        """Reads with metadata already read (and checked) by another SafeReader."""
        self._md = md

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
        if self._md is not None:
            return self._md
        f, _ = open_regular(self.root, METADATA, self.what)
        with f:
            data = f.read()
        if self.sums is not None and hashlib.sha256(data).hexdigest() != self.sums["metadata"]:
            raise UsageError("%s: %s/.metadata does not match its checksum in %s: altered or "
                             "corrupt" % (self.what, self.root, SUMS))
        try:
            md = pickle.loads(data)
        except Exception as e:   # noqa: BLE001 -- any unpickling failure is a bad file
            raise UsageError("%s: %s/.metadata is not DCP metadata (%s: %s)"
                             % (self.what, self.root, type(e).__name__, e)) from None
        if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
            raise UsageError("%s: %s/.metadata is not DCP metadata" % (self.what, self.root))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        self._md = md
        return md

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.futures import Future
        by_file: Dict[str, List[Any]] = {}
        for req in plan.items:
            by_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for rel in sorted(by_file):
            f, size = open_regular(self.root, rel, self.what)
            with f:
                for req in sorted(by_file[rel], key=lambda r: self.storage_data[r.storage_index].offset):
                    self._one(f, size, req, planner)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _chunk_sizes(self, index):
        """The sizes .metadata gives the stored chunk at `index`, None if unknown."""
        m = self._md.state_dict_metadata.get(index.fqn) if self._md is not None else None
        for c in getattr(m, "chunks", None) or ():
            if tuple(c.offsets) == tuple(index.offset or ()):
                return tuple(c.sizes)
        return None

    def _one(self, f, size, req, planner):
        from torch.distributed.checkpoint.planner import LoadItemType
        info = self.storage_data[req.storage_index]
        key = req.storage_index.fqn
        if info.transform_descriptors:
            raise UsageError("%s: %s: %r is stored with transforms %s (compression); mfsdp reads "
                             "plain DCP storage only" % (self.what, self.root, key,
                                                         list(info.transform_descriptors)))
        data = _read_range(f, size, info, self.root, self.what)
        if self.sums is not None:
            want = self.sums["items"].get(item_key(info))
            if want is None:
                raise UsageError("%s: %s: %s has no checksum for %r (%s)" % (
                    self.what, self.root, SUMS, key, item_key(info)))
            if hashlib.sha256(data).hexdigest() != want:
                raise UsageError("%s: %s: the bytes of %r in %s do not match their checksum "
                                 "(bit flips or an edit)" % (self.what, self.root, key,
                                                             info.relative_path))
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(data))
            return
        try:
            t = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:   # noqa: BLE001 -- torch's unpickler raises many kinds
            raise UsageError("%s: %s: the bytes of %r in %s are not a stored tensor (%s)"
                             % (self.what, self.root, key, info.relative_path, e)) from None
        target = planner.resolve_tensor(req).detach()
        if not isinstance(t, torch.Tensor) or t.dtype != target.dtype:
            raise UsageError("%s: %s: %r is stored as %s, .metadata says %s" % (
                self.what, self.root, key, getattr(t, "dtype", type(t).__name__), target.dtype))
        chunk = self._chunk_sizes(req.storage_index)
        if chunk is not None and tuple(t.shape) != chunk:
            raise UsageError("%s: %s: %r is stored with shape %s, .metadata's chunk has %s" % (
                self.what, self.root, key, list(t.shape), list(chunk)))
        for dim, (off, n) in enumerate(zip(req.storage_offsets, req.lengths)):
            if dim >= t.dim() or off + n > t.shape[dim]:
                raise UsageError("%s: %s: %r is stored with shape %s, which has no elements "
                                 "%s + %s" % (self.what, self.root, key, list(t.shape),
                                              list(req.storage_offsets), list(req.lengths)))
            t = t.narrow(dim, off, n)
        if t.shape != target.shape:
            raise UsageError("%s: %s: %r is stored with shape %s, .metadata says %s" % (
                self.what, self.root, key, list(t.shape), list(target.shape)))
        target.copy_(t)
        planner.commit_tensor(req, target)


def check_storage(root: str, md: Any, keys: List[str], what: str) -> List[str]:
    """Problems of reading `keys` of metadata `md` from the files in `root`
    (module comment), each naming the key; [] when none."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata
    problems, sizes = [], {}

    def size_of(rel):
        if rel not in sizes:
            try:
                sizes[rel] = file_size(root, rel, what)
            except UsageError as e:
                sizes[rel] = e.message.split(": ", 1)[-1]
        return sizes[rel]

    by_key: Dict[str, List[Any]] = {}
    for mi, info in md.storage_data.items():
        by_key.setdefault(mi.fqn, []).append(info)
    for key in keys:
        m = md.state_dict_metadata[key]
        for info in by_key.get(key, []):
            size = size_of(info.relative_path)
            if isinstance(size, str):
                problems.append("%r: %s" % (key, size))
            elif info.offset < 0 or info.length < 0 or info.offset + info.length > size:
                problems.append("%r: bytes %d to %d of %s, which has %d (truncated?)" % (
                    key, info.offset, info.offset + info.length, info.relative_path, size))
            if info.transform_descriptors:
                problems.append("%r: stored with transforms %s (mfsdp reads plain storage)"
                                % (key, list(info.transform_descriptors)))
        if not isinstance(m, TensorStorageMetadata):
            if not by_key.get(key):
                problems.append("%r: .metadata gives it no storage" % key)
            continue
        shape, itemsize = tuple(m.size), torch.empty((), dtype=m.properties.dtype).element_size()
        covered = 0
        for c in m.chunks:
            if len(c.offsets) != len(shape) or len(c.sizes) != len(shape) or any(
                    o < 0 or n < 0 or o + n > d for o, n, d in zip(c.offsets, c.sizes, shape)):
                problems.append("%r: a chunk at %s of %s lies outside its shape %s" % (
                    key, list(c.offsets), list(c.sizes), list(shape)))
                continue
            n = 1
            for d in c.sizes:
                n *= int(d)
            covered += n
            info = md.storage_data.get(MetadataIndex(key, c.offsets))
            if info is None:
                problems.append("%r: no storage for its chunk at %s" % (key, list(c.offsets)))
            elif info.length < n * itemsize:
                problems.append("%r: the chunk at %s holds %d bytes, %d %s elements take %d" % (
                    key, list(c.offsets), info.length, n, m.properties.dtype, n * itemsize))
        numel = 1
        for d in shape:
            numel *= int(d)
        if covered != numel:
            problems.append("%r: its chunks hold %d elements, its shape %s has %d" % (
                key, covered, list(shape), numel))
    return problems


def item_sums(root: str, rank: int, world: int, what: str) -> Dict[str, str]:
    """{item_key: sha256} of this rank's share (every world-th item) of the
    storage items of the DCP just written in `root`."""
    md = SafeReader(root, what).read_metadata()
    items = sorted({item_key(i): i for i in md.storage_data.values()}.items())
    out, files = {}, {}
    try:
        for n, (k, info) in enumerate(items):
            if n % world != rank:
                continue
            if info.relative_path not in files:
                files[info.relative_path] = open_regular(root, info.relative_path, what)
            f, size = files[info.relative_path]
            out[k] = hashlib.sha256(_read_range(f, size, info, root, what)).hexdigest()
    finally:
        for f, _ in files.values():
            f.close()
    return out


def write_sums(root: str, items: Dict[str, str], what: str) -> None:
    """Writes SUMS into `root` (the DCP just written), fsync'ed."""
    f, _ = open_regular(root, METADATA, what)
    with f:
        meta = hashlib.sha256(f.read()).hexdigest()
    doc = {"format": SUMS_FORMAT, "metadata": meta, "items": dict(sorted(items.items()))}
    p = os.path.join(root, SUMS)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(json.dumps(doc, indent=0).encode("utf-8"))
        out.flush()
        os.fsync(out.fileno())


# ---- writing parts of a tensor as DCP chunks ----

def boxes(shape: Tuple[int, ...], start: int, stop: int) -> List[Tuple[List[int], List[int], int]]:
    """The flat range [start, stop) of a row-major tensor of `shape` as
    DCP chunks: [(offsets, sizes, flat start)], each box a contiguous flat
    sub-range (at most 2 * ndim - 1 of them), together exactly the range."""
    if start >= stop:
        return []
    if not shape:
        return [([], [], start)]
    inner = 1
    for d in shape[1:]:
        inner *= int(d)
    first, last = start // inner, (stop - 1) // inner
    if first == last:                        # inside one slice along dim 0: recurse into it
        return [([first] + o, [1] + s, first * inner + f)
                for o, s, f in boxes(tuple(shape[1:]), start - first * inner,
                                     stop - first * inner)]
    out = []
    if start % inner:                        # the partial first slice
        out += boxes(tuple(shape), start, (first + 1) * inner)
        first += 1
    full_end = stop // inner                 # slices first .. full_end - 1 are whole
    if full_end > first:
        out.append(([first] + [0] * (len(shape) - 1), [full_end - first] + list(shape[1:]),
                    first * inner))
    if stop % inner:                         # the partial last slice
        out += boxes(tuple(shape), full_end * inner, stop)
    return out


def make_chunk_planner(chunks: Dict[Tuple[str, Tuple[int, ...]], Tuple[Any, ...]]):
    """torch's DefaultSavePlanner that also writes `chunks` {(DCP key,
    offsets): (tensor, the whole tensor's size, its path in the nested state
    dict)}: parts of tensors that no rank holds whole, each a SHARD write
    item of the whole tensor at its offsets (as a DTensor's shards are
    written); torch's dcp.load assembles any requested box out of them, and
    DCP's global plan validation refuses overlapping or missing chunks."""
    import dataclasses
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                       TensorProperties)
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    class _Planner(DefaultSavePlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            items = []
            for (key, off), (t, size, path) in sorted(chunks.items(), key=lambda kv: kv[0]):
                items.append(WriteItem(
                    index=MetadataIndex(key, torch.Size(off)), type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=torch.Size(off),
                                                   sizes=torch.Size(t.shape)),
                        properties=TensorProperties.create_from_tensor(t),
                        size=torch.Size(size))))
                if isinstance(plan.planner_data, dict):      # how key unflattens
                    plan.planner_data.setdefault(key, tuple(path))
            self.plan = dataclasses.replace(plan, items=list(plan.items) + items)
            return self.plan

        def resolve_data(self, write_item):
            got = chunks.get((write_item.index.fqn, tuple(write_item.index.offset or ())))
            if got is None:
                return super().resolve_data(write_item)
            return got[0].clone()            # its own storage: torch.save writes a view's whole

    return _Planner()


def make_box_planner(boxes: Dict[str, Tuple[int, ...]]):
    """torch's DefaultLoadPlanner (on a flat template, which it fills in
    place) that reads each key of `boxes` {DCP key: offsets} as the box of
    the stored tensor at those offsets, its template's size: DCP's own
    resharding reads (create_read_items_for_chunk_list) of only the stored
    chunks that box meets, so a rank reads its slice of a split tensor, not
    the whole."""
    import dataclasses
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class _Planner(DefaultLoadPlanner):
        def create_local_plan(self):
            whole = self.state_dict
            self.state_dict = {k: v for k, v in whole.items() if k not in boxes}
            try:
                plan = super().create_local_plan()
            finally:
                self.state_dict = whole
            items = list(plan.items)
            for key, off in sorted(boxes.items()):
                box = ChunkStorageMetadata(offsets=torch.Size(off), sizes=whole[key].size())
                items += create_read_items_for_chunk_list(
                    key, self.metadata.state_dict_metadata[key], [box])
            return dataclasses.replace(plan, items=items)

        def lookup_tensor(self, index):
            if index.fqn in boxes:
                return self.state_dict[index.fqn]     # dest offsets are relative to the box
            return super().lookup_tensor(index)

    return _Planner(flatten_state_dict=False, flatten_sharded_tensors=False)
