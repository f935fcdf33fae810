"""The shard directory format (version 1): its file names, header layout and metadata
keys, defined once for the writer (:mod:`hscapture.shards`), the index and journals
(:mod:`hscapture.shard_index`), the checker (:mod:`hscapture.shard_check`), the reader and the
exports.

Shard directory format (version 1)
==================================

The key words MUST, MUST NOT, SHOULD and MAY are used as in RFC 2119.

Files in a shard directory::

    shard-00000.safetensors      finished shards (plain safetensors files)
    shard-00001.safetensors
    index.jsonl                  one JSON line per sample, append-only
    reports.jsonl                the failures a drain reported (hscapture drain only)
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

reports.jsonl
-------------
* Written by ``hscapture drain`` (:mod:`hscapture._report_log`), absent otherwise; readers
  and exports ignore it. One JSON object per line: ``{"kind", "rid", "reason"}`` for each
  sample the drain's subscriber reported (``kind``: ``dropped``, ``incomplete`` or
  ``rejected``; with ``event``, ``"epoch:seq"`` of the ring record that named it, or null),
  appended and fsync'd before the ring records that name the failure are given back; kind
  ``ended`` is not a failure (never reported): an abort that ended a sample reported failed
  before, by an earlier line (a later row of the rid belongs to another attempt);
  ``{"reported": true, "at"}`` once a drain's final report named every failure above it. A
  drain that finds failures after the last ``reported`` line (its predecessor was killed)
  reports them. A torn last line MUST be ignored.

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
"""

from __future__ import annotations

import json
import re
import struct
import sys
from typing import Any, Iterable

import torch

from .notice import FIELD_NAME
from .sample import layer_name

__all__ = ["FORMAT", "FORMAT_VERSION", "INDEX_NAME", "shard_num_layers"]

FORMAT = "hscapture.shard"
FORMAT_VERSION = 1
INDEX_NAME = "index.jsonl"
#: the drain's record of the failures it read (:mod:`hscapture._report_log`)
REPORTS_NAME = "reports.jsonl"
LOCK_NAME = ".lock"
SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".safetensors"
TMP_SUFFIX = ".safetensors.tmp"
JOURNAL_SUFFIX = ".journal"
#: per-token side fields are stored as ``{rid}/field.{name}``
FIELD_PREFIX = "field."
#: ``__metadata__`` key prefix of a sample's per-tensor codec records (``codec:{rid}``)
CODEC_KEY_PREFIX = "codec:"
#: ``__metadata__`` keys the format itself writes (a user's metadata may not use them)
META_KEYS = {"format", "format_version", "num_samples", "dtype", "hidden", "layers",
             "layer_kinds", "layer_names", "convention", "model", "producers", "created", "writer",
             "final_norm_after_layer", "num_layers", "codec", "codec_params"}
#: of those, the ones a user's metadata gives as defaults for samples that lack them
DEFAULTABLE_KEYS = {"convention", "model"}

SHARD_RE = re.compile(r"^shard-(\d{5,})\.safetensors$")
ANY_FILE_RE = re.compile(r"^shard-(\d{5,})(\.safetensors|\.safetensors\.tmp|\.journal)$")
FIELD_NAME_RE = FIELD_NAME   # the protocol's one rule (hscapture.notice)


#: the file ``hscapture demo`` marks its output directory with (it keeps a user's files
#: there and drains beside them)
DEMO_MARKER = ".hscapture-demo"


def not_a_shard_directory(names: "list[str]") -> list[str]:
    """Given a directory's entries: the ones no shard writer, drain or demo puts there, when
    nothing of theirs is there at all (a directory to refuse to write shards into); ``[]``
    for an empty directory, a shard directory (even with a user's files beside the shards)
    or a demo's output."""
    if DEMO_MARKER in names or any(n in (INDEX_NAME, REPORTS_NAME) or ANY_FILE_RE.match(n)
                                   for n in names):
        return []
    return [n for n in names if not n.startswith(".")]
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")

