"""Notices on the ZeroMQ wire, and the rules every part of hscapture shares (protocol v3).

This module implements docs/PROTOCOL.md "Notices" and "rid rules" and nothing else does:

- :func:`encode` / :func:`decode` / :func:`validate`: one ZeroMQ frame = one msgpack map with
  ``v`` = :data:`PROTOCOL_VERSION` and ``kind`` in :data:`KINDS` (``entry``, ``heartbeat``,
  ``hello``, ``bye``). :func:`decode` raises only :class:`NoticeError` (or its subclass
  :class:`NoticeVersionError`) whatever bytes it is given.
- :func:`check_rid` is the one definition of a valid request id; :func:`check_producer_id` of a
  valid producer id; :func:`rid_tag` the 64-bit tag a ring record header carries.
- :func:`entry_notice` builds the notice that announces one ring entry.

The ring entries themselves (payload framing, the meta map, blocks) are ``hscapture.record``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping

import msgpack

from .errors import InvalidProducerIdError, InvalidRidError, NoticeError, NoticeVersionError

try:   # the compiled twin of msgpack's packb for exact builtin types (record.py uses it too)
    from ._meta import Unsupported as _Unsupported
    from ._meta import packb as _native_packb
except ImportError:  # pragma: no cover - an uncompiled checkout: msgpack alone
    _native_packb = None

__all__ = [
    "PROTOCOL_VERSION",
    "KINDS",
    "ENTRY_KINDS",
    "SCHEMA",
    "DTYPES",
    "LAYER_KINDS",
    "MAX_NOTICE_BYTES",
    "MAX_RID_BYTES",
    "MAX_PRODUCER_ID_CHARS",
    "check_rid",
    "check_producer_id",
    "check_segment",
    "rid_tag",
    "encode",
    "decode",
    "validate",
    "entry_notice",
    "entry_frame",
    "unpack_canonical",
]

PROTOCOL_VERSION = 3

#: dtype name → item size in bytes. Names are torch's (``str(torch.bfloat16)[6:]``).
DTYPES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

#: What a captured tensor is. ``residual``: output of decoder layer L (the residual stream,
#: pre-norm; HF ``hidden_states[L+1]``). ``final_norm``: the last layer's output after the
#: model's final norm (HF ``hidden_states[-1]``). ``embedding``: the input embeddings (HF
#: ``hidden_states[0]``).
LAYER_KINDS = ("residual", "final_norm", "embedding")

#: The kinds of ring entry (``entry_kind`` of an ``entry`` notice, ``kind`` of a ring meta).
ENTRY_KINDS = ("batch", "drop", "abort", "unheard")

#: Largest notice frame accepted (an ``entry`` notice carries its entry's meta bytes).
MAX_NOTICE_BYTES = 64 << 20
#: Longest rid, in UTF-8 bytes.
MAX_RID_BYTES = 512
#: Longest producer id, in characters (all ASCII).
MAX_PRODUCER_ID_CHARS = 128

_U64 = 1 << 64

#: kind → {field: exact python type}; every listed field is required, no other is allowed.
#: The order is the order :func:`entry_notice` and the golden-bytes tests use.
SCHEMA: dict[str, dict[str, type]] = {
    "entry": {
        "v": int, "kind": str, "producer": str, "epoch": int, "seq": int, "n": int,
        "entry_kind": str, "segment": str, "offset": int, "length": int, "record_seq": int,
        "meta": bytes,
    },
    "heartbeat": {
        "v": int, "kind": str, "producer": str, "epoch": int, "pid": int, "segment": str,
        "next_seq": int, "head": int, "committed": int, "dropped": int, "unrecorded": int,
        "backlog": int, "recorded_through": int, "heard": bool, "errors": int, "time_ns": int,
    },
    "hello": {
        "v": int, "kind": str, "producer": str, "epoch": int, "pid": int, "segment": str,
        "capacity": int, "time_ns": int,
    },
    "bye": {"v": int, "kind": str, "producer": str, "epoch": int, "next_seq": int, "time_ns": int},
}
KINDS = tuple(SCHEMA)
_KEYS = {kind: frozenset(spec) for kind, spec in SCHEMA.items()}

# C0 controls (U+0000..U+001F). DEL (U+007F) and the C1 range are allowed (PROTOCOL.md).
_RID_FORBIDDEN = re.compile(r"[\x00-\x1f]")
_PRODUCER_ID = re.compile(r"[A-Za-z0-9_.\-]{1,%d}" % MAX_PRODUCER_ID_CHARS)
_SEGMENT = re.compile(r"[A-Za-z0-9_.\-]{1,255}")
#: the name of a per-token field (a batch row's ``fields`` key; ``{rid}/field.{name}`` in a
#: shard): 1..128 characters of [A-Za-z0-9_.-], the first not a "." (docs/PROTOCOL.md). The
#: one rule: the producer refuses, the ring entry's check rejects and the shard format
#: stores by it.
FIELD_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}")
FIELD_NAME_RULE = "1..128 characters of [A-Za-z0-9_.-], not starting with '.'"


def _show(value: str, limit: int = 40) -> str:
    """``repr`` of a possibly huge string, cut to ``limit`` characters."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} chars)"


