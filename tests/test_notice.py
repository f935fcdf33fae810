"""Notices (protocol v3): golden bytes, the rid and producer-id rules, validation, and a
parser that raises nothing but NoticeError whatever it is fed."""

from __future__ import annotations

import re

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture import notice as nt
from hscapture.errors import (
    HSCaptureError,
    InvalidProducerIdError,
    InvalidRidError,
    NoticeError,
    NoticeVersionError,
)

SEGMENT = "hscapture-1000-p0-0000000000001234"


def entry(**over):
    msg = nt.entry_notice("p0", 0x1234, 7, 2, "batch", SEGMENT, 4096, 532, 3, b"\x81\xa1v\x02")
    msg.update(over)
    return msg


def heartbeat(**over):
    msg = {"v": 3, "kind": "heartbeat", "producer": "p0", "epoch": 0x1234, "pid": 4242,
           "segment": "seg", "next_seq": 9, "head": 8192, "committed": 5, "dropped": 3,
           "unrecorded": 1, "backlog": 0, "recorded_through": 8, "heard": True, "errors": 0,
           "time_ns": 1700000000000000000}
    msg.update(over)
    return msg


def hello(**over):
    msg = {"v": 3, "kind": "hello", "producer": "p0", "epoch": 0x1234, "pid": 4242,
           "segment": "seg", "capacity": 1 << 30, "time_ns": 5}
    msg.update(over)
    return msg


def bye(**over):
    msg = {"v": 3, "kind": "bye", "producer": "p0", "epoch": 0x1234, "next_seq": 9, "time_ns": 6}
    msg.update(over)
    return msg


VALID = {"entry": entry, "heartbeat": heartbeat, "hello": hello, "bye": bye}

# --- golden bytes: these pin the wire format; a change here is a protocol change ----------

GOLDEN = {
    "entry": (
        "8ca17603a46b696e64a5656e747279a870726f6475636572a27030a565706f6368cd1234a3736571"
        "07a16e02aa656e7472795f6b696e64a56261746368a77365676d656e74d922687363617074757265"
        "2d313030302d70302d30303030303030303030303031323334a66f6666736574cd1000a66c656e67"
        "7468cd0214aa7265636f72645f73657103a46d657461c40481a17602"),
    "heartbeat": (
        "de0010a17603a46b696e64a9686561727462656174a870726f6475636572a27030a565706f6368cd"
        "1234a3706964cd1092a77365676d656e74a3736567a86e6578745f73657109a468656164cd2000a9"
        "636f6d6d697474656405a764726f7070656403aa756e7265636f7264656401a76261636b6c6f6700"
        "b07265636f726465645f7468726f75676808a56865617264c3a66572726f727300a774696d655f6e"
        "73cf17979cfe362a0000"),
    "hello": (
        "88a17603a46b696e64a568656c6c6fa870726f6475636572a27030a565706f6368cd1234a3706964"
        "cd1092a77365676d656e74a3736567a86361706163697479ce40000000a774696d655f6e7305"),
    "bye": (
        "86a17603a46b696e64a3627965a870726f6475636572a27030a565706f6368cd1234a86e6578745f"
        "73657109a774696d655f6e7306"),
}


@pytest.mark.parametrize("kind", sorted(GOLDEN))
def test_golden_bytes_of_each_notice_kind_are_stable(kind):
    msg = VALID[kind]()
    assert nt.encode(msg) == bytes.fromhex(GOLDEN[kind])
    assert nt.decode(bytes.fromhex(GOLDEN[kind])) == msg


def test_the_producers_entry_frame_is_the_golden_entry_notice():
    assert nt._native_packb is not None, "hscapture._meta is not built: the native path is untested"
    assert nt.entry_frame("p0", 0x1234, 7, 2, "batch", SEGMENT, 4096, 532, 3,
                          b"\x81\xa1v\x02") == bytes.fromhex(GOLDEN["entry"])


_U64S = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(producer=st.text(min_size=1, max_size=40), epoch=_U64S, seq=_U64S, n=_U64S,
       kind=st.sampled_from(nt.ENTRY_KINDS), segment=st.text(max_size=80), offset=_U64S,
       length=_U64S, record_seq=_U64S, meta=st.binary(max_size=70_000))
