"""Random access to a shard directory: load the index once, then O(1) by rid or by position.

::

    from hscapture.reader import open_shards

    with open_shards("shards/") as ss:
        print(len(ss), ss.rids[:3])
        s = ss.get("hscap-000042")          # or ss[0], ss[-1]
        s.token_ids                          # int64/int32 [T]
        s.tensors["layer_15"]                # [T, H], this read's own memory
        s.fields.get("loss_mask")            # uint8 [T] or None
        s.layer(15), s.final_norm            # by layer id / kind

Guarantees:

* ``index.jsonl`` is read once, when the set is opened (a torn last line is ignored, as the
  format requires); later lookups touch no index. Samples are in index order (the order they
  became durable); a rid that appears twice keeps its first line, like
  :func:`hscapture.shards.read_index`.
* Each shard file is opened with ``safetensors.safe_open`` on first use and kept open (its
  header; no file descriptor is held). At most :data:`MAX_OPEN_SHARDS` (4,096) shards are
  kept open at once, the least recently used closed first; a tensor already returned keeps
  its own memory alive until it is freed. (Until
  2026-12-05 every shard stayed open with a descriptor of its own: a directory of more
  shards than the open-file limit failed with "Too many open files", and an export of it
  could never finish its resume.) A :class:`ShardSet` is picklable (handles are not
  pickled but reopened lazily) and reopens its handles in a forked child, so it can be handed
  to ``DataLoader`` workers.
* Every read of a sample (``ss[i]``, ``ss.get(rid)``, :class:`ShardDataset`,
  :func:`load_sample`, an export) returns writable tensors in memory of that read's own,
  which no other read shares: for a sample of :data:`MAP_AT_LEAST` (1 MiB) or more, bytes
  of a private (copy-on-write), lazily paged map of its shard that no other read was served
  (reads share a shard's map until one would get a byte of it a second time, or until the
  set has served :data:`MAP_BUDGET` (256 MiB) from its maps; then a fresh map), else a copy
  of its bytes. Writing into one (a transform that normalizes in place) never reaches the
  file nor any other read, earlier or later, of that sample or any other. (Until
  2026-12-05 they were views of one map of the whole shard kept by the set, and such a
  write changed what later reads of that sample through the same set returned:
  docs/GUARANTEES.md, gap 9. Until 2026-12-07 each such read had a map of its own: an
  ``mmap``, a ``munmap`` and the page faults again every read, ~26 us a 2 MiB sample.) A
  page written in place stays in its map, as private memory, until the set stopped using
  the map and its last tensor is freed: at most :data:`MAP_BUDGET` of a set's reads. Each
  map counts against the process's ~65,000 (vm.max_map_count) while a tensor of it lives;
  past that, reads are copied.
* A sample is returned only if every tensor its index line names is in its shard
  (:class:`~hscapture.errors.ShardError` otherwise, naming rid, shard and tensor).
* Compressed shards (``ShardWriter(compression="zstd"|"fp8")``) are decoded transparently from
  their per-tensor codec records: tensors come back in the captured dtype and shape (zstd:
  bit-exact; fp8: dequantized, see :mod:`hscapture.codec`). Decoded tensors are process
  memory, not memory-mapped. A codec this version does not know raises
  :class:`~hscapture.errors.ShardError` naming it.
* Samples written by an active :class:`~hscapture.shards.ShardWriter` after the set was opened
  are not seen; open a new set (or call :meth:`ShardSet.reload`) to see them.
"""

from __future__ import annotations

import collections
import ctypes
import json
import mmap
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ._fork import GENERATION
from ._served_ranges import MapBudget, ServedRanges
from .codec import CODECS, SCALE_PREFIX, decode
from .errors import ShardError
from . import shard_index as _index
from .sample import layer_name
from .shard_format import DTYPE_CODES, INDEX_NAME, codec_records

__all__ = ["open_shards", "ShardSet", "StoredSample", "ShardDataset", "load_sample"]


