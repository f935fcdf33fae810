"""The ended record (hscapture/ring.py): what the removal of a dead producer's segment leaves
for a subscriber that never mapped it: its bytes, its parser's rules, and its life."""

from __future__ import annotations

import os
import time
import uuid

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture import _ring, ring
from hscapture.errors import RecordFormatError

EPOCH = 0x0123456789ABCDEF

#: encode_ended(EPOCH, 7) as version 1 writes it
GOLDEN = bytes.fromhex("83a17601a565706f6368cf0123456789abcdefa574616b656e07")


def test_the_record_keeps_its_bytes():
    assert ring.encode_ended(EPOCH, 7) == GOLDEN
    assert ring.decode_ended(GOLDEN, epoch=EPOCH) == 7


@pytest.mark.parametrize("blob, what", [
    (GOLDEN, "epoch: expected 0x1 (the incarnation's), found 0x123456789abcdef"),
    (msgpack.packb({"v": 2, "epoch": 1, "taken": 7}), "expected version 1, found 2"),
    (msgpack.packb({"v": 1, "epoch": 1}), "expected a map with keys ['epoch', 'taken', 'v']"),
    (msgpack.packb({"v": 1, "epoch": 1, "taken": -1}), "taken: expected an integer"),
    (msgpack.packb({"v": 1, "epoch": 1, "taken": 1.0}), "taken: expected an integer"),
    (msgpack.packb([1, 1, 7]), "expected a map with keys"),
    (b"\xc1", "not msgpack"),
    (b"\x00" * 300, "expected at most 256 bytes, found 300"),
])
def test_a_record_that_is_not_one_for_this_incarnation_is_refused_saying_what(blob, what):
    with pytest.raises(RecordFormatError, match="ended record: ") as e:
        ring.decode_ended(blob, epoch=1)
    assert what in str(e.value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_read_as_a_number_or_a_record_format_error(blob):
    try:
        taken = ring.decode_ended(blob, epoch=EPOCH)
    except RecordFormatError:
        return
    assert 0 <= taken < 1 << 64


def _remove(*names: str | None) -> None:
    """The segments ``names`` and their ended records, whatever the test left."""
    for n in names:
        if n:
            ring.cleanup_stale(n, force=True)
            try:
                os.unlink(ring.ended_path(n))
            except FileNotFoundError:
                pass


def _dead_segment(taken: int) -> str:
    """A segment whose producer ended without removing it, ``taken`` numbers taken."""
    name = f"hscapture-{os.geteuid()}-er{uuid.uuid4().hex[:6]}-01"
    p = _ring.Producer(name, 1 << 20, 2)
    p.store_taken(taken)
    p.close(False)                  # ended, the segment left (as by a SIGKILL)
    return name


def test_removing_a_dead_producers_segment_leaves_its_epoch_and_taken_for_an_hour(monkeypatch):
    name = _dead_segment(42)
    epoch = _ring.segment_info(name)["epoch"]
    try:
        assert ring.read_ended(name, epoch=epoch) is None
        assert [a.action for a in ring.cleanup_stale(name)] == ["removed"]
        assert not os.path.exists(os.path.join(ring.SHM_DIR, name))
        assert ring.read_ended(name, epoch=epoch) == 42
        path = ring.ended_path(name)
        assert oct(os.stat(path).st_mode)[-3:] == "600"
        ring.cleanup_stale(name)        # a later clean-up, within the hour: it stays
        assert ring.read_ended(name, epoch=epoch) == 42
        hour_ago = time.time() - ring.ENDED_KEEP_S - 1
        os.utime(path, (hour_ago, hour_ago))
        ring.cleanup_stale(name)
        assert ring.read_ended(name, epoch=epoch) is None
        # HSCAPTURE_ENDED_KEEP_S overrides the hour
        name2 = _dead_segment(3)
        epoch2 = _ring.segment_info(name2)["epoch"]
        ring.cleanup_stale(name2)
        monkeypatch.setenv("HSCAPTURE_ENDED_KEEP_S", "0.5")
        past = time.time() - 1
        os.utime(ring.ended_path(name2), (past, past))
        ring.cleanup_stale(name2)
        assert ring.read_ended(name2, epoch=epoch2) is None
    finally:
        _remove(name, locals().get("name2"))


def test_a_segment_kept_for_a_durable_place_leaves_a_record_only_once_it_goes():
    name = f"hscapture-{os.geteuid()}-er{uuid.uuid4().hex[:6]}-02"
    p = _ring.Producer(name, 1 << 20, 2)
    c = _ring.Consumer(name, 0, "reader")
    epoch = c.epoch
    try:
        assert p.put(b"x" * 64) >= 0          # a record the durable place has not read
        p.store_taken(5)
        c.close()                              # detached: its place kept
        p.close(False)
        assert [a.action for a in ring.cleanup_stale(name)] == ["kept"]
        assert ring.read_ended(name, epoch=epoch) is None      # the ring is still there
        _ring.Consumer(name, 0, "reader", resume_only=True).unsubscribe()
        assert [a.action for a in ring.cleanup_stale(name)] == ["removed"]
        assert ring.read_ended(name, epoch=epoch) == 5
    finally:
        _remove(name)


def test_an_ended_record_is_not_a_segment_name_and_not_a_path_outside_shm():
    assert not ring.ENDED_PREFIX.startswith(ring.DEFAULT_PREFIX)
    with pytest.raises(ValueError):
        ring.ended_path("../etc")