def test_entry_frame_writes_the_bytes_of_encode_for_any_values(producer, epoch, seq, n, kind,
                                                               segment, offset, length,
                                                               record_seq, meta):
    """The hot-path encoder (hscapture._meta where built) and msgpack agree byte for byte,
    over every msgpack width of the ints, strs and the meta's bin."""
    msg = nt.entry_notice(producer, epoch, seq, n, kind, segment, offset, length, record_seq,
                          meta)
    try:
        want = nt.encode(msg, check=False)
    except NoticeError:          # e.g. a lone surrogate msgpack cannot encode
        with pytest.raises(NoticeError):
            nt.entry_frame(producer, epoch, seq, n, kind, segment, offset, length,
                           record_seq, meta)
        return
    assert nt.entry_frame(producer, epoch, seq, n, kind, segment, offset, length, record_seq,
                          meta) == want == msgpack.packb(msg, use_bin_type=True)


def test_entry_notice_builds_fields_in_schema_order():
    assert list(entry()) == list(nt.SCHEMA["entry"])


def test_rid_tag_is_blake2b_8_little_endian_and_stable():
    assert nt.rid_tag("req-1") == 0x0B874A57DE544704
    assert nt.rid_tag("a") != nt.rid_tag("b")
    assert 0 <= nt.rid_tag("x" * 512) < 2**64


# --- rid and producer-id rules ----------------------------------------------------------------


@pytest.mark.parametrize("rid", ["a", "req-1", "x" * 512, "é" * 256, "日本" * 85, "a\x7fb",
                                 "a b", "\u0085", "🙂" * 128])
def test_check_rid_accepts_valid_rids(rid):
    assert nt.check_rid(rid) == rid


@pytest.mark.parametrize("rid,why", [
    ("", "1..512 UTF-8 bytes, found 0"),
    ("x" * 513, "found 513"),
    ("é" * 257, "found 514"),
    ("🙂" * 128 + "a", "found 513"),
    ("a\x00b", "U+0000 at index 1"),
    ("a\nb", "U+000A"),
    ("\x1f", "U+001F"),
    ("a\ud800", "lone surrogate at index 1"),
    (5, "expected str, found int"),
    (b"req", "expected str, found bytes"),
    (None, "found NoneType"),
])
def test_check_rid_rejects_invalid_rids_saying_why(rid, why):
    with pytest.raises(InvalidRidError, match=re.escape(why)):
        nt.check_rid(rid)


def test_check_rid_returns_an_exact_str_for_a_str_subclass_without_calling_its_str():
    class Sneaky(str):
        def __str__(self):
            return "\x00"

    out = nt.check_rid(Sneaky("req"))
    assert type(out) is str and out == "req"


def test_invalid_rid_error_is_a_notice_error():
    assert issubclass(InvalidRidError, NoticeError)
    assert issubclass(InvalidProducerIdError, NoticeError)


@pytest.mark.parametrize("pid", ["p", "sglang-tp0", "a.b_c-D9", "x" * 128])
def test_check_producer_id_accepts_valid_ids(pid):
    assert nt.check_producer_id(pid) == pid


@pytest.mark.parametrize("pid", ["", "x" * 129, "a b", "a/b", "é", "a\n", 7, None])
def test_check_producer_id_rejects_invalid_ids(pid):
    with pytest.raises(InvalidProducerIdError, match=r"\[A-Za-z0-9_.-\]"):
        nt.check_producer_id(pid)


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(VALID))
def test_a_valid_notice_of_each_kind_round_trips(kind):
    msg = VALID[kind]()
    assert nt.decode(nt.encode(msg)) == msg


def test_decode_accepts_memoryview_and_bytearray_frames():
    frame = nt.encode(bye())
    assert nt.decode(memoryview(frame)) == nt.decode(bytearray(frame)) == bye()


def test_another_protocol_version_is_a_version_error():
    with pytest.raises(NoticeVersionError, match="expected 3, found 2"):
        nt.decode(msgpack.packb(bye(v=2)))   # v2 unheard rows lack 'last'
    with pytest.raises(NoticeVersionError, match="expected 3, found 1"):
        nt.decode(msgpack.packb(bye(v=1)))
    with pytest.raises(NoticeVersionError, match="found str"):
        nt.decode(msgpack.packb(bye(v="2")))


@pytest.mark.parametrize("kind,field", [(k, f) for k in sorted(nt.SCHEMA)
                                        for f in nt.SCHEMA[k] if f not in ("v", "kind")])