def check_rid(rid: object) -> str:
    """Return ``rid`` (as an exact ``str``) if it obeys the rid rules, else raise.

    The rules (docs/PROTOCOL.md "rid rules"): a ``str`` of 1..:data:`MAX_RID_BYTES` UTF-8
    bytes, valid Unicode (no lone surrogates), no C0 control character (U+0000..U+001F).
    Raises :class:`InvalidRidError` naming what was expected and what was found.
    """
    if type(rid) is not str:
        if not isinstance(rid, str):
            raise InvalidRidError(f"rid: expected str, found {type(rid).__name__}")
        rid = "".join((rid,))  # an exact str, without calling a subclass's __str__
    if rid.isascii():
        size = len(rid)
    else:
        try:
            size = len(rid.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidRidError(
                f"rid {_show(rid)}: expected valid Unicode, found a lone surrogate at index "
                f"{exc.start}") from None
    if not 0 < size <= MAX_RID_BYTES:
        raise InvalidRidError(
            f"rid {_show(rid)}: expected 1..{MAX_RID_BYTES} UTF-8 bytes, found {size}")
    bad = _RID_FORBIDDEN.search(rid)
    if bad is not None:
        raise InvalidRidError(
            f"rid {_show(rid)}: expected no control characters, found "
            f"U+{ord(bad.group()):04X} at index {bad.start()}")
    return rid


def check_producer_id(pid: object) -> str:
    """Return ``pid`` if it is 1..128 characters of ``[A-Za-z0-9_.-]``, else raise
    :class:`InvalidProducerIdError`."""
    if type(pid) is not str or _PRODUCER_ID.fullmatch(pid) is None:
        found = _show(pid) if isinstance(pid, str) else type(pid).__name__
        raise InvalidProducerIdError(
            f"producer id: expected 1..{MAX_PRODUCER_ID_CHARS} characters of [A-Za-z0-9_.-], "
            f"found {found}")
    return pid


def check_segment(name: object) -> str:
    """Return ``name`` if it is a plausible segment name (1..255 characters of
    ``[A-Za-z0-9_.-]``: no ``/``, so it can never name a path), else raise :class:`NoticeError`."""
    if type(name) is not str or _SEGMENT.fullmatch(name) is None:
        found = _show(name) if isinstance(name, str) else type(name).__name__
        raise NoticeError(f"segment: expected 1..255 characters of [A-Za-z0-9_.-], found {found}")
    return name


def rid_tag(rid: str) -> int:
    """The 64-bit tag stored in a ring record header to bind the record to its rid:
    blake2b with an 8-byte digest of the rid's UTF-8 bytes, read little-endian."""
    return int.from_bytes(hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest(), "little")


def validate(msg: Any) -> dict[str, Any]:
    """Check a decoded notice against docs/PROTOCOL.md "Notices"; return it, or raise.

    Raises :class:`NoticeVersionError` for another protocol version and :class:`NoticeError`
    for anything else wrong (a missing, unknown or mistyped field, an impossible value),
    naming the field, what was expected and what was found. Never raises anything else.
    """
    if type(msg) is not dict:
        raise NoticeError(f"notice must be a msgpack map, found {type(msg).__name__}")
    v = msg.get("v")
    if type(v) is not int or v != PROTOCOL_VERSION:
        found = v if type(v) is int else type(v).__name__
        raise NoticeVersionError(
            f"notice protocol version: expected {PROTOCOL_VERSION}, found {found}")
    kind = msg.get("kind")
    spec = SCHEMA.get(kind) if type(kind) is str else None
    if spec is None:
        found = _show(kind) if isinstance(kind, str) else type(kind).__name__
        raise NoticeError(f"notice kind: expected one of {KINDS}, found {found}")
    if msg.keys() != _KEYS[kind]:
        missing = sorted(_KEYS[kind] - msg.keys())
        if missing:
            raise NoticeError(f"{kind} notice: required field {missing[0]!r} is missing")
        unknown = sorted(map(str, msg.keys() - _KEYS[kind]))
        raise NoticeError(f"{kind} notice: unknown field(s) {unknown}"[:300])
    for name, want in spec.items():
        value = msg[name]
        if type(value) is not want:  # exact: a bool is never accepted for an int
            raise NoticeError(f"{kind} notice field {name!r}: expected {want.__name__}, "
                              f"found {type(value).__name__}")
        if want is int and not 0 <= value < _U64:
            raise NoticeError(
                f"{kind} notice field {name!r}: expected 0..2**64-1, found {value}")
    if msg["epoch"] == 0:
        raise NoticeError(f"{kind} notice field 'epoch': expected 1..2**64-1, found 0")
    check_producer_id(msg["producer"])
    if "segment" in spec:
        check_segment(msg["segment"])
    if kind == "entry":
        _validate_entry(msg)
    elif kind == "heartbeat":
        if msg["recorded_through"] > msg["next_seq"]:
            raise NoticeError(
                f"heartbeat notice: expected recorded_through <= next_seq ({msg['next_seq']}), "
                f"found {msg['recorded_through']}")
    elif kind == "hello" and msg["capacity"] == 0:
        raise NoticeError("hello notice field 'capacity': expected >= 1, found 0")
    return msg


def _validate_entry(msg: dict[str, Any]) -> None:
    ek, n = msg["entry_kind"], msg["n"]
    if ek not in ENTRY_KINDS:
        raise NoticeError(f"entry notice field 'entry_kind': expected one of {ENTRY_KINDS}, "
                          f"found {_show(ek)}")
    if ek in ("batch", "drop") and n == 0:
        raise NoticeError(f"entry notice ({ek}): expected n >= 1, found 0")
    if ek == "abort" and n != 1:
        raise NoticeError(f"entry notice (abort): expected n == 1, found {n}")
    if ek == "unheard" and n != 0:
        raise NoticeError(f"entry notice (unheard): expected n == 0, found {n}")
    if msg["seq"] + n > _U64:
        raise NoticeError(f"entry notice: seq + n = {msg['seq'] + n} exceeds 2**64")
    meta_len = len(msg["meta"])
    if meta_len == 0 or 4 + meta_len > msg["length"]:
        raise NoticeError(
            f"entry notice field 'meta': expected 1..length-4 = {msg['length'] - 4} bytes, "
            f"found {meta_len}")


def entry_notice(producer: str, epoch: int, seq: int, n: int, entry_kind: str, segment: str,
                 offset: int, length: int, record_seq: int, meta_bytes: bytes) -> dict[str, Any]:
    """The ``entry`` notice announcing one committed ring entry (fields in canonical order).

    Nothing is checked here: the producer builds it from values it owns and encodes it with
    ``encode(..., check=False)``; receivers validate it in :func:`decode`.
    """
    return {"v": PROTOCOL_VERSION, "kind": "entry", "producer": producer, "epoch": epoch,
            "seq": seq, "n": n, "entry_kind": entry_kind, "segment": segment,
            "offset": offset, "length": length, "record_seq": record_seq, "meta": meta_bytes}


def entry_frame(producer: str, epoch: int, seq: int, n: int, entry_kind: str, segment: str,
                offset: int, length: int, record_seq: int, meta_bytes: bytes) -> bytes:
    """``encode(entry_notice(...), check=False)``: the same bytes, for the producer's hot path
    (one per entry, on the engine's thread), packed by ``hscapture._meta`` in one call where
    it is built (tests/test_notice.py checks the bytes against msgpack's). Raises
    :class:`NoticeError` as :func:`encode` does."""
    msg = entry_notice(producer, epoch, seq, n, entry_kind, segment, offset, length,
                       record_seq, meta_bytes)
    if _native_packb is None:
        return encode(msg, check=False)
    try:
        frame = _native_packb(msg)
    except _Unsupported:
        return encode(msg, check=False)
    if len(frame) > MAX_NOTICE_BYTES:
        raise NoticeError(f"notice is {len(frame)} bytes, more than {MAX_NOTICE_BYTES}")
    return frame


def encode(msg: Mapping[str, Any], *, check: bool = True) -> bytes:
    """Serialize one notice, validating it first unless ``check=False`` (for notices the
    producer assembled itself from already-checked values, on the hot path).

    Raises :class:`NoticeError` for an invalid notice (with ``check``), for values msgpack
    cannot encode, and for a frame larger than :data:`MAX_NOTICE_BYTES`.
    """
    try:
        if check:
            msg = validate(dict(msg))
        frame = msgpack.packb(msg, use_bin_type=True)
    except NoticeError:
        raise
    except Exception as exc:  # TypeError / OverflowError / ValueError from msgpack or dict()
        raise NoticeError(f"notice cannot be encoded: {type(exc).__name__}: {exc}") from None
    if len(frame) > MAX_NOTICE_BYTES:
        raise NoticeError(f"notice is {len(frame)} bytes, more than {MAX_NOTICE_BYTES}")
    return frame


def decode(frame: bytes | memoryview) -> dict[str, Any]:
    """Parse and validate one notice frame.

    Raises :class:`NoticeError` (or :class:`NoticeVersionError`) for any defect and nothing
    else, whatever ``frame`` holds: not msgpack, trailing bytes, extension types, duplicate
    map keys, a schema violation.
    """
    if type(frame) is bytes:
        blob = frame
    else:
        try:
            view = memoryview(frame)
        except TypeError:
            raise NoticeError(
                f"notice frame: expected bytes, found {type(frame).__name__}") from None
        if view.nbytes > MAX_NOTICE_BYTES:
            raise NoticeError(f"notice is {view.nbytes} bytes, more than {MAX_NOTICE_BYTES}")
        blob = view.tobytes()
    if len(blob) > MAX_NOTICE_BYTES:
        raise NoticeError(f"notice is {len(blob)} bytes, more than {MAX_NOTICE_BYTES}")
    try:
        msg = unpack_canonical(blob)
    except NoticeError as exc:
        raise NoticeError(f"notice: {exc}") from None
    return validate(msg)


def unpack_canonical(blob: bytes) -> Any:
    """Decode ``blob``, which MUST be one canonical msgpack object, or raise :class:`NoticeError`.

    Canonical (docs/PROTOCOL.md "Encoding") means exactly what ``msgpack.packb(obj,
    use_bin_type=True)`` produces for the decoded object: shortest forms, no duplicate map
    keys, no trailing bytes, no extension types, float64 floats. Two decoders therefore can
    never disagree about a frame (a duplicate key, say), and equal content is equal bytes.
    """
    try:
        obj = msgpack.unpackb(blob, raw=False, strict_map_key=True, use_list=True,
                              ext_hook=_no_ext)
    except NoticeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise NoticeError(f"not valid msgpack: {type(exc).__name__}: {exc}"[:300]) from None
    try:
        canonical = _repack(obj) == blob
    except Exception as exc:  # nesting deeper than the packer's limit
        raise NoticeError(f"msgpack nested too deeply: {type(exc).__name__}") from None
    if not canonical:
        raise NoticeError("not canonical msgpack (a duplicate map key, or a value not in its "
                          "shortest encoding)")
    return obj


def _repack(obj: Any) -> bytes:
    """``msgpack.packb(obj, use_bin_type=True)`` of a decoded object: by the native twin
    (``hscapture._meta.packb``, the same bytes for exact builtin types, which is all a decoder
    makes: tests/test_meta_native.py) where it takes the object, in half the time; else by
    msgpack (nesting past the twin's depth, an uncompiled checkout)."""
    if _native_packb is not None:
        try:
            return _native_packb(obj)
        except _Unsupported:
            pass
    return msgpack.packb(obj, use_bin_type=True)


#: the values a meta map carries and a reader gets back equal (docs/PROTOCOL.md "Encoding")
_PLAIN_LEAVES = (str, bytes, bytearray, float, type(None))
#: nesting a writer accepts (the reader's packer allows deeper; no caller needs it)
MAX_PLAIN_DEPTH = 64


def plain_value_problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` (e.g. a row's ``extra``) cannot go into a ring meta and come back equal
    from :func:`unpack_canonical`, or None when it can: msgpack's builtin kinds only (None,
    bool, int in -2**63..2**64-1, float, str, bytes, lists/tuples, maps with ``str`` or
    ``bytes`` keys, as ``strict_map_key`` allows),
    no extension types (``msgpack.ExtType``, ``msgpack.Timestamp``), at most
    :data:`MAX_PLAIN_DEPTH` levels. The writer's side of the rule the reader enforces: a
    value it lets through would make every reader reject the whole entry."""
    if isinstance(value, _PLAIN_LEAVES):
        return None
    if isinstance(value, int):   # bool too
        return None if -(1 << 63) <= value < (1 << 64) else \
            f"int {value} outside msgpack's range -2**63..2**64-1"
    if depth >= MAX_PLAIN_DEPTH:
        return f"nested deeper than {MAX_PLAIN_DEPTH} levels"
    if isinstance(value, (list, tuple)) and not isinstance(value, msgpack.ExtType):
        for item in value:
            why = plain_value_problem(item, depth + 1)
            if why:
                return why
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, bytes)):
                return (f"a map key of type {type(key).__name__} ({key!r:.40}): keys must be "
                        f"str (or bytes)")
            why = plain_value_problem(item, depth + 1)
            if why:
                return why
        return None
    return f"a value of type {type(value).__name__} (msgpack builtin kinds only: no extension types)"


def _no_ext(code: int, data: bytes) -> Any:
    raise NoticeError(f"msgpack extension type {code} is not allowed")
