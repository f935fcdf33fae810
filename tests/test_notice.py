"""The notice schema: golden bytes, validation, and a parser that never crashes on bad input."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture import notice as nt
from hscapture.errors import NoticeError, NoticeVersionError


def record_notice(**over):
    msg = {
        "v": 1, "kind": "record", "producer": "p0", "epoch": 0x1234, "seq": 7, "rid": "req-1",
        "token_start": 0, "token_count": 3, "last": True, "cached_prefix": 0,
        "layers": [2, 5, 31], "layer_kinds": ["residual", "residual", "final_norm"],
        "convention": "hf", "model": "m", "hidden": 8, "dtype": "bfloat16",
        "token_ids": (b"\x01\x00\x00\x00" * 3), "tensor_offsets": [64, 128, 192],
        "dp_rank": 0, "extra": {}, "offset": 4096, "length": 192 + 3 * 8 * 2,
        "record_seq": 11, "segment": "hscapture-x",
    }
    msg.update(over)
    return msg


def test_golden_bytes_of_a_heartbeat_are_stable():
    hb = {"v": 1, "kind": "heartbeat", "producer": "p", "epoch": 1, "next_seq": 2,
          "segment": "s", "head": 3, "committed": 4, "dropped": 0, "dropped_bytes": 0,
          "errors": 0, "recent_drops": [], "time_ns": 5}
    assert nt.encode(hb) == bytes.fromhex(
        "8da17601a46b696e64a9686561727462656174a870726f6475636572a170a565706f636801a86e65"
        "78745f73657102a77365676d656e74a173a46865616403a9636f6d6d697474656404a764726f7070"
        "656400ad64726f707065645f627974657300a66572726f727300ac726563656e745f64726f707390"
        "a774696d655f6e7305")


def test_a_valid_record_notice_round_trips():
    msg = record_notice()
    assert nt.decode(nt.encode(msg)) == msg


def test_another_protocol_version_is_a_version_error():
    with pytest.raises(NoticeVersionError, match="expected 1, found 2"):
        nt.decode(msgpack.packb(record_notice(v=2)))


@pytest.mark.parametrize("field", ["rid", "seq", "epoch", "token_ids", "offset", "layers"])
def test_a_missing_field_is_named_in_the_error(field):
    msg = record_notice()
    del msg[field]
    with pytest.raises(NoticeError, match=repr(field)):
        nt.decode(msgpack.packb(msg))


@pytest.mark.parametrize("field,value", [
    ("seq", "7"), ("last", 1), ("token_count", True), ("rid", 5), ("token_ids", "abc"),
    ("layers", {}), ("extra", []),
])
def test_a_mistyped_field_is_rejected(field, value):
    with pytest.raises(NoticeError, match=field):
        nt.decode(msgpack.packb(record_notice(**{field: value})))


def test_token_ids_must_match_the_token_count():
    with pytest.raises(NoticeError, match="expected 12 bytes"):
        nt.decode(msgpack.packb(record_notice(token_ids=b"\0" * 8)))


def test_length_must_match_offsets_tokens_hidden_and_dtype():
    with pytest.raises(NoticeError, match="'length'"):
        nt.decode(msgpack.packb(record_notice(length=1000)))


def test_negative_counts_and_zero_epoch_are_rejected():
    with pytest.raises(NoticeError, match=">= 0"):
        nt.decode(msgpack.packb(record_notice(token_start=-1)))
    with pytest.raises(NoticeError, match="epoch"):
        nt.decode(msgpack.packb(record_notice(epoch=0)))


def test_unknown_fields_and_kinds_are_rejected():
    with pytest.raises(NoticeError, match="unknown field"):
        nt.decode(msgpack.packb(record_notice(pickle=b"cos\nsystem\n")))
    with pytest.raises(NoticeError, match="kind"):
        nt.decode(msgpack.packb({"v": 1, "kind": "exec"}))


def test_msgpack_extension_types_are_refused():
    frame = msgpack.packb({"v": 1, "kind": "bye", "producer": "p", "epoch": 1,
                           "next_seq": msgpack.ExtType(1, b"x"), "time_ns": 0})
    with pytest.raises(NoticeError, match="extension"):
        nt.decode(frame)


def test_truncated_notices_are_rejected():
    frame = nt.encode(record_notice())
    for cut in (0, 1, len(frame) // 2, len(frame) - 1):
        with pytest.raises(NoticeError):
            nt.decode(frame[:cut])


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_the_parser_never_raises_anything_but_notice_errors_on_random_bytes(frame):
    try:
        nt.decode(frame)
    except NoticeError:
        pass


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                     st.text(max_size=8), st.binary(max_size=8), st.floats(allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(nt.SCHEMA["record"]) + ["x"]),
                       st.one_of(_scalars, st.lists(_scalars, max_size=3)), max_size=24))
def test_the_parser_never_raises_anything_but_notice_errors_on_random_maps(fields):
    msg = record_notice()
    msg.update(fields)
    try:
        nt.decode(msgpack.packb(msg, use_bin_type=True))
    except NoticeError:
        pass


@settings(deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 64), st.integers(1, 8192), st.sampled_from([1, 2, 4]),
       st.integers(1, 6))
def test_payload_layout_is_aligned_and_disjoint(meta_len, tokens, hidden, itemsize, n):
    offsets, length = nt.payload_layout(meta_len, tokens, hidden, itemsize, n)
    size = tokens * hidden * itemsize
    assert offsets[0] >= 4 + meta_len
    assert all(o % 64 == 0 for o in offsets)
    assert all(b - a >= size for a, b in zip(offsets, offsets[1:]))
    assert length == offsets[-1] + size


def test_rid_tag_is_stable_and_distinguishes_rids():
    assert nt.rid_tag("a") == nt.rid_tag("a")
    assert nt.rid_tag("a") != nt.rid_tag("b")
    assert 0 <= nt.rid_tag("x" * 1000) < 2**64
