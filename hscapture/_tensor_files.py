"""Tensors into files without an extra copy: what the exports write with.

- :class:`_Joined` / :func:`_join`: a tensor whose bytes are the row interleaving of K source
  tensors (the trainers' token-major layouts over the shards' layer-major data), produced a
  slice of tokens at a time into a reused per-thread buffer while it is written;
- :class:`_Sink` / :func:`_write_tensor`: buffered ``os.writev`` of tensor bytes, short
  writes resumed; a joined tensor going to a plain file is written by one native call
  (``hscapture._files.writev_rows``: one iovec per token row of each source, gathered by the
  kernel straight from the mapped shards, no bounce copy), with the zip record's CRC-32 taken
  in the same call where one is needed (SpecForge's ``.ckpt``: ``writev_rows_crc32``);
- :func:`_torch_save`: ``torch.save``'s zip container written here (torch still pickles,
  through ``torch.serialization._save``), the same bytes as ``torch.save`` (pinned by
  tests/test_export_torchzip.py) without torch's staging copy, the CRC-32 by
  :data:`CRC32_IMPL`; ``torch.save`` itself when this torch's ``_save`` differs or a file
  would need zip64.
"""

from __future__ import annotations

import functools
import io
import math
import os
import struct
import sys
import threading
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from .errors import ExportError

try:    # the native row-interleaved writev (built with the package; the bounce path without it)
    from . import _files
except ImportError:     # pragma: no cover - an uncompiled checkout
    _files = None

#: the CRC-32 of the zip records: the same values as zlib.crc32 from each. Ours (carry-less
#: multiply, GIL released; ``_files.CRC32_IMPL`` says which kind) where the CPU has PCLMUL,
#: else ISA-L's (also carry-less multiply), else zlib's (~10x slower than either).
if _files is not None and _files.CRC32_IMPL != "table":
    _crc32 = _files.crc32
    CRC32_IMPL = f"native-{_files.CRC32_IMPL}"
else:   # pragma: no cover - depends on the CPU and on what is installed
    try:
        from isal.isal_zlib import crc32 as _crc32
        CRC32_IMPL = "isal"
    except ImportError:
        from zlib import crc32 as _crc32
        CRC32_IMPL = "zlib"

#: a native CRC of at least this many bytes is taken by a helper thread while the calling thread
#: writes (``_files.CRC_THREAD_MIN``; below it, batch by batch just before each write): a file
#: then costs max(write, CRC) rather than their sum, on a machine with a core to spare
CRC_THREAD_MIN = _files.CRC_THREAD_MIN if _files is not None else 0

#: bytes of the per-thread buffer that joined layers are interleaved into, a slice of tokens at
#: a time, before each slice is written (reused: no page of it is faulted in twice)
BOUNCE_BYTES = 4 << 20

_local = threading.local()