def test_every_missing_field_is_named_in_the_error(kind, field):
    msg = VALID[kind]()
    del msg[field]
    with pytest.raises(NoticeError, match=f"required field {field!r} is missing"):
        nt.decode(msgpack.packb(msg))


@pytest.mark.parametrize("field,value", [
    ("seq", "7"), ("seq", True), ("n", 2.0), ("offset", None), ("meta", "text"),
    ("segment", b"seg"), ("producer", 1), ("epoch", [1]), ("entry_kind", {}),
])
def test_a_mistyped_field_is_rejected_naming_it(field, value):
    with pytest.raises(NoticeError, match=field):
        nt.decode(msgpack.packb(entry(**{field: value}), use_bin_type=True))


@pytest.mark.parametrize("field,value,why", [
    ("seq", -1, "0..2\\*\\*64-1"),
    ("epoch", 0, "'epoch': expected 1..2\\*\\*64-1, found 0"),
    ("entry_kind", "record", "entry_kind"),
    ("n", 0, "expected n >= 1"),
    ("meta", b"", "'meta': expected 1..length-4"),
    ("length", 7, "'meta': expected 1..length-4 = 3 bytes, found 4"),
    ("producer", "p 0", "producer id"),
    ("segment", "../../etc/passwd", "segment"),
    ("segment", "", "segment"),
    ("seq", 2**64 - 1, "seq \\+ n"),
])
def test_impossible_entry_values_are_rejected(field, value, why):
    with pytest.raises(NoticeError, match=why):
        nt.decode(msgpack.packb(entry(**{field: value}), use_bin_type=True))


@pytest.mark.parametrize("kind,n,ok", [("abort", 1, True), ("abort", 2, False),
                                       ("unheard", 0, True), ("unheard", 1, False),
                                       ("drop", 5, True), ("drop", 0, False)])
def test_entry_n_must_match_the_entry_kind(kind, n, ok):
    frame = msgpack.packb(entry(entry_kind=kind, n=n))
    if ok:
        assert nt.decode(frame)["n"] == n
    else:
        with pytest.raises(NoticeError, match=f"entry notice \\({kind}\\)"):
            nt.decode(frame)


def test_heartbeat_recorded_through_cannot_pass_next_seq():
    assert nt.decode(nt.encode(heartbeat(recorded_through=9)))["recorded_through"] == 9
    with pytest.raises(NoticeError, match="recorded_through <= next_seq"):
        nt.decode(msgpack.packb(heartbeat(recorded_through=10)))


def test_hello_capacity_must_be_positive():
    with pytest.raises(NoticeError, match="capacity"):
        nt.decode(msgpack.packb(hello(capacity=0)))


def test_unknown_fields_and_kinds_are_rejected():
    with pytest.raises(NoticeError, match="unknown field"):
        nt.decode(msgpack.packb(bye(pickle=b"cos\nsystem\n"), use_bin_type=True))
    for kind in ("record", "drop", "exec", 3):
        with pytest.raises(NoticeError, match="kind"):
            nt.decode(msgpack.packb({"v": 3, "kind": kind}))


def test_msgpack_extension_types_are_refused():
    frame = msgpack.packb(bye(next_seq=msgpack.ExtType(1, b"x")))
    with pytest.raises(NoticeError, match="extension"):
        nt.decode(frame)


def test_a_duplicate_key_is_refused_so_no_two_decoders_can_disagree():
    good = msgpack.packb(bye())
    # same map with "next_seq" repeated: header count + 1, pair appended
    dup = bytes([good[0] + 1]) + good[1:] + msgpack.packb("next_seq") + msgpack.packb(10**6)
    with pytest.raises(NoticeError, match="not canonical"):
        nt.decode(dup)


def test_a_non_shortest_encoding_is_refused():
    good = msgpack.packb(bye())
    # next_seq 9 as uint64 (0xcf) instead of a positive fixint
    bad = good.replace(b"\xa8next_seq\x09", b"\xa8next_seq\xcf" + (9).to_bytes(8, "big"))
    assert bad != good and msgpack.unpackb(bad) == bye()
    with pytest.raises(NoticeError, match="not canonical"):
        nt.decode(bad)


