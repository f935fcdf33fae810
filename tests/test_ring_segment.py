"""Segment creation and attach checks: O_EXCL, 0600, owner, magic, layout version, epoch, ENOSPC."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from hscapture import _ring
from hscapture.errors import (
    ConsumerSlotsExhaustedError,
    EpochMismatchError,
    LayoutMismatchError,
    OutOfSpaceError,
    RingError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentPermissionError,
)
from hscapture.ring import segment_name

OFF = _ring.SEGMENT_HEADER_OFFSETS


def _poke(name: str, offset: int, data: bytes) -> None:
    with open("/dev/shm/" + name, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_layout_constants_are_exported_once_from_the_native_layout():
    assert _ring.RECORD_HEADER_SIZE == 64 and _ring.RECORD_ALIGN == 64 and _ring.CACHE_LINE == 64
    assert _ring.MAGIC == int.from_bytes(b"HSCRING1", "little")
    assert _ring.LAYOUT_VERSION == 3  # 3: durable slots, attached_at, control_reserve
    assert _ring.SLOT_OFFSETS["attached_at"] == _ring.SLOT_OFFSETS["name"] + _ring.SLOT_NAME_LEN
    assert _ring.SLOT_OFFSETS["delivered"] == _ring.SLOT_OFFSETS["attached_at"] + 8
    assert len({_ring.SLOT_FREE, _ring.SLOT_ACTIVE, _ring.SLOT_EXPIRED}) == 3
    assert list(_ring.RECORD_HEADER_OFFSETS) == [
        "state", "magic", "epoch", "seq", "payload_len", "total_len", "position", "tag", "reserved"]
    assert OFF["head"] % (2 * _ring.CACHE_LINE) == 0
    assert _ring.SLOT_SIZE == 2 * _ring.CACHE_LINE
    assert len({_ring.STATE_RESERVED, _ring.STATE_COMMITTED, _ring.STATE_ABORTED, _ring.STATE_PADDING}) == 4


def test_segment_is_created_exclusive_with_mode_0600_despite_umask(ring_name):
    old = os.umask(0o077)
    try:
        p = _ring.Producer(ring_name, 4096)
    finally:
        os.umask(old)
    st = os.stat("/dev/shm/" + ring_name)
    assert st.st_mode & 0o7777 == 0o600 and st.st_uid == os.geteuid()
    assert st.st_size == p.map_size == _ring.map_size(8, 4096)
    assert st.st_blocks * 512 >= p.map_size  # space reserved (fallocate), not sparse
    with pytest.raises(SegmentExistsError):
        _ring.Producer(ring_name, 4096)
    assert p.data_address == p.map_address + _ring.data_offset(8)
    p.close()
    assert not os.path.exists("/dev/shm/" + ring_name)


def test_attach_to_missing_segment_raises_not_found(ring_name):
    with pytest.raises(SegmentNotFoundError):
        _ring.Consumer(ring_name)
    with pytest.raises(SegmentNotFoundError):
        _ring.is_stale(ring_name)


def test_wrong_magic_raises_layout_mismatch(ring_name):
    p = _ring.Producer(ring_name, 4096)
    _poke(ring_name, OFF["magic"], struct.pack("<Q", 0xDEADBEEF))
    with pytest.raises(LayoutMismatchError, match=f"expected magic {_ring.MAGIC:#018x}, found 0x00000000deadbeef"):
        _ring.Consumer(ring_name)
    p.close()


def test_wrong_layout_version_raises_layout_mismatch(ring_name):
    p = _ring.Producer(ring_name, 4096)
    _poke(ring_name, OFF["layout_version"], struct.pack("<I", 99))
    with pytest.raises(LayoutMismatchError, match=f"expected layout version {_ring.LAYOUT_VERSION}, found 99"):
        _ring.Consumer(ring_name)
    p.close()


def test_wrong_epoch_raises_epoch_mismatch(ring_name):
    p = _ring.Producer(ring_name, 4096, epoch=0x1234)
    assert p.epoch == 0x1234
    with pytest.raises(EpochMismatchError, match="expected epoch 0x0000000000001235, found 0x0000000000001234"):
        _ring.Consumer(ring_name, expected_epoch=0x1235)
    c = _ring.Consumer(ring_name, expected_epoch=0x1234)
    assert c.epoch == 0x1234
    c.close()
    p.close()


def test_random_epochs_are_nonzero_and_distinct(ring_name):
    epochs = set()
    for i in range(5):
        p = _ring.Producer(f"{ring_name}-{i}", 4096)
        epochs.add(p.epoch)
        p.close()
    assert len(epochs) == 5 and 0 not in epochs


def test_mode_other_than_0600_raises_permission_error(ring_name):
    p = _ring.Producer(ring_name, 4096)
    os.chmod("/dev/shm/" + ring_name, 0o644)
    with pytest.raises(SegmentPermissionError, match="has mode 0644: expected mode 0600"):
        _ring.Consumer(ring_name)
    with pytest.raises(SegmentPermissionError):
        _ring.segment_info(ring_name)
    p.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_segment_owned_by_another_user_raises_permission_error(ring_name):
    p = _ring.Producer(ring_name, 4096)
    os.chown("/dev/shm/" + ring_name, 12345, -1)
    with pytest.raises(SegmentPermissionError, match=f"owned by uid 12345: expected uid {os.geteuid()}"):
        _ring.Consumer(ring_name)
    p.close()


def test_segment_larger_than_dev_shm_raises_out_of_space_not_sigbus(ring_name):
    st = os.statvfs("/dev/shm")
    total = st.f_blocks * st.f_frsize
    if total == 0:
        pytest.skip("/dev/shm has no size limit")
    capacity = (total + (1 << 30)) // 64 * 64
    with pytest.raises(OutOfSpaceError, match="No space left on device"):
        _ring.Producer(ring_name, capacity)
    assert not os.path.exists("/dev/shm/" + ring_name)  # nothing left behind


def test_bad_arguments_raise_value_error(ring_name):
    with pytest.raises(ValueError):
        _ring.Producer(ring_name, 1000)  # not a multiple of 64
    with pytest.raises(ValueError):
        _ring.Producer(ring_name, 4096, max_consumers=0)
    with pytest.raises(ValueError):
        _ring.Producer("a/b", 4096)
    p = _ring.Producer(ring_name, 4096)
    with pytest.raises(ValueError):
        p.reserve(-1)
    with pytest.raises(ValueError):
        p.commit(64)  # nothing reserved there
    pos = p.reserve(1)
    p.commit(pos)
    with pytest.raises(ValueError, match="expected state RESERVED"):
        p.commit(pos)
    p.close()
    with pytest.raises(RingError, match="closed"):
        p.reserve(1)


def test_consumer_slots_are_bounded_and_reusable(ring_name):
    p = _ring.Producer(ring_name, 4096, max_consumers=2)
    a, b = _ring.Consumer(ring_name), _ring.Consumer(ring_name)
    assert {a.slot, b.slot} == {0, 1}
    with pytest.raises(ConsumerSlotsExhaustedError):
        _ring.Consumer(ring_name)
    a.close()
    c = _ring.Consumer(ring_name)
    assert c.slot == a.slot
    assert p.stats()["live_consumers"] == 2
    b.close()
    c.close()
    p.close()


def test_corrupt_record_header_raises_ring_error(ring_name):
    p = _ring.Producer(ring_name, 4096)
    c = _ring.Consumer(ring_name)
    pos = p.reserve(10)
    p.commit(pos)
    data_off = _ring.data_offset(8)
    _poke(ring_name, data_off + _ring.RECORD_HEADER_OFFSETS["position"], struct.pack("<Q", 4242))
    with pytest.raises(RingError, match="corrupt at position 0"):
        c.poll()
    c.close()
    p.close()


def test_payload_views_keep_the_mapping_alive_after_close(ring_name):
    p = _ring.Producer(ring_name, 4096)
    c = _ring.Consumer(ring_name)
    pos = p.reserve(16)
    w = p.payload(pos)
    w[:] = bytes(range(16))
    p.commit(pos)
    rec = c.poll()
    r = rec.payload
    assert r.readonly and not w.readonly
    arr = np.frombuffer(rec.payload, dtype=np.uint8)
    with pytest.raises(TypeError):
        r[0] = 1
    c.close()
    p.close()
    del rec
    assert bytes(r) == bytes(range(16)) and arr.sum() == sum(range(16))
    w[0] = 7  # still mapped
    assert r[0] == 7


def test_segment_info_reports_header_counters_and_consumers(ring_name):
    p = _ring.Producer(ring_name, 4096, max_consumers=3)
    c = _ring.Consumer(ring_name)
    p.commit(p.reserve(100))
    info = _ring.segment_info(ring_name)
    assert info["epoch"] == p.epoch and info["capacity"] == 4096 and info["head"] == p.head
    assert info["producer_pid"] == os.getpid() and info["producer_alive"] is True
    assert info["committed"] == 1 and info["max_consumers"] == 3
    assert [(s["slot"], s["active"], s["alive"]) for s in info["consumers"]] == [(0, True, True)]
    stats = p.stats()
    assert set(stats) >= {"committed", "reserved", "full_count", "reaped", "min_released", "live_consumers", "head"}
    c.close()
    p.close()


def test_segment_name_is_unique_and_carries_uid_and_producer_id():
    a, b = segment_name("tp0/dp1"), segment_name("tp0/dp1")
    assert a != b and a.startswith(f"hscapture-{os.geteuid()}-tp0_dp1-")
    assert segment_name(3, epoch=0xABC).endswith("-0000000000000abc")