def _bytes_of(t: torch.Tensor) -> memoryview:
    t = t.contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def _bounce(nbytes: int) -> torch.Tensor:
    """This thread's reusable uint8 buffer of at least ``nbytes``."""
    b = getattr(_local, "bounce", None)
    if b is None or b.numel() < nbytes:
        b = _local.bounce = torch.empty(max(nbytes, BOUNCE_BYTES), dtype=torch.uint8)
    return b


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t`` if it is the whole of its storage, else a copy: ``torch.save`` writes a tensor's
    entire storage, so a view into a larger buffer must not be saved as is."""
    if t.is_contiguous() and t.storage_offset() == 0 and \
            t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone()


@dataclass(frozen=True)
class _Joined:
    """A tensor of ``shape`` whose bytes are the row interleaving of ``sources`` (K tensors
    ``[T, H]`` of one dtype and shape): token t's row of source 0, then of source 1, ... —
    SpecForge's ``aux_hidden_state [1, T, K*H]`` and speculators' ``hidden_states [T, K, H]``;
    with one source, that tensor's own bytes (never the larger buffer it may be a view of).

    It is never assembled whole: :meth:`chunks` interleaves a slice of tokens at a time into
    this thread's :func:`_bounce` buffer (one strided numpy copy per source, reading the
    memory-mapped shard) and hands out each slice to be written before the next is made; a
    single source is handed out as it is (written straight from the mapped shard).
    :meth:`materialize` builds the tensor (the torch.save fallback, tests)."""

    sources: tuple[torch.Tensor, ...]
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.sources[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.sources)

    def chunks(self) -> Iterator[tuple[memoryview, bool]]:
        """``(bytes, transient)`` in file order; a transient chunk is valid only until the
        next one is asked for."""
        if len(self.sources) == 1:
            if self.nbytes:
                yield _bytes_of(self.sources[0]), False
            return
        T = self.sources[0].shape[0]
        K = len(self.sources)
        rb = self.sources[0].shape[1] * self.sources[0].element_size()    # one row's bytes
        if T == 0 or rb == 0:
            return
        # numpy, not torch, copies: one thread each, GIL released; torch's intra-op threads
        # would spin on the cores the other export workers need
        src = [t.view(torch.uint8).numpy() for t in self.sources]       # [T, rb] each
        per = max(1, BOUNCE_BYTES // (K * rb))
        raw = _bounce(min(per, T) * K * rb)
        buf = raw.numpy()[:min(per, T) * K * rb].reshape(min(per, T), K, rb)
        mv = memoryview(raw.numpy()).cast("B")
        for t0 in range(0, T, per):
            n = min(per, T - t0)
            for k in range(K):
                buf[:n, k] = src[k][t0:t0 + n]
            yield mv[:n * K * rb], True

    def materialize(self) -> torch.Tensor:
        if len(self.sources) == 1:
            return _own(self.sources[0]).reshape(self.shape)
        return torch.stack(self.sources, dim=1).reshape(self.shape)


def _join(sources: Sequence[torch.Tensor], shape: Sequence[int]) -> _Joined:
    """The row interleaving of ``sources`` (see :class:`_Joined`), checked."""
    src = tuple(t if t.is_contiguous() else t.contiguous() for t in sources)
    shape = tuple(int(x) for x in shape)
    if not src or len({t.dtype for t in src}) != 1 or len({tuple(t.shape) for t in src}) != 1 \
            or src[0].dim() != 2:
        raise ExportError(f"expected tensors [T, H] of one dtype and shape to join, found "
                          f"{[(tuple(t.shape), t.dtype) for t in src]}")
    if math.prod(shape) != len(src) * src[0].numel():
        raise ExportError(f"cannot save {len(src)} x {tuple(src[0].shape)} as shape {shape}")
    return _Joined(src, shape)


_IOV_MAX = 1024
_FLUSH_BYTES = 1 << 20


class _Sink:
    """Writes buffers to ``f`` in order. For a plain binary file: held (not copied) and written
    with one ``os.writev`` per flush (a transient buffer, ≥ 1 MiB held or 1024 buffers), short
    writes resumed; anything else (GzipFile, BytesIO: whose fileno(), if any, is not where
    their bytes go) gets ``f.write`` per buffer. :meth:`close` writes what is held."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.fd = f.fileno() if isinstance(f, (io.BufferedWriter, io.BufferedRandom, io.FileIO)) \
            else None
        if self.fd is not None:
            f.flush()
        self.held: list[Any] = []
        self.held_bytes = 0
        self.pos = 0

    def write(self, b: Any, transient: bool = False) -> None:
        n = len(b) if not isinstance(b, memoryview) else b.nbytes
        self.pos += n
        if self.fd is None:
            self.f.write(b)
            return
        self.held.append(b)
        self.held_bytes += n
        if transient or self.held_bytes >= _FLUSH_BYTES or len(self.held) >= _IOV_MAX:
            self.close()

    def close(self) -> None:
        todo, self.held, self.held_bytes = self.held, [], 0
        i = 0
        while i < len(todo):
            got = os.writev(self.fd, todo[i:i + _IOV_MAX])
            if got == 0:
                raise OSError(f"writev wrote nothing of {sum(len(b) for b in todo[i:])} bytes")
            while i < len(todo) and got >= len(todo[i]):
                got -= len(todo[i])
                i += 1
            if got:     # a short write: the rest of this buffer goes first next time
                todo[i] = memoryview(todo[i]).cast("B")[got:]


#: a plain tensor at least this large, with a CRC wanted, goes by the native writer too (its
#: CRC then taken per cache-sized batch just before the write, not in a pass of its own)
_NATIVE_CRC_MIN = 1 << 20