@dataclass
class StoredSample:
    """One sample read back from a shard directory.

    ``tensors`` maps layer names (:func:`hscapture.sample.layer_name`: ``layer_L``,
    ``final_norm``, ``{kind}_L``) to ``[num_tokens, hidden]`` tensors in ``dtype``;
    ``fields`` maps per-token field names (e.g. ``loss_mask``) to uint8 ``[num_tokens]``
    tensors. ``layers[i]``/``layer_kinds[i]`` describe the i-th captured layer in capture order.
    ``convention`` and ``model`` are the sample's own values, else its shard's.
    """

    rid: str
    token_ids: torch.Tensor
    tensors: dict[str, torch.Tensor]
    fields: dict[str, torch.Tensor]
    meta: dict[str, Any]
    layers: list[int]
    layer_kinds: list[str]
    dtype: str
    hidden: int
    convention: str
    model: str
    shard: str = ""
    index: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def extra(self) -> dict[str, Any]:
        """Small per-sample metadata (``meta["extra"]``): ``attempt``, and ``meta`` when the
        client attached one (a dataset row id, a split: ``custom_params.hscapture_meta``);
        ``{}`` if none."""
        ex = self.meta.get("extra") if isinstance(self.meta, dict) else None
        return ex if isinstance(ex, dict) else {}

    @property
    def loss_mask(self) -> torch.Tensor | None:
        """The stored ``loss_mask`` field (uint8 ``[T]``, 1 = trained on), or None."""
        return self.fields.get("loss_mask")

    @property
    def final_norm(self) -> torch.Tensor | None:
        """The post-final-norm last layer, or None if it was not captured."""
        return self.tensors.get("final_norm")

    def layer(self, layer: int, kind: str = "residual") -> torch.Tensor:
        """The tensor of captured layer ``layer`` of ``kind`` (``residual`` = output of decoder
        layer ``layer``, pre-norm). Raises KeyError naming what was captured."""
        name = layer_name(layer, kind)
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"rid {self.rid!r}: layer {layer} ({kind}) not captured; captured: "
                           f"{sorted(self.tensors)}") from None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (``rid``, ``token_ids``, every layer name, ``field.{name}``)."""
        d: dict[str, Any] = {"rid": self.rid, "token_ids": self.token_ids}
        d.update(self.tensors)
        d.update({f"field.{k}": v for k, v in self.fields.items()})
        return d


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _torch_dtypes() -> dict[str, torch.dtype]:
    return {name: dt for dt, name in DTYPE_CODES.items()}


_TORCH_OF = _torch_dtypes()   # safetensors dtype name -> torch dtype

#: bumped in every forked child: handles opened before the fork are dropped (_fork)
_FORK_GEN = GENERATION


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


#: a read of at least this many bytes (a sample's tensors, as they lie in its shard) is
#: served from a private map of its shard; a smaller one is copied into fresh memory with one
#: ``preadv``, which was the cheaper below ~1 MiB on the 2-core CPU machine when every read
#: had a map of its own (2026-12-05: 32 KiB samples read and touched 141 us a sample
#: copied, 179 mapped; 512 KiB 172 / 194; 1 MiB 197 / 183; 2 MiB 284 / 195). With maps
#: shared by reads (2026-12-07) small reads mapped measured 0-20 % faster on that machine,
#: within its noise: not changed
MAP_AT_LEAST = 1 << 20

#: a map reaches from its first byte's offset rounded down to a multiple of this (2 MiB) to
#: its end rounded up (or the file's end; a shard's map is of the whole file). The kernel
#: places a map that holds a whole aligned 2 MiB of the file at an address congruent to its
#: offset, so the page cache's large folios map whole, a fault each: a map of just the
#: read's pages took 24 faults a 2 MiB sample against 14, ~22 us more a sample (2026-12-05).
MAP_ALIGN = 2 << 20

#: how many bytes a :class:`ShardSet` serves from its shards' current private maps before it
#: makes fresh ones (:class:`~hscapture._served_ranges.MapBudget`). A page of a served tensor
#: written in place stays in its map, as private memory, until the map is unmapped: when the
#: set stops using it (at this many bytes served, or when the shard is closed) AND its last
#: tensor is freed. So a loop that writes into every sample it reads and frees it keeps at
#: most this much of such pages per set; a map of clean pages costs nothing but address space.
MAP_BUDGET = 256 << 20


def _private_map(fd: int, offset: int, size: int, file_size: int) -> tuple[Any, int]:
    """A private (copy-on-write), lazily paged map of bytes ``[offset, offset + size)`` of
    ``fd``, a file of ``file_size`` bytes (the map reaches from ``offset`` rounded down to
    :data:`MAP_ALIGN` to the end rounded up, or the file's end): ``(buffer, file offset of
    its first byte)``. The buffer object is unmapped once nothing references it (its
    tensors included). It holds no file descriptor: Python's ``mmap`` keeps a duplicate of
    the file's for its whole life, so every map a kept tensor held cost one, and a reader
    that reopened evicted shards ran out of descriptors where the one before eviction did
    not (fault hunt 7, 2026-12-05)."""
    start = offset - offset % MAP_ALIGN
    end = min(max(file_size, offset + size), -(-(offset + size) // MAP_ALIGN) * MAP_ALIGN)
    length = end - start
    addr = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd,
                      start)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {length} bytes failed: {os.strerror(err)}")
    buf = (ctypes.c_char * length).from_address(addr)
    # not at interpreter exit: a thread still reading a tensor of it would fault (fault
    # hunt 8, 4 of 15 runs); the process's end unmaps it anyway
    weakref.finalize(buf, _libc.munmap, addr, length).atexit = False
    return buf, start


def _private_copy(fd: int, offset: int, size: int) -> tuple[Any, int]:
    """Bytes ``[offset, offset + size)`` of ``fd`` copied into fresh memory (a numpy buffer
    placed so that each byte has the alignment modulo 64 it has in the file): ``(buffer, file
    offset its first byte stands for)``."""
    arr = np.empty(size + 64, np.uint8)
    pad = (offset - arr.ctypes.data) % 64
    view = memoryview(arr)[pad:pad + size]
    done = 0
    while done < size:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"{size - done} bytes short at offset {offset + done}: the file "
                          f"shrank")
        done += n
    return arr, offset - pad


#: the most shard files a ShardSet keeps open at once: each holds one memory map (its
#: safe_open's; no file descriptor), and a process may have ~65,000 (vm.max_map_count)
MAX_OPEN_SHARDS = 4096


def max_open_shards() -> int:
    """How many shards a :class:`ShardSet` keeps open at once (:data:`MAX_OPEN_SHARDS`)."""
    return max(1, int(MAX_OPEN_SHARDS))


#: name -> (dtype, shape, byte offset in the file, element count, end offset in the file)
_Spans = dict[str, tuple[torch.dtype, tuple[int, ...], int, int, int]]


class _Handle:
    """One shard file opened with safe_open, plus what its header says.

    ``read(rid, names)`` reads the bytes of one sample's tensors (they lie together in the
    file), or of the named ones, into memory of that read's own: bytes of the handle's
    current private (copy-on-write), lazily paged map of the whole file that it never
    served before (:data:`MAP_AT_LEAST` bytes or more; :meth:`_from_map`), else a copy made
    with one ``preadv``; the file is opened to make a map or a copy and closed before the
    read returns (a handle holds no descriptor; a map holds none). Its ``get(name)``
    serves each tensor by one ``torch.frombuffer`` of its bytes (and a ``view`` to its
    shape): ~2.3 us a tensor against ~11 us for ``get_tensor``'s slicing and casting. So no two reads share memory: writing into a
    tensor served changes no other read of that sample or of its shard (until 2026-12-05
    every read was a view of one map of the whole shard kept by the handle, and a write into
    a tensor showed in every later read of that sample through the same set: GUARANTEES,
    gap 9). Each tensor has a storage of its own, of its own bytes, which keeps its read's
    memory alive: sending one to another process (a DataLoader worker's queue moves it to
    shared memory, in the queue's feeder thread) copies that tensor alone and touches no
    other. (Until 2026-12-04 every tensor of a shard was a ``set_`` view of ONE storage over
    the whole map: the first send copied the whole file into shared memory and swapped that
    storage's memory while the worker's main thread made views of it for the next sample; a
    DataLoader worker died of a segmentation fault in ``tests/test_compact.py``.) The spans
    come from the header safe_open has already validated, read again from the same file
    (same inode, size and mtime; each read checks them again on its own descriptor, else
    no span is used). A tensor whose span is not usable that way (an
    unknown dtype, an offset not a multiple of its item size, a file changed since it was
    opened) is a copy of what ``get_tensor`` returns (safe_open's tensors are views of its
    one map), as is a name the header does not have (which raises there)."""

    __slots__ = ("path", "f", "meta", "_field_map", "_stat", "_spans", "_extents", "_budget",
                 "_lock", "_map", "_map_epoch", "_served")

    def codecs(self, rid: str) -> dict[str, dict]:
        """The per-tensor codec records of ``rid`` (``{}``: stored uncompressed)."""
        recs, bad = codec_records(self.meta, rid)
        if bad:
            raise ShardError(f"{self.path}: {bad}")
        return recs

    def __init__(self, path: str, budget: MapBudget | None = None) -> None:
        from safetensors import safe_open

        self.path = path
        self._budget = MapBudget(MAP_BUDGET) if budget is None else budget
        self._lock = threading.Lock()
        self._map: Any = None           # the current private map of the whole file
        self._map_epoch = -1            # the budget's epoch when it was made
        self._served = ServedRanges()   # what it has served
        try:
            self._stat = _identity(os.stat(path))
            self.f = safe_open(path, "pt")
        except FileNotFoundError:
            raise ShardError(f"shard {path} is in the index but does not exist") from None
        except Exception as e:
            raise ShardError(f"shard {path} does not open with safetensors: {e}") from e
        self.meta: dict[str, str] = self.f.metadata() or {}
        self._field_map: dict[str, list[str]] | None = None
        self._spans: _Spans | None = None
        self._extents: dict[str, tuple[int, int]] = {}

    def read(self, rid: str, names: Sequence[str] | None = None
             ) -> Callable[[str], torch.Tensor]:
        """``get(name)`` of the tensors of one read of sample ``rid``: those named in
        ``names`` (every tensor of the sample when None) come from one map or copy of their
        bytes made now, any other name from a read of its own."""
        if self._spans is None:
            self._spans, self._extents = self._read_spans()
        spans = self._spans
        if names is None:
            lo, hi = self._extents.get(rid, (-1, -1))
        else:
            lo = hi = -1
            for n in names:
                span = spans.get(n)
                if span is not None and span[3]:
                    if lo < 0 or span[2] < lo:
                        lo = span[2]
                    if span[4] > hi:
                        hi = span[4]
        got = self._bytes(lo, hi) if lo >= 0 else None
        tensor_copy = self._copy

        def get(name: str) -> torch.Tensor:
            span = spans.get(name)
            if span is None:
                return tensor_copy(name)
            dtype, shape, offset, numel, end = span
            if not numel:
                return torch.empty(shape, dtype=dtype)
            mem = got if lo <= offset and end <= hi else self._bytes(offset, end)
            if mem is None:
                return tensor_copy(name)
            t = torch.frombuffer(mem[0], dtype=dtype, count=numel, offset=offset - mem[1])
            return t if len(shape) == 1 else t.view(shape)

        return get

    def _copy(self, name: str) -> torch.Tensor:
        return self.f.get_tensor(name).clone()

    def _bytes(self, lo: int, hi: int) -> tuple[Any, int] | None:
        """Bytes ``[lo, hi)`` of this shard in memory of their own (see the class docstring):
        ``(buffer, file offset of its first byte)``; None if the file is no longer the one
        opened (or no longer opens)."""
        mapped = hi - lo >= MAP_AT_LEAST
        if mapped:
            got = self._from_map(lo, hi)      # the current map, if it can serve them
            if got is not None:
                return got
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if _identity(st) != self._stat:
                return None
            if mapped:
                got = self._from_map(lo, hi, fd, st.st_size)
                if got is not None:
                    return got
            return _private_copy(fd, lo, hi - lo)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _from_map(self, lo: int, hi: int, fd: int = -1, size: int = 0
                  ) -> tuple[Any, int] | None:
        """Bytes ``[lo, hi)`` as ``(buffer, 0)`` over this handle's current private map of
        the whole file, if it has one that served none of these bytes (:class:`ServedRanges`:
        no two reads share a byte of one map) and was made in the set's current
        :class:`MapBudget` epoch. Else, given ``fd`` (the file, checked to be the one
        opened, of ``size`` bytes), a fresh map of it becomes the current one and serves
        them. None when there is no usable map and none is made (no ``fd``, or
        vm.max_map_count reached: the caller copies)."""
        budget = self._budget
        with self._lock:
            buf = self._map
            if buf is None or self._map_epoch != budget.epoch or \
                    not self._served.take(lo, hi):
                if fd < 0:
                    return None
                self._map = None
                try:
                    buf = _private_map(fd, 0, size, size)[0]
                except OSError:     # out of maps: a copy needs none
                    return None
                self._map, self._map_epoch, self._served = buf, budget.epoch, ServedRanges()
                self._served.take(lo, hi)
            budget.spend(hi - lo)
        return buf, 0

    def drop_map(self, epoch: int) -> None:
        """Stop using the current map if it was made before the budget's ``epoch`` (it is
        unmapped once its last tensor is freed)."""
        if self._map_epoch < epoch:
            self._map = None

    def _read_spans(self) -> tuple[_Spans, dict[str, tuple[int, int]]]:
        """name -> (dtype, shape, byte offset in the file, element count, end offset) of every
        tensor served by :meth:`read`, and rid -> (first, end) byte offsets of the non-empty
        ones of each sample; ``{}`` when the file is no longer the one safe_open opened."""
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if _identity(st) != self._stat:
                    return {}, {}
                n = int.from_bytes(fh.read(8), "little")
                raw = fh.read(n)
                # headers are padded with spaces (64 KiB in ours): parsed, the padding cost
                # ~100 us a shard opened; the JSON object ends at its last "}"
                header = json.loads(raw[:raw.rfind(b"}") + 1])
        except (OSError, ValueError, RuntimeError):
            return {}, {}
        base, size = 8 + n, st.st_size
        spans = {}
        extents: dict[str, tuple[int, int]] = {}
        for name, info in header.items():
            try:
                dtype = _TORCH_OF.get(info["dtype"])
                begin, end = (int(x) for x in info["data_offsets"])
                shape = tuple(int(x) for x in info["shape"])
            except (TypeError, KeyError, ValueError):
                continue         # __metadata__, or a line get_tensor will judge
            if dtype is None:
                continue
            item = dtype.itemsize
            numel = 1
            for x in shape:
                numel *= x
            if (base + begin) % item or not 0 <= begin <= end or base + end > size or \
                    end - begin != numel * item or min(shape, default=0) < 0:
                continue
            spans[name] = (dtype, shape, base + begin, numel, base + end)
            if numel:
                rid = name.rpartition("/")[0]
                ext = extents.get(rid)
                extents[rid] = (base + begin, base + end) if ext is None else \
                    (min(ext[0], base + begin), max(ext[1], base + end))
        return spans, extents

    def field_names(self, rid: str) -> list[str]:
        """Field names of ``rid`` found by scanning the header once (old index lines)."""
        if self._field_map is None:
            fm: dict[str, list[str]] = {}
            for k in self.f.keys():
                r, _, name = k.rpartition("/")
                if name.startswith("field."):
                    fm.setdefault(r, []).append(name[len("field."):])
            self._field_map = fm
        return sorted(self._field_map.get(rid, ()))


class ShardSet(Sequence):
    """The samples of one shard directory, indexed once; see the module docstring.

    ``len(ss)``, ``ss[i]`` (negative ok), ``ss.get(rid)``, ``rid in ss``, ``ss.rids``,
    ``ss.position(rid)``, ``ss.entry(i_or_rid)`` (the index line, no tensor read) and iteration
    (index order). ``ss.load(key, names=[...])`` reads only the named layers.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = os.fspath(directory)
        if not os.path.isdir(self.directory):
            raise ShardError(f"{self.directory} is not a directory (expected a shard directory "
                             f"with index.jsonl)")
        self._handles: collections.OrderedDict[str, _Handle] = collections.OrderedDict()
        self._gen = _FORK_GEN[0]
        self._layout: dict[tuple, tuple] = {}
        #: the bytes served from the handles' current maps (MAP_BUDGET), and the epoch of
        #: it the handles were last told of
        self._budget = MapBudget(MAP_BUDGET)
        self._epoch = 0
        self.reload()

    # -- index ------------------------------------------------------------------------

    def reload(self) -> None:
        """Read ``index.jsonl`` again (sees samples finalized since); keeps open handles."""
        if not os.path.exists(os.path.join(self.directory, INDEX_NAME)):
            raise ShardError(f"{self.directory} has no {INDEX_NAME}: not a shard directory "
                             f"(or nothing was ever finalized in it)")
        entries: list[dict] = []
        pos: dict[str, int] = {}
        for d in _index.read_index_lines(self.directory):
            rid = d["rid"]
            if rid in pos:
                continue
            if not isinstance(d.get("shard"), str):
                raise ShardError(f"{self.directory}: index line of rid {rid!r} has no shard name")
            pos[rid] = len(entries)
            entries.append(d)
        self._entries = entries
        self._layout = {}
        self._pos = pos
        self._rids = [e["rid"] for e in entries]

    @property
    def rids(self) -> list[str]:
        """Every rid, in index order (do not mutate)."""
        return self._rids

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: object) -> bool:
        return rid in self._pos

    def position(self, rid: str) -> int:
        try:
            return self._pos[rid]
        except KeyError:
            raise KeyError(f"rid {rid!r} is not in {self.directory}") from None

    def entry(self, key: int | str) -> dict[str, Any]:
        """The index line of a sample (by position or rid), without reading its tensors."""
        if isinstance(key, str):
            return self._entries[self.position(key)]
        return self._entries[self._norm_pos(key)]

    def _layout_of(self, ent: dict[str, Any]) -> tuple[list[int], list[str], list[str]]:
        """(layer ids, kinds, layer names) of an index line; built once per distinct pair of
        ``layers`` / ``layer_kinds`` lists (a directory's samples nearly always share one),
        so a random read does not rebuild them (the cached lists are never handed out)."""
        raw_l, raw_k = ent.get("layers", ()), ent.get("layer_kinds", ())
        try:
            sig = (tuple(raw_l), tuple(raw_k))
            lay = self._layout.get(sig)
        except TypeError:       # an unhashable value in a malformed line: built each time
            sig, lay = None, None
        if lay is None:
            layers = [int(x) for x in raw_l]
            kinds = [str(k) for k in raw_k]
            lay = (layers, kinds, [layer_name(l, k) for l, k in zip(layers, kinds)])
            if sig is not None:
                self._layout[sig] = lay
        return lay

    def _norm_pos(self, i: int) -> int:
        n = len(self._entries)
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"position {i} out of range for {n} samples in {self.directory}")
        return j

    # -- shards -----------------------------------------------------------------------

    def _handle(self, shard: str) -> _Handle:
        if self._gen != _FORK_GEN[0]:  # forked: the parent's handles are not ours to use
            self._handles = collections.OrderedDict()
            self._gen = _FORK_GEN[0]
        handles = self._handles
        h = handles.get(shard)
        if h is None:
            h = _Handle(os.path.join(self.directory, shard), self._budget)
            handles[shard] = h
            limit = max_open_shards()
            while len(handles) > limit:
                try:                   # (threads of an export share the set: tolerate races)
                    handles.popitem(last=False)
                except KeyError:
                    break
        else:
            try:
                handles.move_to_end(shard)
            except KeyError:           # evicted by another thread meanwhile
                pass
        return h

    def shard_metadata(self, shard: str) -> dict[str, str]:
        """The ``__metadata__`` of one shard file."""
        return dict(self._handle(shard).meta)

    # -- samples ----------------------------------------------------------------------

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.load(j) for j in range(*i.indices(len(self)))]
        return self.load(i)

    def get(self, rid: str, default: Any = ..., *, names: Sequence[str] | None = None) -> Any:
        """The sample ``rid``; ``default`` if given and the rid is absent, else KeyError."""
        if rid not in self._pos:
            if default is not ...:
                return default
            raise KeyError(f"rid {rid!r} is not in {self.directory}")
        return self.load(rid, names=names)

    def __iter__(self) -> Iterator[StoredSample]:
        for i in range(len(self)):
            yield self.load(i)

    def load(self, key: int | str, *, names: Sequence[str] | None = None,
             fields: bool = True) -> StoredSample:
        """Read one sample (by position or rid). ``names``: only these layer names (all when
        None); ``fields=False`` skips per-token fields."""
        pos = self.position(key) if isinstance(key, str) else self._norm_pos(key)
        ent = self._entries[pos]
        layers, kinds, all_names = self._layout_of(ent)
        rid = ent["rid"]
        shard = ent["shard"]
        h = self._handle(shard)
        if names is None:
            want = all_names
        else:
            want = list(names)
            missing = [n for n in want if n not in all_names]
            if missing:
                raise KeyError(f"rid {rid!r}: layers {missing} not captured; captured: "
                               f"{all_names}")
        prefix = rid + "/"
        codec = h.meta.get("codec")
        if codec and codec not in CODECS:
            raise ShardError(f"{h.path}: codec {codec!r} is not supported by this version of "
                             f"hscapture (known: {', '.join(CODECS)})")
        recs = h.codecs(rid) if codec and want else {}
        try:
            fnames = ent.get("fields") if fields else ()
            if fnames is None:
                fnames = h.field_names(rid)
            # every tensor this read serves, in one read of their bytes (which lie together):
            # the whole sample's, else the named ones' (an fp8 layer's scales by the name its
            # record gives); a name left out would get a read of its own
            if names is None and fields:
                get = h.read(rid)
            else:
                stored = [prefix + n for n in want]
                stored += [prefix + str(r.get("scale", SCALE_PREFIX + n))
                           for n, r in recs.items()
                           if n in want and isinstance(r, dict) and r.get("codec") == "fp8"]
                stored.append(prefix + "token_ids")
                stored += [prefix + "field." + n for n in fnames]
                get = h.read(rid, stored)
            tensors = {}
            for n in want:
                rec = recs.get(n)
                tensors[n] = get(prefix + n) if rec is None else \
                    decode(rec, n, lambda m: get(prefix + m), f"rid {rid!r} {n} in {h.path}")
            token_ids = get(prefix + "token_ids")
            flds = {n: get(prefix + "field." + n) for n in fnames}
        except ShardError:
            raise
        except Exception as e:  # safetensors raises SafetensorError for a missing name
            raise ShardError(f"rid {rid!r}: cannot read its tensors from {h.path}: {e}") from e
        epoch = self._budget.epoch
        if epoch != self._epoch:       # the budget moved on: every shard's map is dropped
            self._epoch = epoch
            for other in list(self._handles.values()):
                other.drop_map(epoch)
        meta = ent.get("meta") if isinstance(ent.get("meta"), dict) else {}
        return StoredSample(
            rid=rid, token_ids=token_ids, tensors=tensors, fields=flds, meta=meta,
            layers=list(layers), layer_kinds=list(kinds),
            dtype=str(ent.get("dtype") or h.meta.get("dtype", "")),
            hidden=int(ent.get("hidden") or h.meta.get("hidden", 0)),
            convention=str(meta.get("convention") or h.meta.get("convention", "")),
            model=str(meta.get("model") or h.meta.get("model", "")),
            shard=shard, index=ent)

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        """Drop every open shard handle (tensors already returned stay valid)."""
        self._handles = collections.OrderedDict()

    def __enter__(self) -> "ShardSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        st["_handles"] = collections.OrderedDict()
        return st

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__dict__.update(st)
        self._gen = _FORK_GEN[0]

    def __repr__(self) -> str:
        return f"ShardSet({self.directory!r}, {len(self)} samples)"


