"""Safetensors shard writer: durable, resumable, readable by the ``safetensors`` library as is.

Shard directory format (version 1)
==================================

The key words MUST, MUST NOT, SHOULD and MAY are used as in RFC 2119.

Files in a shard directory::

    shard-00000.safetensors      finished shards (plain safetensors files)
    shard-00001.safetensors
    index.jsonl                  one JSON line per sample, append-only
    shard-00002.safetensors.tmp  the shard being written (absent when no writer is live)
    shard-00002.journal          its journal (absent when no writer is live)
    .lock                        advisory lock held by the live writer (flock, exclusive)

Shards
------
* A finished shard is named ``shard-{n:05d}.safetensors`` (``n`` from 0; readers MUST accept
  more than 5 digits). It is a standard safetensors file: 8-byte little-endian header length
  ``N``, ``N`` bytes of UTF-8 JSON header, then the data section. The header JSON MAY be padded
  with trailing spaces (0x20), as the safetensors format allows; writers choose ``N`` so that
  the data section starts at a multiple of 8 bytes.
* Tensor names are ``"{rid}/{name}"``. ``name`` is a layer name
  (:func:`hscapture.sample.layer_name`: ``layer_{L}``, ``final_norm``, ``{kind}_{L}``) of shape
  ``[num_tokens, hidden]`` and the sample's dtype, or ``token_ids`` of shape ``[num_tokens]``
  (I32 or I64), or ``field.{field}`` of shape ``[num_tokens]`` and dtype U8: a per-token side
  field of the sample (:attr:`hscapture.sample.Sample.fields`, e.g. ``field.loss_mask``, 1 =
  the token is trained on); ``field`` matches ``[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}``. Readers
  MUST hand fields to the user and exports MUST honour ``loss_mask`` when present.
  ``name`` MUST NOT contain ``/``; ``rid`` is stored verbatim (no escaping) and
  MAY contain ``/`` or any other character: readers MUST split a tensor name at its LAST ``/``.
  rids follow the protocol's one rule (`hscapture.notice.check_rid`: 1..512 UTF-8 bytes, valid Unicode, no C0 control characters).
* Tensors of one sample are contiguous in the data section (larger element size first, token
  ids last among equals); samples follow each other in the order they were added. Data MAY be
  unaligned to the element size (safetensors readers copy such tensors).
* ``__metadata__`` (string → string) MUST contain ``format`` = ``hscapture.shard``,
  ``format_version`` = ``1``, ``num_samples``, ``dtype`` (torch name, e.g. ``bfloat16``),
  ``hidden``, ``layers`` / ``layer_kinds`` / ``layer_names`` (JSON lists, one entry per
  captured layer), ``convention`` and ``model`` (empty string when unknown), ``producers``
  (JSON object producer_id → sorted list of epochs seen), ``created`` (UTC ISO-8601) and
  ``writer``; it MAY contain any further keys the user passed as ``metadata`` (keys starting
  with ``codec:`` are reserved). All samples of one shard share dtype, hidden, layers, layer
  kinds, convention and model: a writer starts a new shard when any of them changes.
* The final norm (kind ``final_norm``) has no layer id of its own: its ``layers`` entry is
  JSON ``null``, and when the capture knew the decoder layer it follows, ``__metadata__`` holds
  ``final_norm_after_layer`` (that layer's 0-based id, the model's last) and ``num_layers``
  (one more). Shards written before these keys list the final norm with that layer's id
  instead (e.g. ``[1, 3, 7]`` for kinds ``[residual, residual, final_norm]``); readers MUST
  accept both and MUST NOT read that id as a residual layer. (``index.jsonl`` lines and
  :class:`~hscapture.sample.Sample` keep the id, as the producer recorded it.)
* A shard is written as ``.tmp`` and renamed into place only once complete and fsync'd; a file
  named ``*.safetensors`` is therefore always complete.

Compressed shards (``ShardWriter(compression=...)``, off by default)
--------------------------------------------------------------------
A compressed shard is still a plain safetensors file. Only hidden-state tensors are encoded;
``token_ids`` and ``field.*`` tensors are stored as above.

* ``__metadata__`` has ``codec`` (``zstd`` or ``fp8``) and ``codec_params`` (JSON: the zstd
  ``level``, ``lossless``, ...). A reader that does not know the codec MUST refuse the shard.
* Per sample, ``__metadata__["codec:{rid}"]`` is a JSON object: stored tensor name → record
  ``{"codec", "dtype", "shape", ...}`` with the **logical** (captured) safetensors dtype and
  shape. A tensor without a record is stored as is; readers decode by the record alone, never
  by guessing from a stored dtype.
* ``zstd`` (lossless): tensor ``{rid}/{name}`` is ``U8 [n]``: one zstd frame (with its content
  size) of the tensor's bytes split into byte planes (``"shuffle": itemsize``: plane ``b`` holds
  byte ``b`` of every little-endian element, planes in order). Decoding gives the captured
  bytes exactly.
* ``fp8`` (lossy): tensor ``{rid}/{name}`` is ``F8_E4M3 [T, H]`` and ``{rid}/scale.{name}``
  (named by the record's ``"scale"``) is ``F32 [T]``; the value is ``q * scale[t]`` per row
  (``scale = amax(|row|) / 448``, 0 for an all-zero row), cast to the logical dtype. A tensor
  holding inf or NaN is stored as is (no record). Tensor names starting with ``scale.`` are
  reserved.
* Index lines of compressed samples add ``codec`` and ``stored_nbytes`` (hidden-state bytes as
  stored, scales included); ``nbytes`` stays the logical size. ``max_shard_bytes`` counts
  stored bytes. Journal sample lines carry the records as ``codecs``.

index.jsonl
-----------
* One JSON object per line, ``\\n``-terminated: ``v`` (1), ``rid``, ``shard`` (file name),
  ``num_tokens``, ``nbytes`` (hidden-state bytes, token ids excluded), ``layers``,
  ``layer_kinds``, ``dtype``, ``hidden``, ``producer_id``, ``epoch``, ``complete`` (bool),
  ``fields`` (sorted names of the sample's per-token fields; MAY be absent in lines written
  before fields existed: readers then look for ``{rid}/field.*`` tensors in the shard) and
  ``meta`` (the sample's meta, JSON-encoded; non-JSON values stringified; small per-sample
  user metadata such as a dataset row id or split travels in ``meta["extra"]``).
* Each rid MUST appear at most once in the whole index. Lines are appended only after their
  shard has been renamed into place, so every indexed rid is loadable.
* A final line without a terminating newline is a torn write: readers MUST ignore it, and a
  writer truncates it away (and re-appends it from the journal) before appending.

Journals and recovery
---------------------
* ``shard-{n}.journal`` is an append-only JSON-lines file: a first ``{"kind": "shard", ...}``
  line (shard name, header reserve, writer metadata, creation time), then one
  ``{"kind": "sample", ...}`` line per durable sample (the index entry plus its tensors:
  name, dtype, shape and data offsets relative to the data section, and ``end``). A torn last
  line MUST be ignored.
* A sample is durable (and :meth:`ShardWriter.flush` returns its rid) once its bytes are
  fdatasync'd and its journal line is fsync'd.
* A writer that finds a journal (only possible when no writer holds ``.lock``) finalizes the
  shard from it: truncates the ``.tmp`` data after the last journaled sample, writes the header,
  fsyncs and renames it (or finds it already renamed), appends the journaled samples missing
  from the index, fsyncs the index and removes the journal. Samples added but not yet flushed
  when a writer died are lost (the caller never released them, so they are still in the ring or
  will be produced again). A ``.tmp`` without journal holds nothing durable and is removed.
* Writers continue the shard numbering after the highest number found.

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
import re
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from .errors import ShardError
from .sample import Sample

__all__ = [
    "ShardWriter",
    "DuplicateRidError",
    "read_index",
    "load_sample",
    "FORMAT",
    "FORMAT_VERSION",
    "INDEX_NAME",
]

FORMAT = "hscapture.shard"
FORMAT_VERSION = 1
INDEX_NAME = "index.jsonl"
LOCK_NAME = ".lock"
SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".safetensors"
TMP_SUFFIX = ".safetensors.tmp"
JOURNAL_SUFFIX = ".journal"
from .notice import MAX_RID_BYTES  # noqa: E402,F401  (the protocol defines it)
DEFAULT_MAX_SHARD_BYTES = 2 << 30

_SHARD_RE = re.compile(r"^shard-(\d{5,})\.safetensors$")
_ANY_RE = re.compile(r"^shard-(\d{5,})(\.safetensors|\.safetensors\.tmp|\.journal)$")
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

_DTYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
}
for _n, _c in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _n):
        _DTYPES[getattr(torch, _n)] = _c
_ST_TO_TORCH_NAME = {v: str(k).removeprefix("torch.") for k, v in _DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - safetensors is little-endian
    raise ImportError("hscapture.shards writes tensor memory as is and needs a little-endian host")


class SampleRefusedError(ShardError):
    """This one sample cannot be written (bad rid, inconsistent tensors, duplicate); nothing
    of it was written and the writer is still usable. ``rid`` names it."""

    def __init__(self, message: str, rid: Any = None) -> None:
        super().__init__(message)
        self.rid = rid


class DuplicateRidError(SampleRefusedError):
    """The rid is already in this shard directory (written before, or added twice)."""


def _shard_name(n: int) -> str:
    return f"{SHARD_PREFIX}{n:05d}{SHARD_SUFFIX}"


def _jdump(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
class _Entry:
    """One sample inside the open shard."""

    rid: str
    tensors: list  # [name, st_dtype, shape, [begin, end]] (offsets relative to data start)
    end: int
    index: dict
    codecs: dict | None = None   # stored name -> codec record (compressed shards only)

    def journal_line(self) -> str:
        d = {"kind": "sample", **self.index, "tensors": self.tensors, "end": self.end}
        if self.codecs:
            d["codecs"] = self.codecs
        return _jdump(d) + "\n"


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


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
from .codec import SCALE_PREFIX  # noqa: E402  (tensor-name prefix of fp8 scales)
_FIELD_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}$")
FIELD_PREFIX = "field."


def _layout(rid_jlen: int, items: list, start: int) -> tuple[list, int]:
    """Tensor entries (name, dtype, shape, offsets) of one sample placed at ``start`` and the
    exact length their ``"rid/name":{...},`` entries add to the header JSON."""
    tensors, n, off = [], 0, start
    for name, st, shape, v in items:
        offs = [off, off + len(v)]
        off += len(v)
        tensors.append([name, st, shape, offs])
        name_len = len(name) + 1 if _PLAIN_NAME.match(name) else len(_jdump("/" + name).encode()) - 2
        body = (f'{{"dtype":"{st}","shape":[{",".join(map(str, shape))}],'
                f'"data_offsets":[{offs[0]},{offs[1]}]}}')
        n += rid_jlen + name_len + 2 + len(body)
    return tensors, n


def _header_meta(schema: tuple, user_meta: dict[str, str], created: str, producers: dict,
                 num_samples: int | str) -> dict[str, str]:
    from .sample import layer_name

    dtype, hidden, layers, kinds, conv, model = schema
    meta = dict(user_meta)
    # The final norm has no layer id of its own: its entry in ``layers`` is null, and the
    # decoder layer it follows is a key of its own (an id there read like residual layer N-1).
    after = [int(l) for l, k in zip(layers, kinds) if k == "final_norm" and int(l) >= 0]
    meta.update({
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "num_samples": str(num_samples),
        "dtype": dtype,
        "hidden": str(hidden),
        "layers": _jdump([None if k == "final_norm" else int(l) for l, k in zip(layers, kinds)]),
        "layer_kinds": _jdump(list(kinds)),
        "layer_names": _jdump([layer_name(l, k) for l, k in zip(layers, kinds)]),
        "convention": conv,
        "model": model,
        "producers": _jdump({p: sorted(v) for p, v in sorted(producers.items())}),
        "created": created,
        "writer": "hscapture.shards/1",
    })
    if len(after) == 1:
        meta["final_norm_after_layer"] = str(after[0])
        meta["num_layers"] = str(after[0] + 1)
    return meta


def _build_header(schema: tuple, user_meta: dict[str, str], created: str, entries: Iterable,
                  ) -> dict:
    entries = list(entries)
    producers: dict[str, set] = {}
    for e in entries:
        producers.setdefault(str(e.index["producer_id"]), set()).add(int(e.index["epoch"]))
    header: dict[str, Any] = {"__metadata__": _header_meta(schema, user_meta, created, producers,
                                                            len(entries))}
    for e in entries:
        if e.codecs:
            header["__metadata__"][CODEC_KEY_PREFIX + e.rid] = _jdump(e.codecs)
    for e in entries:
        for name, st, shape, offs in e.tensors:
            header[f"{e.rid}/{name}"] = {"dtype": st, "shape": list(shape), "data_offsets": list(offs)}
    return header


def _encode_header(header: dict, reserve: int) -> bytes:
    """8-byte length + JSON padded with spaces to exactly ``reserve`` bytes, or None if too big."""
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    n = reserve - 8
    if len(body) > n:
        return None  # type: ignore[return-value]
    return struct.pack("<Q", n) + body + b" " * (n - len(body))


_META_KEYS = {"format", "format_version", "num_samples", "dtype", "hidden", "layers",
              "layer_kinds", "layer_names", "convention", "model", "producers", "created", "writer",
              "final_norm_after_layer", "num_layers", "codec", "codec_params"}
#: ``__metadata__`` key prefix of a sample's per-tensor codec records (``codec:{rid}``)
CODEC_KEY_PREFIX = "codec:"
_DEFAULTABLE = {"convention", "model"}


_PARALLEL_MIN_PART = 4 << 20   # below this many bytes per thread, one pwritev is faster


class ShardWriter:
    """Append :class:`~hscapture.sample.Sample` objects to safetensors shards in ``out_dir``.

    See the module docstring for the on-disk format and the durability contract.

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
            and fields stay exact. Recorded per shard and per tensor (module docstring);
            every hscapture reader decodes it. ``max_shard_bytes`` counts stored bytes.
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
            if k in _DEFAULTABLE:
                self._defaults[k] = v
            elif k in _META_KEYS or k.startswith(CODEC_KEY_PREFIX):
                raise ValueError(f"metadata key {k!r} is reserved by the shard format "
                                 f"(reserved: {sorted(_META_KEYS - _DEFAULTABLE)} and keys "
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
            "meta": json.loads(_jdump(sample.meta or {})),
        }
        if self.compression is not None:
            index["codec"] = self.compression.name
            index["stored_nbytes"] = int(stored)
        # a compressed sample's per-tensor records: one more __metadata__ entry in the header
        codec_len = (len(_jdump(CODEC_KEY_PREFIX + rid).encode("utf-8"))
                     + len(_jdump(_jdump(codecs)).encode("utf-8")) + 2) if codecs else 0
        sh = self._shard
        rid_jlen = len(_jdump(rid).encode("utf-8"))
        pid, epoch = index["producer_id"], index["epoch"]
        # Roll over: size limit, schema change, or header would not fit.
        if sh is not None and sh.entries:
            tensors, jlen = _layout(rid_jlen, items, sh.data_len)
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
            tensors, jlen = _layout(rid_jlen, items, sh.data_len)
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
        sh.entries.append(_Entry(rid, tensors, end, index, codecs or None))
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
            if t.dtype not in _DTYPES or (isinstance(want_dtype, torch.dtype) and t.dtype != want_dtype):
                raise ShardError(f"rid {s.rid!r}: tensor {name!r} has dtype {t.dtype}, "
                                 f"sample says {s.dtype}")
            items.append((-t.element_size(), i, name, t))
        items.append((-tid.element_size(), len(items), "token_ids", tid))
        for fname, ft in (s.fields or {}).items():
            if not isinstance(fname, str) or not _FIELD_NAME.match(fname):
                raise ShardError(f"rid {s.rid!r}: invalid field name {fname!r} (expected "
                                 f"letters, digits, '_', '-', '.')")
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
                    enc = encode(self.compression, name, t, _DTYPES[t.dtype])
                if enc is None:
                    coded.append((neg, i, name, _DTYPES[t.dtype], [int(d) for d in t.shape], t))
                    continue
                parts, record = enc
                codecs[name] = record
                for k, (sname, st, shape, data) in enumerate(parts):
                    size = data.element_size() if isinstance(data, torch.Tensor) else 1
                    coded.append((-size, i + k / 4, sname, st, shape, data))
        else:
            coded = [(neg, i, name, _DTYPES[t.dtype], [int(d) for d in t.shape], t)
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
        meta = _header_meta(sh.schema, self._meta, sh.created, producers, "9" * 12)
        return len(_jdump({"__metadata__": meta}).encode("utf-8"))

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
        name = _shard_name(n)
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
            lines.append(_jdump({"kind": "shard", "v": FORMAT_VERSION, "shard": sh.name,
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
                _fsync_dir(self.out_dir)
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
            m = _ANY_RE.match(f)
            if m:
                hi = max(hi, int(m.group(1)))
        return hi

    def _recover(self) -> None:
        d = self.out_dir
        _repair_index_tail(d, self.fsync)
        names = sorted(os.listdir(d))
        for f in names:
            if f.endswith(JOURNAL_SUFFIX) and f.startswith(SHARD_PREFIX):
                self._recover_journal(f)
        for f in os.listdir(d):
            if f.endswith(TMP_SUFFIX) and f.startswith(SHARD_PREFIX):
                # no journal → nothing in it was ever reported durable
                os.unlink(os.path.join(d, f))
        if self.fsync:
            _fsync_dir(d)

    def _recover_journal(self, jname: str) -> None:
        d = self.out_dir
        jpath = os.path.join(d, jname)
        header, entries = _read_journal(jpath)
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
            _append_index(d, name, entries, read_index(d), self.fsync)
        elif entries:
            os.rename(jpath, jpath + ".orphaned")
            raise ShardError(f"journal {jpath} lists {len(entries)} sample(s) but neither {tmp} nor "
                             f"{final} exists; moved it to {jpath}.orphaned")
        for p in (tmp, jpath):
            if os.path.exists(p):
                os.unlink(p)
        if self.fsync:
            _fsync_dir(d)


def _read_journal(path: str) -> tuple[dict | None, list[_Entry]]:
    with open(path, "rb") as f:
        raw = f.read()
    header, entries = None, []
    for line in raw.split(b"\n")[:-1]:  # the part after the last newline is torn
        try:
            d = json.loads(line)
        except ValueError:
            break
        if d.get("kind") == "shard":
            header = d
        elif d.get("kind") == "sample":
            tensors, end, codecs = d.pop("tensors"), d.pop("end"), d.pop("codecs", None)
            d.pop("kind")
            entries.append(_Entry(d["rid"], tensors, int(end), d, codecs))
    return header, entries


def _repair_index_tail(d: str, fsync: bool) -> None:
    path = os.path.join(d, INDEX_NAME)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        pos = size
        while pos > 0:
            chunk = min(65536, pos)
            buf = os.pread(fd, chunk, pos - chunk)
            k = buf.rfind(b"\n")
            if k >= 0:
                pos = pos - chunk + k + 1
                break
            pos -= chunk
        if pos != size:
            os.ftruncate(fd, pos)
            if fsync:
                os.fsync(fd)
    finally:
        os.close(fd)


def _append_index(d: str, shard: str, entries: list[_Entry], index: dict, fsync: bool) -> None:
    lines = []
    for e in entries:
        if e.rid in index:
            continue  # already appended before a crash
        entry = dict(e.index)
        entry["shard"] = shard
        lines.append(_jdump(entry) + "\n")
        index[e.rid] = entry
    if not lines:
        return
    path = os.path.join(d, INDEX_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        data = memoryview("".join(lines).encode("utf-8"))
        while len(data):
            n = os.write(fd, data)
            data = data[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _finalize_shard(d: str, name: str, schema: tuple, user_meta: dict, created: str,
                    entries: list[_Entry], reserve: int, data_len: int, index: dict | None,
                    fsync: bool, tmp_path: str | None = None) -> None:
    """tmp → header → fsync → rename → dir fsync → index append → journal removed."""
    tmp = tmp_path or os.path.join(d, name + ".tmp")
    final = os.path.join(d, name)
    header = _encode_header(_build_header(schema, user_meta, created, entries), reserve)
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
        _fsync_dir(d)
    _append_index(d, name, entries, index if index is not None else read_index(d), fsync)
    jpath = os.path.join(d, name[: -len(SHARD_SUFFIX)] + JOURNAL_SUFFIX)
    if os.path.exists(jpath):
        os.unlink(jpath)
        if fsync:
            _fsync_dir(d)


# -- reading ---------------------------------------------------------------------------------


def _read_index_lines(out_dir: str) -> list[dict]:
    path = os.path.join(os.fspath(out_dir), INDEX_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ShardError(f"cannot read {path}: {e.strerror}") from e
    out = []
    for i, line in enumerate(raw.split(b"\n")[:-1], 1):  # torn last line ignored
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if not isinstance(d, dict) or not isinstance(d.get("rid"), str):
                raise ValueError("not an object with a string rid")
        except ValueError as e:
            raise ShardError(f"{path}:{i}: malformed index line: {e}") from None
        out.append(d)
    return out


def read_index(out_dir: str | os.PathLike) -> dict[str, dict]:
    """rid → index entry of a shard directory (first occurrence wins; see :func:`hscapture.shard_check.verify_dir`)."""
    idx: dict[str, dict] = {}
    for d in _read_index_lines(os.fspath(out_dir)):
        idx.setdefault(d["rid"], d)
    return idx


_SET_CACHE: dict[str, tuple[tuple, Any]] = {}
_SET_CACHE_MAX = 8


def _cached_set(out_dir: str):
    """The :class:`~hscapture.reader.ShardSet` of ``out_dir``, reopened only when its index
    file changed (inode, size or mtime), so repeated :func:`load_sample` calls are O(1)."""
    from .reader import ShardSet

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

    Kept for compatibility; prefer :func:`hscapture.reader.open_shards`, which also returns
    the sample's layers, meta and fields. The directory's index is read once and cached (it
    is reread only when ``index.jsonl`` changes), and the sample's tensors are read by name
    from its shard, so each call costs O(1) index work, not a reread of the index and a scan
    of every tensor name.
    """
    d = os.fspath(out_dir)
    ss = _cached_set(d)
    if rid not in ss:
        raise ShardError(f"rid {rid!r} is not in the index of {d}")
    out = ss.load(rid).to_dict()
    del out["rid"]
    return out


def _dir_locked(d: str) -> bool:
    try:
        fd = os.open(os.path.join(d, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _final_norm_after(meta: dict[str, str], layers: list, kinds: list) -> int | None:
    """The decoder layer a shard's final norm follows: its ``final_norm_after_layer`` key, or
    (shards written before that key existed) the id the final norm was recorded with."""
    try:
        return int(meta["final_norm_after_layer"])
    except (KeyError, ValueError):
        pass
    ids = [l for l, k in zip(layers, kinds) if k == "final_norm" and isinstance(l, int) and l >= 0]
    return ids[0] if len(ids) == 1 else None


def shard_num_layers(meta: dict[str, str]) -> int | None:
    """The model's number of decoder layers a shard's ``__metadata__`` records (its
    ``num_layers`` key; for older shards, one more than the final norm's recorded id), or
    None when it does not say (no final norm captured, or its layer unknown)."""
    try:
        return int(meta["num_layers"])
    except (KeyError, ValueError):
        pass
    after = _final_norm_after(meta, _meta_list(meta, "layers"), _meta_list(meta, "layer_kinds"))
    return None if after is None else after + 1


def _meta_list(meta: dict[str, str], key: str) -> list:
    """A JSON list of a shard's ``__metadata__`` (``[]`` when absent or not a list)."""
    try:
        v = json.loads(meta.get(key, "[]"))
        return v if isinstance(v, list) else []
    except ValueError:
        return []


def _codec_records(meta: dict[str, str], rid: str) -> tuple[dict[str, Any], str | None]:
    """A sample's per-tensor codec records from its shard's ``__metadata__`` (``{}`` when it
    is stored uncompressed), and a problem description if they do not parse."""
    raw = meta.get(CODEC_KEY_PREFIX + rid)
    if raw is None:
        return {}, None
    try:
        rec = json.loads(raw)
        if not isinstance(rec, dict) or not all(isinstance(v, dict) for v in rec.values()):
            raise ValueError("not an object of objects")
    except ValueError as e:
        return {}, f"rid {rid!r}: codec record {CODEC_KEY_PREFIX}{rid} is malformed ({e})"
    return rec, None