def _write_tensor(sink: _Sink, t: torch.Tensor | _Joined, crc32: bool = True) -> int:
    """Write ``t``'s bytes; returns their CRC-32 (0 without ``crc32``). Into a plain file with
    the native module, by :func:`_write_rows` (one native call, the GIL released, the CRC
    taken there batch by batch from cache just before the kernel copies it): a
    :class:`_Joined` of several sources always, a plain tensor of ``_NATIVE_CRC_MIN`` bytes
    or more when its CRC is wanted. Otherwise a joined tensor goes chunk by chunk through the
    bounce buffer (a compressing sink, no native module), its CRC taken from the cache-hot
    chunk, and a plain one is handed to the sink as it is. With the native CRC
    (:data:`CRC32_IMPL` ``native-*``) a module-level ``_crc32`` swapped by a test or the
    benchmark's ``--crc`` sends everything by the other paths, through it."""
    native = _files is not None and sink.fd is not None and \
        (not crc32 or _crc32 is _files.crc32)
    if isinstance(t, _Joined) and len(t.sources) == 1:
        t = t.sources[0]             # its own bytes: written as a plain tensor
    if isinstance(t, _Joined):
        if native:
            return _write_rows(sink, list(t.sources), crc32)
        crc = 0
        for b, transient in t.chunks():
            if crc32:
                crc = _crc32(b, crc)
            sink.write(b, transient)
        return crc
    if not t.numel():
        return 0
    if native and crc32 and t.dim() and t.numel() * t.element_size() >= _NATIVE_CRC_MIN:
        return _write_rows(sink, [t.reshape(-1, t.shape[-1])], True)
    b = _bytes_of(t)
    sink.write(b)
    return _crc32(b) if crc32 else 0


def _write_rows(sink: _Sink, sources: list[torch.Tensor], crc32: bool = False) -> int:
    """The row interleaving of ``sources`` (2-D ``[T, W]`` tensors of one shape and dtype; one
    source: its own bytes) by one native writev at the sink's position, after what the sink
    holds; returns the bytes' CRC-32 with ``crc32`` (else 0)."""
    sink.close()
    first = sources[0]
    args = (sink.fd, [_bytes_of(x) for x in sources],
            int(first.shape[1]) * first.element_size(), 0, int(first.shape[0]))
    if crc32:
        n, crc = _files.writev_rows_crc32(*args, 0, CRC_THREAD_MIN)
    else:
        n, crc = _files.writev_rows(*args), 0
    sink.pos += n
    return crc


# -- torch.save's zip container, written without torch's copy and CRC -------------------------


def _hash_combine(seed: int, value: int) -> int:
    """c10::hash_combine on 64-bit size_t."""
    m = (1 << 64) - 1
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & m) + (seed >> 2)) & m)) & m


class _TorchZip:
    """What ``torch.serialization._save`` calls ``write_record`` on, streaming to a
    :class:`_Sink` the zip container that torch's ``PyTorchStreamWriter`` writes for
    ``torch.save(obj, file_object)``: the same records in the same order, local headers
    (flags 0x0808, stored, no times), ``FB`` padding extra fields aligning every record's data
    to the storage alignment, data descriptors, central directory and zip64 end records —
    byte for byte (tests/test_export_torchzip.py compares with torch.save). The CRC-32s are
    computed by :data:`CRC32_IMPL` (the same values). ``.data/serialization_id`` is torch's
    too: its last 20 digits combine the records' CRC-32s in write order as torch does; its
    first 20, torch's hash of the record names (taken in an ``unordered_set``'s order), are
    read from a torch.save of as many one-byte storages (:func:`_torch_names_hash`, cached),
    and only if that file's records differ are they this writer's own combination of the
    names' CRC-32s (torch.load only logs the id). Records stay below 4 GiB (no zip64 extra
    fields): :func:`_torch_save` falls back to torch.save beyond that."""

    def __init__(self, sink: _Sink, substitutes: dict[int, torch.Tensor | _Joined],
                 alignment: int, serialization_id: str | None = None,
                 crc32: bool = True) -> None:
        self.sink = sink
        self.crc32 = crc32              # False: every record's CRC-32 0 (torch's option)
        self.subst = substitutes        # placeholder storage data_ptr -> what is written
        self.alignment = alignment
        self.sid = serialization_id
        self.central: list[bytes] = []
        self.names: list[str] = []
        self.name_hash = 0
        self.crc_hash = 0

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        """``PyTorchStreamWriter.write_record``: what ``torch.serialization._save`` calls."""
        if isinstance(data, str):
            data = data.encode()
        what: Any
        if isinstance(data, (bytes, bytearray, memoryview)):
            what = bytes(data)
        else:   # an UntypedStorage
            what = self.subst.get(data.data_ptr()) if nbytes else None
            if what is None:
                what = torch.empty(0, dtype=torch.uint8).set_(data, 0, (data.nbytes(),), (1,))
        self.put(name, what, nbytes)

    def put(self, name: str, what: bytes | torch.Tensor | _Joined, nbytes: int) -> None:
        """Record ``name`` holding ``what``'s bytes (``nbytes`` of them: else ExportError)."""
        size = len(what) if isinstance(what, bytes) else what.nbytes \
            if isinstance(what, _Joined) else what.numel() * what.element_size()
        if size != nbytes:
            raise ExportError(f"record {name}: expected {nbytes} bytes, found {size}")
        full = f"archive/{name}".encode()
        offset = self.sink.pos
        pad = -(offset + 30 + len(full) + 4) % self.alignment
        flags = 0x0808 if size else 0x0800     # an empty record: no data descriptor (miniz)
        self.sink.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0,
                                    len(full), 4 + pad) + full + b"FB"
                        + struct.pack("<H", pad) + b"Z" * pad)
        crc = 0
        if isinstance(what, bytes):     # data.pkl, .format_version, ...: small
            if size:
                crc = _crc32(what) if self.crc32 else 0
                self.sink.write(what)
        else:
            crc = _write_tensor(self.sink, what, self.crc32)
        if size:
            self.sink.write(struct.pack("<IIII", 0x08074B50, crc, size, size))
            # torch combines the CRCs its data descriptor writes carry: non-empty records'
            self.crc_hash = _hash_combine(self.crc_hash, crc)
        self.central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, flags, 0, 0,
                                        0, crc, size, size, len(full), 0, 0, 0, 0, 0, offset)
                            + full)
        self.names.append(name)
        self.name_hash = _hash_combine(self.name_hash, zlib.crc32(name.encode()))

    def finish(self) -> None:
        """``write_end_of_file``: version and serialization id records, central directory,
        zip64 end record and locator, end record."""
        if "version" not in self.names and ".data/version" not in self.names:
            self.write_record("version", "3\n", 2)
        if "byteorder" not in self.names:
            self.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        names_part = _torch_names_hash(tuple(self.names)) or f"{self.name_hash:020d}"
        sid = self.sid or f"{names_part}{self.crc_hash:020d}"
        self.write_record(".data/serialization_id", sid, len(sid))
        cd_off = self.sink.pos
        for c in self.central:
            self.sink.write(c)
        cd_size = self.sink.pos - cd_off
        n = len(self.central)
        z64 = self.sink.pos
        self.sink.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 45, 0, 0, n, n,
                                    cd_size, cd_off)
                        + struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
                        + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, cd_size, cd_off, 0))
        self.sink.close()


