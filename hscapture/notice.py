"""The notice protocol: the one place that defines what travels over ZeroMQ.

Wire format (protocol version 1)
--------------------------------
Every ZeroMQ message is one frame holding one msgpack map (no pickle, no extension types;
msgpack ``bin`` for raw bytes, ``str`` for text). Field rules:

- ``v`` (int) MUST be :data:`PROTOCOL_VERSION`; any other value is a :class:`NoticeVersionError`.
- ``kind`` (str) MUST be one of :data:`KINDS`.
- ``producer`` (str) names the producer; ``epoch`` (int, 1..2**64-1) names its incarnation.
- Each kind has its own required fields (:data:`SCHEMA`); a missing field, a field of the wrong
  type, a negative count or an unknown extra top-level field is a :class:`NoticeError`.
  Engine-specific data MAY travel in ``extra`` (a map of str → msgpack scalars/lists/maps).

Kinds
-----
``record``   one captured chunk of one request, committed in the ring at ``offset``.
``drop``     a chunk that was NOT captured (ring full, record too large, copy error).
``abort``    a request whose sample can never complete (aborted, retracted attempt, error).
``heartbeat`` liveness, producer position and counters; ``next_seq`` reveals a lost tail.
``hello`` / ``bye``  a producer incarnation starts / stops cleanly.

``seq`` numbers ``record``, ``drop`` and ``abort`` notices of one epoch consecutively from 0,
so a subscriber detects every lost or duplicated notice.

Inside the ring, each record's payload starts with the same map minus the fields that depend
on the record's own placement (:data:`PLACEMENT_FIELDS`): see :func:`embedded_meta`.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping

import msgpack

from .errors import NoticeError, NoticeVersionError

__all__ = [
    "PROTOCOL_VERSION",
    "KINDS",
    "SCHEMA",
    "PLACEMENT_FIELDS",
    "DTYPES",
    "LAYER_KINDS",
    "encode",
    "decode",
    "validate",
    "embedded_meta",
    "rid_tag",
    "payload_layout",
]

PROTOCOL_VERSION = 1

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

_INT = (int,)
_COMMON = {"v": _INT, "kind": (str,), "producer": (str,), "epoch": _INT}

#: kind → {field: accepted python types}; every listed field is required.
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "record": {
        **_COMMON,
        "seq": _INT,
        "rid": (str,),
        "token_start": _INT,
        "token_count": _INT,
        "last": (bool,),
        "cached_prefix": _INT,
        "layers": (list,),
        "layer_kinds": (list,),
        "convention": (str,),
        "model": (str,),
        "hidden": _INT,
        "dtype": (str,),
        "token_ids": (bytes,),
        "tensor_offsets": (list,),
        "dp_rank": _INT,
        "extra": (dict,),
        # placement (not in the embedded copy)
        "offset": _INT,
        "length": _INT,
        "record_seq": _INT,
        "segment": (str,),
    },
    "drop": {
        **_COMMON,
        "seq": _INT,
        "rid": (str,),
        "token_start": _INT,
        "token_count": _INT,
        "last": (bool,),
        "reason": (str,),
        "dp_rank": _INT,
        "extra": (dict,),
    },
    "abort": {
        **_COMMON,
        "seq": _INT,
        "rid": (str,),
        "reason": (str,),
        "dp_rank": _INT,
        "extra": (dict,),
    },
    "heartbeat": {
        **_COMMON,
        "next_seq": _INT,
        "segment": (str,),
        "head": _INT,
        "committed": _INT,
        "dropped": _INT,
        "dropped_bytes": _INT,
        "errors": _INT,
        "recent_drops": (list,),
        "time_ns": _INT,
    },
    "hello": {**_COMMON, "segment": (str,), "capacity": _INT, "pid": _INT, "time_ns": _INT},
    "bye": {**_COMMON, "next_seq": _INT, "time_ns": _INT},
}
KINDS = tuple(SCHEMA)

#: Fields of a ``record`` notice that describe where the record sits in the ring; the copy
#: embedded in the record itself omits them (the ring header carries them).
PLACEMENT_FIELDS = ("offset", "length", "record_seq", "segment")

_NONNEGATIVE = (
    "seq", "token_start", "token_count", "cached_prefix", "hidden", "offset", "length",
    "record_seq", "next_seq", "head", "committed", "dropped", "dropped_bytes", "errors",
    "capacity", "pid", "time_ns", "dp_rank",
)
MAX_NOTICE_BYTES = 64 << 20


def rid_tag(rid: str) -> int:
    """The 64-bit tag stored in a ring record header to bind the record to its rid."""
    return int.from_bytes(hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest(), "little")


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


def payload_layout(meta_len: int, token_count: int, hidden: int, itemsize: int,
                   num_tensors: int) -> tuple[list[int], int]:
    """Byte offsets of each tensor inside a record payload, and the payload's total length.

    Payload = u32 meta_len | meta | pad to 64 | tensor 0 | pad to 64 | tensor 1 | ...
    """
    tensor_bytes = token_count * hidden * itemsize
    start = _align(4 + meta_len)
    stride = _align(tensor_bytes)
    offsets = [start + i * stride for i in range(num_tensors)]
    length = (offsets[-1] + tensor_bytes) if num_tensors else start
    return offsets, length


def validate(msg: Any) -> dict[str, Any]:
    """Check a decoded notice against the schema; return it, or raise a typed error.

    Raises :class:`NoticeVersionError` for another protocol version and :class:`NoticeError`
    for anything else wrong, naming the field, what was expected and what was found.
    """
    if not isinstance(msg, dict):
        raise NoticeError(f"notice must be a msgpack map, found {type(msg).__name__}")
    v = msg.get("v")
    if v != PROTOCOL_VERSION:
        raise NoticeVersionError(
            f"notice protocol version: expected {PROTOCOL_VERSION}, found {v!r}")
    kind = msg.get("kind")
    spec = SCHEMA.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise NoticeError(f"notice kind: expected one of {KINDS}, found {kind!r}")
    for name, types in spec.items():
        if name not in msg:
            raise NoticeError(f"{kind} notice: required field {name!r} is missing")
        value = msg[name]
        # bool is an int subclass; never accept it where an int is required
        if not isinstance(value, types) or (types == _INT and isinstance(value, bool)):
            want = "/".join(t.__name__ for t in types)
            raise NoticeError(
                f"{kind} notice field {name!r}: expected {want}, found {type(value).__name__}")
    unknown = set(msg) - set(spec)
    if unknown:
        raise NoticeError(f"{kind} notice: unknown field(s) {sorted(unknown)}")
    for name in _NONNEGATIVE:
        if name in msg and msg[name] < 0:
            raise NoticeError(f"{kind} notice field {name!r}: expected >= 0, found {msg[name]}")
    if not 0 < msg["epoch"] < 2**64:
        raise NoticeError(f"{kind} notice field 'epoch': expected 1..2**64-1, found {msg['epoch']}")
    if kind == "record":
        _validate_record(msg)
    return msg


def _validate_record(msg: dict[str, Any]) -> None:
    n_layers = len(msg["layers"])
    if n_layers == 0:
        raise NoticeError("record notice: 'layers' is empty")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in msg["layers"]):
        raise NoticeError("record notice: 'layers' must hold ints")
    if len(msg["layer_kinds"]) != n_layers or not all(
            isinstance(k, str) for k in msg["layer_kinds"]):
        raise NoticeError(
            f"record notice: 'layer_kinds' must hold {n_layers} strings, "
            f"found {msg['layer_kinds']!r}")
    if msg["dtype"] not in DTYPES:
        raise NoticeError(f"record notice 'dtype': expected one of {sorted(DTYPES)}, "
                          f"found {msg['dtype']!r}")
    if msg["token_count"] == 0:
        raise NoticeError("record notice: 'token_count' is 0 (empty chunks are never published)")
    if len(msg["token_ids"]) != 4 * msg["token_count"]:
        raise NoticeError(
            f"record notice 'token_ids': expected {4 * msg['token_count']} bytes "
            f"(int32 x token_count), found {len(msg['token_ids'])}")
    if msg["cached_prefix"] > msg["token_start"] + msg["token_count"]:
        raise NoticeError("record notice: 'cached_prefix' exceeds the tokens seen so far")
    if "length" in msg:
        expect = msg["token_count"] * msg["hidden"] * DTYPES[msg["dtype"]]
        offs = msg["tensor_offsets"]
        if len(offs) != n_layers or not all(isinstance(o, int) for o in offs):
            raise NoticeError(f"record notice 'tensor_offsets': expected {n_layers} ints, "
                              f"found {offs!r}")
        if offs and offs[-1] + expect != msg["length"]:
            raise NoticeError(
                f"record notice 'length': expected {offs[-1] + expect} from the offsets, "
                f"token count, hidden size and dtype, found {msg['length']}")


def encode(msg: Mapping[str, Any], *, check: bool = True) -> bytes:
    """Serialize one notice, validating it first unless ``check=False`` (for notices the
    producer assembled itself from already-checked values, on the hot path)."""
    return msgpack.packb(validate(dict(msg)) if check else msg, use_bin_type=True)


def decode(frame: bytes | memoryview) -> dict[str, Any]:
    """Parse and validate one notice; raise :class:`NoticeError` on any defect."""
    if len(frame) > MAX_NOTICE_BYTES:
        raise NoticeError(f"notice is {len(frame)} bytes, more than {MAX_NOTICE_BYTES}")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True,
                              max_bin_len=MAX_NOTICE_BYTES, max_str_len=1 << 20,
                              ext_hook=_no_ext)
    except NoticeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise NoticeError(f"notice is not valid msgpack: {type(exc).__name__}: {exc}") from exc
    return validate(msg)


def _no_ext(code: int, data: bytes) -> Any:
    raise NoticeError(f"msgpack extension type {code} is not allowed in notices")


def embedded_meta(notice: Mapping[str, Any]) -> dict[str, Any]:
    """The copy of a record notice that is stored inside the ring record itself."""
    return {k: v for k, v in notice.items() if k not in PLACEMENT_FIELDS}


def encode_embedded(meta: Mapping[str, Any]) -> bytes:
    """Serialize an embedded meta map (a record notice minus placement fields)."""
    return msgpack.packb(dict(meta), use_bin_type=True)


def decode_embedded(frame: bytes | memoryview, placement: Mapping[str, Any], *,
                    check: bool = True) -> dict[str, Any]:
    """Parse the meta embedded in a ring record, completed by the record's own placement.

    With ``check=False`` only the msgpack framing is checked: the caller MUST then compare the
    result field by field with a validated notice (or validate it) before trusting it.
    """
    try:
        meta = msgpack.unpackb(frame, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except NoticeError:
        raise
    except Exception as exc:
        raise NoticeError(f"embedded record meta is not valid msgpack: {exc}") from exc
    if not isinstance(meta, dict):
        raise NoticeError(f"embedded record meta must be a map, found {type(meta).__name__}")
    meta.update(placement)
    return validate(meta) if check else meta


def differing_fields(a: Mapping[str, Any], b: Mapping[str, Any],
                     fields: Iterable[str]) -> list[str]:
    """Names of ``fields`` on which two notices disagree (used to report mismatches)."""
    return [f for f in fields if a.get(f) != b.get(f)]
