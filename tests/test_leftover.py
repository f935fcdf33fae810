"""The leftover file (hscapture/_leftover.py): its bytes, and its parser's rules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hscapture import _leftover
from hscapture import record as rec
from hscapture.errors import RecordFormatError

EPOCH = 0x0123456789ABCDEF


def _drop(seq: int, rids: list[str]) -> bytes:
    rows = [{"rid": r, "token_start": 0, "token_count": 4, "last": True} for r in rids]
    return rec.control_payload(rec.drop_meta("p", EPOCH, seq, 0, "ring_full", rows))


def _abort(seq: int, rid: str) -> bytes:
    return rec.control_payload(rec.abort_meta("p", EPOCH, seq, 0, rid, "cancelled", False,
                                              {}))


#: encode(EPOCH, 7, 1, [drop of seq 3..4, abort at 5]) as version 1 writes it
GOLDEN = bytes.fromhex(
    "85a17601a565706f6368cf0123456789abcdefa86e6578745f73657107aa756e7265636f726465640"
    "1a7656e747269657392")


def test_the_file_keeps_its_bytes():
    blob = _leftover.encode(EPOCH, 7, 1, [_drop(3, ["a", "b"]), _abort(5, "c")])
    # the map's fixed part (keys, integers, the array header) is golden; the entries are
    # ring-entry payloads, whose own bytes tests/test_record.py pins
    assert blob.startswith(GOLDEN)
    assert blob == GOLDEN + b"".join(
        b"\xc5" + len(p).to_bytes(2, "big") + p if len(p) > 255 else
        b"\xc4" + bytes([len(p)]) + p for p in (_drop(3, ["a", "b"]), _abort(5, "c")))


def test_a_file_reads_back_as_the_entries_it_was_written_with():
    left = _leftover.decode(_leftover.encode(EPOCH, 7, 1, [_drop(3, ["a", "b"]),
                                                           _abort(5, "c")]),
                            epoch=EPOCH, producer="p")
    assert (left.epoch, left.next_seq, left.unrecorded) == (EPOCH, 7, 1)
    assert [(e.kind, e.seq, e.n) for e in left.entries] == [("drop", 3, 2), ("abort", 5, 1)]
    assert [r["rid"] for r in left.entries[0].rows] == ["a", "b"]


def _unheard(seq: int, rids: list[str]) -> bytes:
    rows = [{"rid": r, "seq": i, "last": True} for i, r in enumerate(rids)]
    return rec.control_payload(rec.unheard_meta("p", EPOCH, seq, 0, rows, 0))


def test_an_unheard_entry_the_ring_had_no_room_for_reads_back_with_its_next_number():
    # (it takes no number: its seq is the producer's next one when it was made, which may
    # be the file's next_seq itself)
    left = _leftover.decode(_leftover.encode(EPOCH, 7, 0, [_drop(5, ["x", "y"]),
                                                           _unheard(7, ["a", "b"])]),
                            epoch=EPOCH, producer="p")
    assert [(e.kind, e.seq, e.n) for e in left.entries] == [("drop", 5, 2), ("unheard", 7, 0)]
    assert [r["rid"] for r in left.entries[1].rows] == ["a", "b"]


@pytest.mark.parametrize("blob, why", [
    (_leftover.encode(EPOCH, 6, 0, [_unheard(7, ["a"])]), "reach past next_seq 6"),
    (_leftover.encode(EPOCH + 1, 7, 0, []), "epoch: expected"),
    (_leftover.encode(EPOCH, 4, 0, [_drop(3, ["a", "b"])]), "reach past next_seq 4"),
    (b"\x92\x01\x02", "expected a map"),
    (b"\xc1", "not msgpack"),
])
def test_a_file_that_is_not_one_is_refused_saying_what_was_expected(blob, why):
    with pytest.raises(RecordFormatError, match=why):
        _leftover.decode(blob, epoch=EPOCH)


def test_another_producers_entries_are_refused():
    with pytest.raises(RecordFormatError, match="entry 0"):
        _leftover.decode(_leftover.encode(EPOCH, 9, 0, [_drop(3, ["a"])]), epoch=EPOCH,
                         producer="someone-else")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_corruption_is_refused_with_a_typed_error_or_reads_as_a_valid_file(data):
    blob = bytearray(_leftover.encode(EPOCH, 9, 2, [_drop(3, ["a", "b"]), _abort(6, "c")]))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    try:
        left = _leftover.decode(bytes(blob[:cut] if data.draw(st.booleans()) else blob),
                                epoch=EPOCH)
    except RecordFormatError:
        return
    for e in left.entries:     # whatever reads as valid obeys every rule
        assert e.kind in ("drop", "abort") and e.seq + e.n <= left.next_seq


def test_a_written_file_is_found_beside_its_segment_and_goes_with_it(tmp_path, monkeypatch):
    from hscapture import ring

    monkeypatch.setattr(ring, "SHM_DIR", str(tmp_path))
    segment = "hscapture-0-x-00"
    assert _leftover.read(segment, epoch=EPOCH) is None
    path = _leftover.write(segment, EPOCH, 7, 0, [_drop(3, ["a"])])
    assert path.name == "hscapture.left-" + segment and oct(path.stat().st_mode)[-3:] == "600"
    assert [e.seq for e in _leftover.read(segment, epoch=EPOCH).entries] == [3]
    ring.remove_leftover(segment)
    assert _leftover.read(segment, epoch=EPOCH) is None
    with pytest.raises(ValueError):
        ring.leftover_path("../etc")


def test_a_segment_with_a_leftover_file_stays_while_a_durable_place_has_not_read_it():
    # every ring byte read (released == head), but the drops in the leftover file not: the
    # segment and the file stay for that subscriber; once its place is gone, both go
    import os
    import uuid

    from hscapture import _ring, ring

    name = f"hscapture-{os.geteuid()}-lt{uuid.uuid4().hex[:6]}-01"
    p = _ring.Producer(name, 1 << 20, 2)
    c = _ring.Consumer(name, 0, "reader")
    c.close()                                  # detached: its place kept, nothing unread
    p.close(False)                             # the producer ended, its segment stays
    try:
        _leftover.write(name, _ring.segment_info(name)["epoch"], 9, 0, [])
        kept = ring.cleanup_stale(name)
        assert [a.action for a in kept] == ["kept"] and "reader" in kept[0].reason
        assert os.path.exists(ring.leftover_path(name))
        resumed = _ring.Consumer(name, 0, "reader", resume_only=True)
        resumed.unsubscribe()                  # what a subscriber does once it has read it
        assert [a.action for a in ring.cleanup_stale(name)] == ["removed"]
        assert not os.path.exists(ring.leftover_path(name))
    finally:
        ring.cleanup_stale(name, force=True)
        ring.remove_leftover(name)