@functools.lru_cache(maxsize=256)
def _torch_names_hash(names: tuple[str, ...]) -> str | None:
    """The first 20 digits of the ``.data/serialization_id`` torch.save writes for a file
    whose records (before the id) are ``names``: torch hashes only the record names there (in
    its ``unordered_set``'s order), so a torch.save of as many one-element storages gives
    them. None when such a file's records would not be ``names``."""
    n = sum(1 for x in names if x.startswith("data/"))
    buf = io.BytesIO()
    torch.save([torch.zeros(1, dtype=torch.uint8) for _ in range(n)], buf)
    z = zipfile.ZipFile(buf)
    theirs = [x.filename.split("/", 1)[1] for x in z.infolist()]
    if tuple(theirs[:-1]) != names or theirs[-1] != ".data/serialization_id":
        return None
    try:
        return z.read(z.infolist()[-1]).decode()[:20]
    except zipfile.BadZipFile:  # a caller's set_crc32_options(False): CRCs 0, zipfile refuses
        return None


def _own_zip_ok() -> bool:
    """True when this torch's ``serialization._save`` takes the arguments it is called with
    here (else every file goes through torch.save)."""
    import inspect

    f = getattr(torch.serialization, "_save", None)
    try:
        params = list(inspect.signature(f).parameters) if f is not None else []
    except (TypeError, ValueError):
        return False
    return params == ["obj", "zip_file", "pickle_module", "pickle_protocol",
                      "_disable_byteorder_record"]


_OWN_ZIP = _own_zip_ok()
#: records and files stay below this (no zip64 extra fields), else torch.save writes them
_ZIP32_LIMIT = 0xFFFFFFFF - (1 << 20)


