"""Safetensors shard writer: durable, resumable, readable by the ``safetensors`` library as is.

The on-disk format (file names, header layout, metadata keys, journals and recovery rules) is
specified in :mod:`hscapture.shard_format`; ``index.jsonl`` and the journals are read and
appended by :mod:`hscapture.shard_index`. This module is the writer and its recovery.

Durability contract of :class:`ShardWriter`
-------------------------------------------
``add(sample)`` writes the sample's bytes (not durable yet); ``flush()`` makes every sample
added so far durable and returns those rids not reported before (the caller releases ring space
only for them); ``close()`` finalizes the open shard and also returns newly durable rids. A
shard that fills up (``max_shard_bytes`` or the reserved header space) is finalized inside
``add``; its rids are returned by the next ``flush``/``close``. On a full disk (ENOSPC, EDQUOT,
EFBIG) ``add`` truncates the failing sample's partial bytes away, finalizes the shard with the
samples before it, closes the writer and raises :class:`~hscapture.errors.ShardError` naming the
rid (``err.rid``); ``flush()`` on the closed writer then returns the rids made durable by that
finalization. The writer is not thread-safe; one writer per directory (enforced by ``.lock``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from . import shard_index as _index
from .codec import SCALE_PREFIX
from .errors import DuplicateRidError, SampleRefusedError, ShardError
from .notice import FIELD_NAME_RULE
from .sample import Sample
from .shard_format import (
    ANY_FILE_RE,
    CODEC_KEY_PREFIX,
    DEFAULTABLE_KEYS,
    DTYPE_CODES,
    FIELD_NAME_RE,
    FIELD_PREFIX,
    FORMAT,
    FORMAT_VERSION,
    INDEX_NAME,
    JOURNAL_SUFFIX,
    LOCK_NAME,
    META_KEYS,
    SHARD_PREFIX,
    SHARD_SUFFIX,
    TMP_SUFFIX,
    build_header,
    encode_header,
    header_meta,
    jdump,
    layout,
    shard_name,
)
from .shard_index import JournalEntry, fsync_dir, read_index

__all__ = [
    "ShardWriter",
    "DuplicateRidError",
    "SampleRefusedError",
    "read_index",
    "load_sample",
    "FORMAT",
    "FORMAT_VERSION",
    "INDEX_NAME",
]

DEFAULT_MAX_SHARD_BYTES = 2 << 30
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def load_sample(out_dir: str | os.PathLike, rid: str) -> dict[str, torch.Tensor]:
    """:func:`hscapture.reader.load_sample` (kept here for compatibility)."""
    from .reader import load_sample as _load

    return _load(out_dir, rid)


def _default_header_reserve(max_shard_bytes: int) -> int:
    r = max(64 << 10, min(16 << 20, max_shard_bytes // 1024))
    return (r + 4095) // 4096 * 4096


def _byte_view(t: torch.Tensor) -> memoryview:
    """Zero-copy byte view of a CPU tensor's memory (a copy only if it is not contiguous)."""
    if t.device.type != "cpu":
        raise ShardError(f"tensor is on {t.device}, expected a CPU tensor")
    if not t.is_contiguous():
        t = t.contiguous()
    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _check_rid(rid: Any) -> None:
    """The protocol's one rid rule (:func:`hscapture.notice.check_rid`)."""
    from .errors import InvalidRidError
    from .notice import check_rid

    try:
        check_rid(rid)
    except InvalidRidError as exc:
        raise SampleRefusedError(str(exc), rid) from None


def _schema(sample: Sample, defaults: dict[str, str]) -> tuple:
    meta = sample.meta or {}
    # the sample's own value wins; an empty one falls back to the writer's metadata
    conv = meta.get("convention") or defaults.get("convention", "")
    model = meta.get("model") or defaults.get("model", "")
    return (
        str(sample.dtype),
        int(sample.hidden),
        tuple(int(x) for x in sample.layers),
        tuple(str(k) for k in sample.layer_kinds),
        "" if conv is None else str(conv),
        "" if model is None else str(model),
    )