#: torch dtype -> safetensors dtype name
DTYPE_CODES: dict[torch.dtype, str] = {
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
        DTYPE_CODES[getattr(torch, _n)] = _c
#: safetensors dtype name -> torch dtype name (``bfloat16``, ...)
ST_TO_TORCH_NAME = {v: str(k).removeprefix("torch.") for k, v in DTYPE_CODES.items()}

if sys.byteorder != "little":  # pragma: no cover - safetensors is little-endian
    raise ImportError("hscapture shards hold tensor memory as is and need a little-endian host")


def shard_name(n: int) -> str:
    """The file name of finished shard number ``n``."""
    return f"{SHARD_PREFIX}{n:05d}{SHARD_SUFFIX}"


def jdump(obj: Any) -> str:
    """Compact JSON as every file of a shard directory holds it (non-JSON values stringified)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def layout(rid_jlen: int, items: list, start: int) -> tuple[list, int]:
    """Tensor entries (name, dtype, shape, offsets) of one sample placed at ``start`` and the
    exact length their ``"rid/name":{...},`` entries add to the header JSON."""
    tensors, n, off = [], 0, start
    for name, st, shape, v in items:
        offs = [off, off + len(v)]
        off += len(v)
        tensors.append([name, st, shape, offs])
        name_len = len(name) + 1 if _PLAIN_NAME.match(name) else len(jdump("/" + name).encode()) - 2
        body = (f'{{"dtype":"{st}","shape":[{",".join(map(str, shape))}],'
                f'"data_offsets":[{offs[0]},{offs[1]}]}}')
        n += rid_jlen + name_len + 2 + len(body)
    return tensors, n


def header_meta(schema: tuple, user_meta: dict[str, str], created: str, producers: dict,
                num_samples: int | str) -> dict[str, str]:
    """A shard's ``__metadata__``: the user's keys, then the format's (which win)."""
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
        "layers": jdump([None if k == "final_norm" else int(l) for l, k in zip(layers, kinds)]),
        "layer_kinds": jdump(list(kinds)),
        "layer_names": jdump([layer_name(l, k) for l, k in zip(layers, kinds)]),
        "convention": conv,
        "model": model,
        "producers": jdump({p: sorted(v) for p, v in sorted(producers.items())}),
        "created": created,
        "writer": "hscapture.shards/1",
    })
    if len(after) == 1:
        meta["final_norm_after_layer"] = str(after[0])
        meta["num_layers"] = str(after[0] + 1)
    return meta


def build_header(schema: tuple, user_meta: dict[str, str], created: str,
                 entries: Iterable) -> dict:
    """A shard's whole header: ``__metadata__`` (with each compressed sample's codec records)
    and every tensor entry of ``entries`` (objects with ``rid``, ``index``, ``tensors`` and
    ``codecs``: :class:`hscapture.shard_index.JournalEntry`)."""
    entries = list(entries)
    producers: dict[str, set] = {}
    for e in entries:
        producers.setdefault(str(e.index["producer_id"]), set()).add(int(e.index["epoch"]))
    header: dict[str, Any] = {"__metadata__": header_meta(schema, user_meta, created, producers,
                                                           len(entries))}
    for e in entries:
        if e.codecs:
            header["__metadata__"][CODEC_KEY_PREFIX + e.rid] = jdump(e.codecs)
    for e in entries:
        for name, st, shape, offs in e.tensors:
            header[f"{e.rid}/{name}"] = {"dtype": st, "shape": list(shape), "data_offsets": list(offs)}
    return header


def encode_header(header: dict, reserve: int) -> bytes:
    """8-byte length + JSON padded with spaces to exactly ``reserve`` bytes, or None if too big."""
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    n = reserve - 8
    if len(body) > n:
        return None  # type: ignore[return-value]
    return struct.pack("<Q", n) + body + b" " * (n - len(body))


def final_norm_after(meta: dict[str, str], layers: list, kinds: list) -> int | None:
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
    after = final_norm_after(meta, meta_list(meta, "layers"), meta_list(meta, "layer_kinds"))
    return None if after is None else after + 1


def meta_list(meta: dict[str, str], key: str) -> list:
    """A JSON list of a shard's ``__metadata__`` (``[]`` when absent or not a list)."""
    try:
        v = json.loads(meta.get(key, "[]"))
        return v if isinstance(v, list) else []
    except ValueError:
        return []


def codec_records(meta: dict[str, str], rid: str) -> tuple[dict[str, Any], str | None]:
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