def _materialized(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with every :class:`_Joined` assembled and every tensor its own storage: what
    torch.save is given."""
    return {k: v.materialize() if isinstance(v, _Joined) else
            _own(v) if isinstance(v, torch.Tensor) else v for k, v in obj.items()}


def _torch_save(obj: dict[str, Any], f: Any, *, serialization_id: str | None = None,
                crc32: bool = True) -> None:
    """``torch.save(obj, f)`` for a dict whose tensor values may be :class:`_Joined`: the bytes
    torch.save writes for the dict with those assembled (see :class:`_TorchZip` for the two
    differences), every tensor written as its own bytes (never a larger buffer it views), no
    tensor assembled or copied whole. Without ``crc32``, the bytes torch.save writes under
    ``torch.serialization.set_crc32_options(False)`` (every record's CRC-32 0: no pass over
    the data to take it). Falls back to torch.save itself when this torch's ``_save`` differs
    or the file would need zip64 records (with CRCs then, whatever ``crc32`` says: torch's
    switch is process-wide)."""
    import pickle

    total = sum(v.nbytes if isinstance(v, _Joined) else
                v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0
                for v in obj.values())
    if not _OWN_ZIP or total >= _ZIP32_LIMIT:
        torch.save(_materialized(obj), f)
        return
    align = int(getattr(torch.serialization, "_get_storage_alignment", lambda: 64)())
    z = _TorchZip(_Sink(f), {}, align, serialization_id, crc32)
    sig = _signature(obj, align)
    records = _RECORDS.get(sig) if sig is not None else None
    if records is None:
        subst: dict[int, torch.Tensor | _Joined] = {}
        flat: dict[str, Any] = {}
        for k, v in obj.items():
            if isinstance(v, (torch.Tensor, _Joined)):
                # untouched, so its pages never exist; a contiguous tensor's own strides (what
                # torch.save would pickle for it: they differ from torch.empty's for empty dims)
                ph = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) \
                    if isinstance(v, torch.Tensor) and v.is_contiguous() else \
                    torch.empty(v.shape, dtype=v.dtype)
                if ph.numel():
                    subst[ph.untyped_storage().data_ptr()] = v
                v = ph
            flat[k] = v
        rec = _Recording(subst, obj)
        torch.serialization._save(flat, rec, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
        records = tuple(rec.records)
        if sig is not None:
            with _RECORDS_LOCK:         # the export's threads: one evicts while one inserts
                if len(_RECORDS) >= _RECORDS_MAX:
                    _RECORDS.pop(next(iter(_RECORDS)))
                _RECORDS[sig] = records
    for name, payload, nbytes in records:
        z.put(name, payload if isinstance(payload, bytes) else
              _EMPTY if payload is None else obj[payload], nbytes)
    z.finish()


class _Recording:
    """What ``torch.serialization._save`` calls while pickling ``obj`` (placeholders in place of
    its tensors, ``subst`` mapping each placeholder's storage to the value it stands for):
    keeps ``(record name, bytes | obj's key of the tensor it holds | None (an empty storage),
    nbytes)`` in write order, writes nothing."""

    def __init__(self, subst: dict[int, torch.Tensor | _Joined], obj: dict[str, Any]) -> None:
        key_of = {id(v): k for k, v in obj.items()}
        self.key_by_ptr = {ptr: key_of[id(v)] for ptr, v in subst.items()}
        self.records: list[tuple[str, bytes | str | None, int]] = []

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        if isinstance(data, str):
            data = data.encode()
        if isinstance(data, (bytes, bytearray, memoryview)):
            self.records.append((name, bytes(data), nbytes))
            return
        key = self.key_by_ptr.get(data.data_ptr()) if nbytes else None
        if key is None and nbytes:      # a storage that is none of obj's values
            raise ExportError(f"record {name}: a storage of {nbytes} bytes that is none of "
                              f"the saved values")
        self.records.append((name, key, nbytes))


#: records of a :func:`_torch_save`, by what decides them (:func:`_signature`): the pickle
#: (data.pkl) and the record list depend only on the keys, dtypes, shapes and strides of a
#: dict of tensors, so samples of one length and model pickle once (the pickling was ~160 us
#: of a 10 MB SpecForge file's ~3.5 ms on the 2-core CPU machine)
_RECORDS: dict[tuple, tuple[tuple[str, bytes | str | None, int], ...]] = {}
_RECORDS_MAX = 1024
_RECORDS_LOCK = threading.Lock()
_EMPTY = torch.empty(0, dtype=torch.uint8)


def _signature(obj: dict[str, Any], align: int) -> tuple | None:
    """What the records of ``torch.save(obj)`` depend on, for a dict of str keys whose values
    are all tensors or :class:`_Joined` (None otherwise: a dict with other values, e.g. a
    sample's metadata, is pickled every time)."""
    sig: list[Any] = [align, torch.serialization.DEFAULT_PROTOCOL]
    for k, v in obj.items():
        if not isinstance(k, str):
            return None
        if isinstance(v, _Joined):
            sig.append((k, None, v.dtype, v.shape))
        elif isinstance(v, torch.Tensor) and v.device.type == "cpu" and not v.requires_grad \
                and type(v) is torch.Tensor and v.layout == torch.strided:
            sig.append((k, v.is_contiguous(), v.dtype, tuple(v.shape),
                        tuple(v.stride()) if v.is_contiguous() else None))
        else:
            return None
    return tuple(sig)