def open_shards(directory: str | os.PathLike) -> ShardSet:
    """Open a shard directory for random access (reads ``index.jsonl`` once)."""
    return ShardSet(directory)


_SET_CACHE: dict[str, tuple[tuple, ShardSet]] = {}
_SET_CACHE_MAX = 8


def _cached_set(out_dir: str) -> ShardSet:
    """The :class:`ShardSet` of ``out_dir``, reopened only when its index file changed (inode,
    size or mtime), so repeated :func:`load_sample` calls are O(1)."""
    key = os.path.realpath(out_dir)
    try:
        st = os.stat(os.path.join(key, INDEX_NAME))
        stamp: tuple = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        raise ShardError(f"{out_dir} has no {INDEX_NAME}: not a shard directory") from None
    hit = _SET_CACHE.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    ss = ShardSet(key)
    if len(_SET_CACHE) >= _SET_CACHE_MAX:
        _SET_CACHE.pop(next(iter(_SET_CACHE)))
    _SET_CACHE[key] = (stamp, ss)
    return ss


def load_sample(out_dir: str | os.PathLike, rid: str) -> dict[str, torch.Tensor]:
    """Tensors of one sample: ``{"layer_3": ..., "final_norm": ..., "token_ids": ...,
    "field.loss_mask": ...}`` (names as stored, without the ``rid/`` prefix).

    Kept for compatibility; prefer :func:`open_shards`, which also returns the sample's
    layers, meta and fields. The directory's index is read once and cached (it is reread
    only when ``index.jsonl`` changes), and the sample's tensors are read by name from its
    shard, so each call costs O(1) index work, not a reread of the index and a scan of every
    tensor name.
    """
    d = os.fspath(out_dir)
    ss = _cached_set(d)
    if rid not in ss:
        raise ShardError(f"rid {rid!r} is not in the index of {d}")
    out = ss.load(rid).to_dict()
    del out["rid"]
    return out


class ShardDataset(torch.utils.data.Dataset):
    """A map-style ``torch.utils.data.Dataset`` over a shard directory.

    ``ds[i]`` is ``transform(sample)`` (the :class:`StoredSample` itself without a transform).
    Safe with ``DataLoader(num_workers>0)``: each worker reopens the shards it reads.
    ``names`` restricts which layers are read.
    """

    def __init__(self, shards: ShardSet | str | os.PathLike,
                 transform: Callable[[StoredSample], Any] | None = None, *,
                 names: Sequence[str] | None = None) -> None:
        self.shards = shards if isinstance(shards, ShardSet) else ShardSet(shards)
        self.transform = transform
        self.names = list(names) if names is not None else None

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, i: int) -> Any:
        s = self.shards.load(i, names=self.names)
        return self.transform(s) if self.transform is not None else s