@dataclass
class _Shard:
    n: int
    name: str
    tmp_path: str
    journal_path: str
    fd: int
    reserve: int
    created: str
    schema: tuple | None = None
    data_len: int = 0
    entries: list = field(default_factory=list)
    journaled: int = 0  # entries[:journaled] have durable journal lines
    journal_fd: int = -1
    tensors_json_len: int = 0
    producers: dict = field(default_factory=dict)
    meta_len: int = 0
    rids: set = field(default_factory=set)



_PARALLEL_MIN_PART = 4 << 20   # below this many bytes per thread, one pwritev is faster


class ShardWriter:
    """Append :class:`~hscapture.sample.Sample` objects to safetensors shards in ``out_dir``.

    The on-disk format: :mod:`hscapture.shard_format`; the durability contract: this
    module's docstring.

    Args:
        out_dir: shard directory; created (with parents) if missing.
        max_shard_bytes: a shard is closed before a sample would push its data section past
            this size (a single larger sample gets a shard of its own).
        metadata: extra ``__metadata__`` entries (str → str) for every shard; ``model`` and
            ``convention`` act as defaults when a sample's meta lacks them, the other format
            keys are reserved.
        fsync: fsync data, journal, shards, index and directory (turn off only for scratch data).
        header_reserve: bytes reserved at the start of each shard for its header (default
            ``max_shard_bytes/1024`` clamped to 64 KiB..16 MiB); a shard is closed early when
            its header would no longer fit.
        compression: ``None`` (default: tensors stored as they are), ``"zstd"`` (lossless,
            byte-shuffled zstd; needs the ``compress`` extra) or ``"fp8"`` (lossy FP8 e4m3 with
            one float32 scale per token row). Applies to hidden-state tensors only; token ids
            and fields stay exact. Recorded per shard and per tensor
            (:mod:`hscapture.shard_format`); every hscapture reader decodes it. ``max_shard_bytes`` counts stored bytes.
        compression_level: zstd level (default 1, :data:`hscapture.codec.DEFAULT_ZSTD_LEVEL`);
            only with ``"zstd"``.

    Raises :class:`~hscapture.codec.CodecUnavailableError` (a :class:`ShardError`) at once
    when ``compression="zstd"`` and the ``zstandard`` package is missing.
    """

    def __init__(self, out_dir: str | os.PathLike, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                 metadata: dict[str, str] | None = None, fsync: bool = True,
                 header_reserve: int | None = None, write_threads: int = 1,
                 compression: str | None = None, compression_level: int | None = None) -> None:
        from . import codec as _codec

        self.compression = _codec.resolve(compression, compression_level)
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        # write_threads > 1 splits large samples across threads (disjoint byte ranges, pwritev
        # releases the GIL). Off by default: Linux serializes writes to one file on its inode
        # lock, and on the H200 machine 4 threads made the drain into tmpfs slower (0.70 of
        # raw write vs 0.95 with one thread, benchmarks/results/h200-2026-11-30/e2e-*).
        self.write_threads = max(1, int(write_threads))
        self._pool: ThreadPoolExecutor | None = None
        if max_shard_bytes <= 0:
            raise ValueError("max_shard_bytes must be positive")
        self.max_shard_bytes = int(max_shard_bytes)
        self.fsync = bool(fsync)
        reserve = header_reserve or _default_header_reserve(self.max_shard_bytes)
        self.header_reserve = (max(int(reserve), 4096) + 7) // 8 * 8
        self._meta: dict[str, str] = {}
        self._defaults: dict[str, str] = {}
        for k, v in (metadata or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"metadata must map str to str, got {k!r}: {v!r}")
            if k in DEFAULTABLE_KEYS:
                self._defaults[k] = v
            elif k in META_KEYS or k.startswith(CODEC_KEY_PREFIX):
                raise ValueError(f"metadata key {k!r} is reserved by the shard format "
                                 f"(reserved: {sorted(META_KEYS - DEFAULTABLE_KEYS)} and keys "
                                 f"starting with {CODEC_KEY_PREFIX!r})")
            else:
                self._meta[k] = v
        if self.compression is not None:
            self._meta.update(self.compression.shard_metadata())
        self._closed = True
        self._shard: _Shard | None = None
        self._unreported: list[str] = []
        self._lock_fd = -1
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.out_dir, LOCK_NAME),
                                    os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ShardError(f"cannot use shard directory {self.out_dir}: "
                             f"{e.strerror or e} (errno {e.errno})") from e
        if not os.access(self.out_dir, os.W_OK | os.X_OK):
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise ShardError(f"cannot use shard directory {self.out_dir}: not writable")
        lock_path = os.path.join(self.out_dir, LOCK_NAME)
        for _ in range(16):
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(self._lock_fd)
                self._lock_fd = -1          # not ours: never unlink it
                raise ShardError(f"shard directory {self.out_dir} is locked by another live "
                                 f"ShardWriter ({e.strerror})") from e
            # a closing writer unlinks the lock file while holding it: a lock taken on the
            # unlinked file claims nothing, so start over on the current one
            try:
                if os.stat(lock_path).st_ino == os.fstat(self._lock_fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._recover()
            self._index: dict[str, dict] = read_index(self.out_dir)
            self._next = self._highest_number() + 1
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._closed = False

    # -- public API -----------------------------------------------------------------------

    @property
    def rids(self) -> set[str]:
        """rids already in the index (finalized) or in the open shard."""
        s = set(self._index)
        if self._shard is not None:
            s.update(self._shard.rids)
        return s

    def seen(self, rid: str) -> bool:
        """True if ``rid`` is in the index or in the open shard (skip it, don't add it again)."""
        return rid in self._index or (self._shard is not None and rid in self._shard.rids)

    @property
    def closed(self) -> bool:
        return self._closed

    def add(self, sample: Sample) -> None:
        """Write ``sample``'s bytes into the open shard (durable only after :meth:`flush`)."""
        if self._closed:
            raise ShardError(f"ShardWriter({self.out_dir}) is closed; cannot add rid {sample.rid!r}")
        rid = sample.rid
        _check_rid(rid)
        if self.seen(rid):
            raise DuplicateRidError(f"rid {rid!r} is already in {self.out_dir}", rid)
        schema = _schema(sample, self._defaults)
        try:
            items, codecs = self._validate(sample)
        except SampleRefusedError:
            raise
        except ShardError as exc:   # a defect of this sample alone
            raise SampleRefusedError(str(exc), rid) from None
        nbytes = sum(len(v) for _, _, _, v in items)
        stored = nbytes - sum(len(v) for n, _, _, v in items
                              if n == "token_ids" or n.startswith(FIELD_PREFIX))
        index = {
            "v": FORMAT_VERSION, "rid": rid, "shard": None,
            "num_tokens": int(sample.num_tokens), "nbytes": int(sample.nbytes),
            "layers": list(schema[2]), "layer_kinds": list(schema[3]), "dtype": schema[0],
            "hidden": schema[1], "producer_id": str(sample.producer_id), "epoch": int(sample.epoch),
            "complete": bool((sample.meta or {}).get("complete", True)),
            "fields": sorted(sample.fields or {}),
            "meta": json.loads(jdump(sample.meta or {})),
        }
        if self.compression is not None:
            index["codec"] = self.compression.name
            index["stored_nbytes"] = int(stored)
        # a compressed sample's per-tensor records: one more __metadata__ entry in the header
        codec_len = (len(jdump(CODEC_KEY_PREFIX + rid).encode("utf-8"))
                     + len(jdump(jdump(codecs)).encode("utf-8")) + 2) if codecs else 0
        sh = self._shard
        rid_jlen = len(jdump(rid).encode("utf-8"))
        pid, epoch = index["producer_id"], index["epoch"]
        # Roll over: size limit, schema change, or header would not fit.
        if sh is not None and sh.entries:
            tensors, jlen = layout(rid_jlen, items, sh.data_len)
            jlen += codec_len
            if (sh.data_len + nbytes > self.max_shard_bytes or sh.schema != schema
                    or not self._header_fits(sh, jlen, pid, epoch)):
                self._finalize_current()
                sh = None
        if sh is None or not sh.entries:
            if sh is None:
                try:
                    sh = self._open_shard()
                except ShardError as e:
                    self._closed = True
                    self._release_lock()
                    err = ShardError(f"could not write rid {rid!r}: {e}; the writer is closed")
                    err.rid = rid  # type: ignore[attr-defined]
                    raise err from e
            sh.schema = schema
            sh.meta_len = self._meta_len(sh, sh.producers)
            tensors, jlen = layout(rid_jlen, items, sh.data_len)
            jlen += codec_len
            if not self._header_fits(sh, jlen, pid, epoch):
                raise ShardError(f"the header entries of rid {rid!r} do not fit in the "
                                 f"{sh.reserve}-byte header reserve")
        begin = sh.data_len
        try:
            self._write_parallel(sh.fd, [v for *_, v in items], sh.reserve + begin, nbytes)
        except OSError as e:
            self._fail_write(e, rid, sh, begin)
        index["shard"] = sh.name
        end = begin + nbytes
        sh.entries.append(JournalEntry(rid, tensors, end, index, codecs or None))
        sh.rids.add(rid)
        sh.data_len = end
        sh.tensors_json_len += jlen
        if epoch not in sh.producers.get(pid, ()):
            sh.producers.setdefault(pid, set()).add(epoch)
            sh.meta_len = self._meta_len(sh, sh.producers)

    def flush(self) -> list[str]:
        """Make every sample added so far durable; return the rids that became durable since the
        last call (including those of shards finalized meanwhile)."""
        if not self._closed and self._shard is not None:
            sh = self._shard
            pending = [e.rid for e in sh.entries[sh.journaled:]]
            try:
                self._journal_pending(sh)
            except OSError as e:
                self._fail_flush(e, pending)
        out, self._unreported = self._unreported, []
        return out

    def close(self) -> list[str]:
        """Finalize the open shard (header, fsync, rename, index) and release the directory.
        Returns the rids that became durable since the last :meth:`flush`."""
        if not self._closed:
            try:
                if self._shard is not None:
                    self._finalize_current()
            finally:
                self._closed = True
                self._release_lock()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        out, self._unreported = self._unreported, []
        return out

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # never finalize implicitly; just drop fds
        try:
            if self._shard is not None:
                for fd in (self._shard.fd, self._shard.journal_fd):
                    if fd >= 0:
                        os.close(fd)
                self._shard = None
            self._release_lock()
        except Exception:
            pass

    # -- writing ------------------------------------------------------------------------

    def _validate(self, s: Sample) -> tuple[list, dict[str, dict]]:
        """``([(stored name, st dtype, shape, bytes view), ...] in data order, codec records)``."""
        T, H = int(s.num_tokens), int(s.hidden)
        if len(s.layers) != len(s.layer_kinds):
            raise ShardError(f"rid {s.rid!r}: {len(s.layers)} layers but {len(s.layer_kinds)} kinds")
        tid = s.token_ids
        if tid.dtype not in (torch.int32, torch.int64) or tuple(tid.shape) != (T,):
            raise ShardError(f"rid {s.rid!r}: token_ids must be int32/int64 of shape [{T}], got "
                             f"{tid.dtype} {list(tid.shape)}")
        items = []
        want_dtype = getattr(torch, str(s.dtype), None)
        for i, (name, t) in enumerate(s.tensors.items()):
            if "/" in name or name == "token_ids" or not name or name.startswith(FIELD_PREFIX) \
                    or name.startswith(SCALE_PREFIX):
                raise ShardError(f"rid {s.rid!r}: invalid tensor name {name!r}")
            if tuple(t.shape) != (T, H):
                raise ShardError(f"rid {s.rid!r}: tensor {name!r} has shape {list(t.shape)}, "
                                 f"expected [{T}, {H}]")
            if t.dtype not in DTYPE_CODES or (isinstance(want_dtype, torch.dtype) and t.dtype != want_dtype):
                raise ShardError(f"rid {s.rid!r}: tensor {name!r} has dtype {t.dtype}, "
                                 f"sample says {s.dtype}")
            items.append((-t.element_size(), i, name, t))
        items.append((-tid.element_size(), len(items), "token_ids", tid))
        for fname, ft in (s.fields or {}).items():
            if not isinstance(fname, str) or not FIELD_NAME_RE.fullmatch(fname):
                raise ShardError(f"rid {s.rid!r}: invalid field name {fname!r} (expected "
                                 f"{FIELD_NAME_RULE})")
            if not isinstance(ft, torch.Tensor) or ft.dtype not in (torch.uint8, torch.bool) \
                    or tuple(ft.shape) != (T,):
                raise ShardError(f"rid {s.rid!r}: field {fname!r} must be a uint8 (or bool) "
                                 f"tensor of shape [{T}], got "
                                 f"{getattr(ft, 'dtype', type(ft).__name__)} "
                                 f"{list(getattr(ft, 'shape', []))}")
            if ft.dtype == torch.bool:
                ft = ft.to(torch.uint8)
            items.append((-1, len(items), FIELD_PREFIX + fname, ft))
        codecs: dict[str, dict] = {}
        if self.compression is not None:
            from .codec import encode

            coded = []
            for neg, i, name, t in items:
                enc = None
                if name != "token_ids" and not name.startswith(FIELD_PREFIX):
                    enc = encode(self.compression, name, t, DTYPE_CODES[t.dtype])
                if enc is None:
                    coded.append((neg, i, name, DTYPE_CODES[t.dtype], [int(d) for d in t.shape], t))
                    continue
                parts, record = enc
                codecs[name] = record
                for k, (sname, st, shape, data) in enumerate(parts):
                    size = data.element_size() if isinstance(data, torch.Tensor) else 1
                    coded.append((-size, i + k / 4, sname, st, shape, data))
        else:
            coded = [(neg, i, name, DTYPE_CODES[t.dtype], [int(d) for d in t.shape], t)
                     for neg, i, name, t in items]
        coded.sort(key=lambda x: (x[0], x[1]))
        return [(name, st, shape, _byte_view(t) if isinstance(t, torch.Tensor)
                 else memoryview(t).cast("B"))
                for _, _, name, st, shape, t in coded], codecs

    def _write_parallel(self, fd: int, views: list, offset: int, nbytes: int) -> None:
        """Write ``views`` contiguously at ``offset``; split across threads when large.

        Returns only once every byte is written; the first error is raised.
        """
        parts = min(self.write_threads, nbytes // _PARALLEL_MIN_PART)
        if parts <= 1:
            self._pwritev(fd, views, offset)
            return
        flat = [memoryview(v).cast("B") for v in views if len(v)]
        step = -(-nbytes // parts)
        jobs, cur, cur_off, cur_len = [], [], offset, 0
        for v in flat:
            while len(v):
                take = min(len(v), step - cur_len)
                cur.append(v[:take])
                v = v[take:]
                cur_len += take
                if cur_len == step:
                    jobs.append((cur, cur_off))
                    cur_off += cur_len
                    cur, cur_len = [], 0
        if cur:
            jobs.append((cur, cur_off))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.write_threads, thread_name_prefix="hsc-shard")
        futures = [self._pool.submit(self._pwritev, fd, j, o) for j, o in jobs]
        errors = [f.exception() for f in futures]   # waits for all of them
        for err in errors:
            if err is not None:
                raise err

    @staticmethod
    def _pwritev(fd: int, views: list, offset: int) -> None:
        views = [v for v in views if len(v)]
        while views:
            n = os.pwritev(fd, views[:1024], offset)
            if n <= 0:
                raise OSError(errno.EIO, "pwritev wrote nothing")
            offset += n
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if n:
                views[0] = views[0][n:]

    def _meta_len(self, sh: _Shard, producers: dict) -> int:
        """Length of ``"__metadata__":{...},`` in the header (num_samples at its widest)."""
        meta = header_meta(sh.schema, self._meta, sh.created, producers, "9" * 12)
        return len(jdump({"__metadata__": meta}).encode("utf-8"))

    def _header_fits(self, sh: _Shard, add_len: int, pid: str, epoch: int) -> bool:
        meta_len = sh.meta_len
        if epoch not in sh.producers.get(pid, ()):
            producers = {p: set(v) for p, v in sh.producers.items()}
            producers.setdefault(pid, set()).add(epoch)
            meta_len = self._meta_len(sh, producers)
        return meta_len + sh.tensors_json_len + add_len <= sh.reserve - 8

    def _open_shard(self) -> _Shard:
        n = self._next
        self._next += 1
        name = shard_name(n)
        tmp = os.path.join(self.out_dir, name + ".tmp")
        jpath = os.path.join(self.out_dir, name[: -len(SHARD_SUFFIX)] + JOURNAL_SUFFIX)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ShardError(f"cannot create {tmp}: {e.strerror}") from e
        try:
            # Allocate the header area for real (a sparse hole could hit ENOSPC at close).
            self._pwritev(fd, [memoryview(b"\0" * 8 + b" " * (self.header_reserve - 8))], 0)
        except OSError as e:
            os.close(fd)
            os.unlink(tmp)
            raise ShardError(f"cannot create {tmp}: {e.strerror} (errno {e.errno})") from e
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._shard = _Shard(n, name, tmp, jpath, fd, self.header_reserve, created)
        return self._shard

    def _journal_pending(self, sh: _Shard) -> None:
        """fdatasync the data, then append + fsync journal lines of unjournaled entries."""
        if sh.journaled == len(sh.entries):
            return
        if self.fsync:
            os.fdatasync(sh.fd)
        new_file = sh.journal_fd < 0
        if new_file:
            sh.journal_fd = os.open(sh.journal_path,
                                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                                    0o644)
        lines = []
        if new_file:
            lines.append(jdump({"kind": "shard", "v": FORMAT_VERSION, "shard": sh.name,
                                 "header_reserve": sh.reserve, "created": sh.created,
                                 "metadata": self._meta, "schema": list(sh.schema or ())}) + "\n")
        lines.extend(e.journal_line() for e in sh.entries[sh.journaled:])
        data = "".join(lines).encode("utf-8")
        size = os.fstat(sh.journal_fd).st_size
        try:
            self._pwritev(sh.journal_fd, [memoryview(data)], 0)  # O_APPEND: offset ignored
        except OSError:
            try:  # cut the torn tail (recovery would ignore it anyway)
                os.ftruncate(sh.journal_fd, size)
            except OSError:
                pass
            raise
        if self.fsync:
            os.fsync(sh.journal_fd)
            if new_file:
                fsync_dir(self.out_dir)
        n_new = len(sh.entries) - sh.journaled
        self._unreported.extend(e.rid for e in sh.entries[sh.journaled:])
        sh.journaled += n_new

    def _finalize_current(self) -> None:
        sh = self._shard
        assert sh is not None
        if not sh.entries:
            os.close(sh.fd)
            os.unlink(sh.tmp_path)
            self._shard = None
            return
        try:
            self._journal_pending(sh)
        except OSError as e:
            self._fail_flush(e, [e_.rid for e_ in sh.entries[sh.journaled:]])
        os.close(sh.journal_fd)
        sh.journal_fd = -1
        os.close(sh.fd)
        sh.fd = -1
        entries = sh.entries
        self._shard = None
        try:
            _finalize_shard(self.out_dir, sh.name, sh.schema, self._meta, sh.created, entries,
                            sh.reserve, sh.data_len, self._index, self.fsync)
        except OSError as e:
            self._closed = True
            self._release_lock()
            raise ShardError(f"finalizing {sh.name} in {self.out_dir} failed: {e.strerror} "
                             f"(errno {e.errno}); its journaled samples will be recovered by the "
                             f"next ShardWriter on this directory") from e

    def _fail_write(self, e: OSError, rid: str, sh: _Shard, begin: int) -> None:
        """A sample's write failed: cut its partial bytes, finalize what was written, close."""
        reason = f"{e.strerror or e} (errno {e.errno})"
        problems = []
        try:
            os.ftruncate(sh.fd, sh.reserve + begin)
        except OSError as e2:
            problems.append(f"truncate failed: {e2.strerror}")
        self._closed = True
        try:
            self._finalize_current()
        except ShardError as e3:
            problems.append(str(e3))
        self._release_lock()
        kind = "disk full" if e.errno in _FULL_ERRNOS else "write failed"
        msg = (f"{kind}: could not write rid {rid!r} to {sh.tmp_path}: {reason}; the writer is "
               f"closed, the shard was finalized with the {len(sh.entries)} sample(s) before it")
        if problems:
            msg += "; " + "; ".join(problems)
        err = ShardError(msg)
        err.rid = rid  # type: ignore[attr-defined]
        err.errno = e.errno  # type: ignore[attr-defined]
        raise err from e

    def _fail_flush(self, e: OSError, pending: list[str]) -> None:
        """fdatasync or the journal failed: leave the last durable state for recovery, close."""
        sh = self._shard
        self._closed = True
        if sh is not None:
            for fd in (sh.fd, sh.journal_fd):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self._shard = None
        self._release_lock()
        err = ShardError(f"flush failed in {self.out_dir}: {e.strerror or e} (errno {e.errno}); "
                         f"rids not durable: {pending}; the writer is closed, earlier flushed "
                         f"samples are recovered by the next ShardWriter on this directory")
        err.rid = pending[0] if pending else None  # type: ignore[attr-defined]
        err.rids = pending  # type: ignore[attr-defined]
        raise err from e

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            try:
                # remove the lock file while still holding the lock (no other writer can be
                # inside), so a closed writer leaves nothing behind
                os.unlink(os.path.join(self.out_dir, LOCK_NAME))
            except OSError:
                pass
            try:
                os.close(self._lock_fd)
            finally:
                self._lock_fd = -1

    # -- recovery -----------------------------------------------------------------------

    def _highest_number(self) -> int:
        hi = -1
        for f in os.listdir(self.out_dir):
            m = ANY_FILE_RE.match(f)
            if m:
                hi = max(hi, int(m.group(1)))
        return hi

    def _recover(self) -> None:
        d = self.out_dir
        _index.repair_index_tail(d, self.fsync)
        names = sorted(os.listdir(d))
        for f in names:
            if f.endswith(JOURNAL_SUFFIX) and f.startswith(SHARD_PREFIX):
                self._recover_journal(f)
        for f in os.listdir(d):
            if f.endswith(TMP_SUFFIX) and f.startswith(SHARD_PREFIX):
                # no journal → nothing in it was ever reported durable
                os.unlink(os.path.join(d, f))
        if self.fsync:
            fsync_dir(d)

    def _recover_journal(self, jname: str) -> None:
        d = self.out_dir
        jpath = os.path.join(d, jname)
        header, entries = _index.read_journal(jpath)
        if header is None:
            os.unlink(jpath)
            return
        name = header["shard"]
        final, tmp = os.path.join(d, name), os.path.join(d, name + ".tmp")
        if os.path.exists(tmp) and entries:
            _finalize_shard(d, name, tuple(header["schema"]), header.get("metadata", {}),
                            header["created"], entries, int(header["header_reserve"]),
                            entries[-1].end, None, self.fsync, tmp_path=tmp)
        elif os.path.exists(final):
            _index.append_index(d, name, entries, read_index(d), self.fsync)
        elif entries:
            os.rename(jpath, jpath + ".orphaned")
            raise ShardError(f"journal {jpath} lists {len(entries)} sample(s) but neither {tmp} nor "
                             f"{final} exists; moved it to {jpath}.orphaned")
        for p in (tmp, jpath):
            if os.path.exists(p):
                os.unlink(p)
        if self.fsync:
            fsync_dir(d)


def _finalize_shard(d: str, name: str, schema: tuple, user_meta: dict, created: str,
                    entries: list[JournalEntry], reserve: int, data_len: int, index: dict | None,
                    fsync: bool, tmp_path: str | None = None) -> None:
    """tmp → header → fsync → rename → dir fsync → index append → journal removed."""
    tmp = tmp_path or os.path.join(d, name + ".tmp")
    final = os.path.join(d, name)
    header = encode_header(build_header(schema, user_meta, created, entries), reserve)
    if header is None:
        raise ShardError(f"header of {name} does not fit its {reserve}-byte reserve")
    fd = os.open(tmp, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < reserve + data_len:
            raise ShardError(f"{tmp} has {size} bytes, its journal needs {reserve + data_len}")
        os.ftruncate(fd, reserve + data_len)
        ShardWriter._pwritev(fd, [memoryview(header)], 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    if fsync:
        fsync_dir(d)
    _index.append_index(d, name, entries, index if index is not None else read_index(d), fsync)
    jpath = os.path.join(d, name[: -len(SHARD_SUFFIX)] + JOURNAL_SUFFIX)
    if os.path.exists(jpath):
        os.unlink(jpath)
        if fsync:
            fsync_dir(d)