def test_trailing_bytes_and_truncation_are_rejected():
    frame = nt.encode(entry())
    with pytest.raises(NoticeError, match="ExtraData"):
        nt.decode(frame + b"\x00")
    for cut in (0, 1, len(frame) // 2, len(frame) - 1):
        with pytest.raises(NoticeError):
            nt.decode(frame[:cut])


def test_an_oversized_frame_is_rejected_before_parsing():
    with pytest.raises(NoticeError, match="more than"):
        nt.decode(b"\x00" * (nt.MAX_NOTICE_BYTES + 1))


def test_decode_of_a_non_buffer_is_a_notice_error_not_a_type_error():
    for thing in (5, None, "text"):
        with pytest.raises(NoticeError, match="expected bytes"):
            nt.decode(thing)


def test_encode_validates_unless_told_not_to_and_never_leaks_msgpack_errors():
    with pytest.raises(NoticeError, match="seq"):
        nt.encode(entry(seq=-1))
    assert nt.encode(entry(seq=-1), check=False)  # the producer's trusted path
    with pytest.raises(NoticeError, match="cannot be encoded"):
        nt.encode(entry(seq=2**70), check=False)
    with pytest.raises(NoticeError, match="cannot be encoded"):
        nt.encode(entry(meta=object()), check=False)
    with pytest.raises(NoticeError):
        nt.encode(5)


# --- never anything but NoticeError -------------------------------------------------------


def _only_notice_errors(frame: bytes) -> None:
    try:
        nt.decode(frame)
    except NoticeError:
        pass
    except HSCaptureError as exc:  # pragma: no cover - would be a hierarchy bug
        raise AssertionError(f"{type(exc).__name__} is not a NoticeError") from exc


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_decode_raises_only_notice_errors_on_random_bytes(frame):
    _only_notice_errors(frame)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                     st.text(max_size=8), st.binary(max_size=8), st.floats(allow_nan=False))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(VALID)),
       st.dictionaries(st.sampled_from(sorted({f for s in nt.SCHEMA.values() for f in s}) + ["x"]),
                       _values, max_size=6),
       st.sets(st.sampled_from(sorted({f for s in nt.SCHEMA.values() for f in s})), max_size=3))
def test_decode_raises_only_notice_errors_on_mutated_valid_notices(kind, replace, delete):
    msg = VALID[kind]()
    msg.update(replace)
    for name in delete:
        msg.pop(name, None)
    frame = msgpack.packb(msg, use_bin_type=True)
    _only_notice_errors(frame)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(GOLDEN)), st.lists(st.tuples(st.integers(0, 10**6),
                                                           st.integers(0, 7)), min_size=1,
                                                 max_size=6))
def test_decode_raises_only_notice_errors_on_bit_flipped_golden_frames(kind, flips):
    frame = bytearray.fromhex(GOLDEN[kind])
    for pos, bit in flips:
        frame[pos % len(frame)] ^= 1 << bit
    _only_notice_errors(bytes(frame))


_ANY_KEY = st.one_of(st.text(max_size=4), st.integers(-3, 3), st.binary(max_size=2))
_ANY_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 65), 1 << 65), st.floats(),
              st.text(max_size=6), st.binary(max_size=6),
              st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=3)),
              st.builds(msgpack.Timestamp, st.integers(0, 1 << 33), st.integers(0, 10 ** 9 - 1))),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(_ANY_KEY, inner, max_size=4)),
    max_leaves=12)


def _has_timestamp(value) -> bool:
    if isinstance(value, msgpack.Timestamp):
        return True
    if isinstance(value, dict):
        return any(_has_timestamp(v) for v in value.values())
    if isinstance(value, (list, tuple)) and not isinstance(value, msgpack.ExtType):
        return any(_has_timestamp(v) for v in value)
    return False


@settings(max_examples=400, deadline=None)
@given(_ANY_VALUE)
def test_a_value_the_writer_rule_accepts_is_exactly_one_every_reader_decodes(value):
    """``plain_value_problem`` (the writer's side, enforced on a row's ``extra`` at capture)
    accepts a value iff it packs and ``unpack_canonical`` (the reader's rule) decodes it
    back. One exception, on the reader's side: msgpack decodes its own Timestamp extension
    without the hook that refuses extension types, so a reader lets one through; the writer
    refuses it."""
    why = nt.plain_value_problem(value)
    try:
        nt.unpack_canonical(msgpack.packb(value, use_bin_type=True))
        readable = True
    except (NoticeError, OverflowError, TypeError, ValueError):
        readable = False
    if _has_timestamp(value):
        assert why is not None
    else:
        assert (why is None) == readable, (value, why)
