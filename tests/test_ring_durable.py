"""Durable slots in one process: unsubscribe, resume_only, expiry, attached_at, segment_info,
the read-only data mapping, and the segment helpers that must respect durable subscriptions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hscapture import _ring
from hscapture.errors import RingError, SubscriptionNotFoundError
from hscapture.ring import cleanup_stale, durable_segments


def write(p: _ring.Producer, value: int, size: int = 100) -> int:
    pos = p.reserve(size, value)
    if pos >= 0:
        p.payload(pos)[:8] = value.to_bytes(8, "little")
        p.commit(pos)
    return pos


def read_values(c: _ring.Consumer, release: bool = True) -> list[int]:
    out = []
    while (r := c.poll()) is not None:
        out.append(int.from_bytes(bytes(r.payload[:8]), "little"))
        if release:
            c.release(r.end)
    return out


def slots(seg: str) -> dict[int, dict]:
    return {s["slot"]: s for s in _ring.segment_info(seg)["consumers"]}


# --- unsubscribe / resume_only ------------------------------------------------------------------

def test_resume_only_raises_subscription_not_found_and_creates_no_slot(ring_name):
    p = _ring.Producer(ring_name, 4096, 2)
    try:
        with pytest.raises(SubscriptionNotFoundError, match="no subscription under resume name 'x'"):
            _ring.Consumer(ring_name, 0, "x", resume_only=True)
        assert _ring.segment_info(ring_name)["consumers"] == [], "no slot may have been touched"
        assert p.stats()["live_consumers"] == 0
        other = _ring.Consumer(ring_name, 0, "y")
        other.close()  # detached "y" does not satisfy a resume_only for "x"
        with pytest.raises(SubscriptionNotFoundError):
            _ring.Consumer(ring_name, 0, "x", resume_only=True)
        assert list(slots(ring_name)) == [0]
    finally:
        p.close(True)


def test_unsubscribe_frees_the_slot_for_good(ring_name):
    p = _ring.Producer(ring_name, 4096, max_consumers=1)
    try:
        c = _ring.Consumer(ring_name, 0, "x")
        c.close()  # detach: the only slot stays taken
        assert slots(ring_name)[0]["state"] == "active" and p.stats()["detached_durable"] == 1
        c = _ring.Consumer(ring_name, 0, "x", resume_only=True)
        assert c.resumed
        c.unsubscribe()
        assert c.closed
        with pytest.raises(RingError, match="closed"):
            c.poll()
        with pytest.raises(RingError, match="closed"):
            c.unsubscribe()
        s = slots(ring_name)[0]
        assert (s["state"], s["durable"], s["name"], s["alive"]) == ("free", False, "", False)
        assert p.stats()["detached_durable"] == 0
        with pytest.raises(SubscriptionNotFoundError):
            _ring.Consumer(ring_name, 0, "x", resume_only=True)
        anon = _ring.Consumer(ring_name)  # the freed slot is anyone's now
        assert anon.slot == 0 and not anon.resumed
        anon.close()
        assert slots(ring_name)[0]["state"] == "free", "an anonymous close frees the slot"
    finally:
        p.close(True)


# --- delivered: what was acknowledged past released ------------------------------------------

def test_delivered_and_unsettled_survive_a_crash_and_a_resume_and_a_fresh_subscription_starts_at_zero(
        ring_name, tmp_path):
    p = _ring.Producer(ring_name, 1 << 16, 4)
    try:
        # a durable owner in another process stores delivered, then dies without closing
        code = ("import os, signal, sys; from hscapture import _ring; "
                f"c = _ring.Consumer({ring_name!r}, 0, 'd'); assert c.delivered == 0; "
                "c.store_delivered(7); c.store_delivered(5); assert c.delivered == 7; "
                "assert c.unsettled == 0; c.store_unsettled(11); c.store_unsettled(4); "
                "os.kill(os.getpid(), signal.SIGKILL)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert r.returncode == -signal.SIGKILL, r.stderr
        c = _ring.Consumer(ring_name, 0, "d", resume_only=True)
        assert c.resumed and c.delivered == 7          # monotonic: the 5 changed nothing
        assert c.unsettled == 4                        # not monotonic: the last store
        c.store_delivered(9)
        c.close()
        c = _ring.Consumer(ring_name, 0, "d", resume_only=True)
        assert c.delivered == 9                        # a clean detach keeps it too
        c.unsubscribe()
        fresh = _ring.Consumer(ring_name, 0, "d")      # the name again, a new subscription
        assert not fresh.resumed and fresh.delivered == 0 and fresh.unsettled == 0
        fresh.close()
        anon = _ring.Consumer(ring_name)
        anon.store_delivered(3)                        # anonymous: nobody resumes it
        anon.store_unsettled(3)
        assert anon.delivered == 0 and anon.unsettled == 0
        anon.close()
    finally:
        p.close(True)


# --- expiry --------------------------------------------------------------------------------------

def test_an_expired_subscription_resumes_at_the_head_and_reports_exactly_the_range_it_lost(ring_name):
    p = _ring.Producer(ring_name, 4096, 2)
    p.durable_expiry_ns = int(0.3e9)
    try:
        for v in range(3):
            write(p, v)
        c = _ring.Consumer(ring_name, 0, "e")
        attached_at = c.attached_at
        assert attached_at == p.head
        for v in range(3, 6):
            write(p, v)
        assert read_values(c, release=False) == [3, 4, 5]
        rec_end = attached_at + 2 * _ring.record_total_len(100)
        c.release(rec_end)  # released two of the three it read
        c.close()
        t0 = time.monotonic()
        v = 6
        while True:  # the detached slot blocks, then expires and stops bounding the producer
            if write(p, v) >= 0:
                v += 1
                if p.stats()["expired"]:
                    break
                continue
            assert time.monotonic() - t0 < 10, "the detached subscription never expired"
            time.sleep(0.005)
        assert time.monotonic() - t0 >= 0.3
        s = slots(ring_name)[c.slot]
        assert (s["state"], s["name"], s["released"], s["attached_at"], s["durable"]) == (
            "expired", "e", rec_end, attached_at, True)
        stats = p.stats()
        assert stats["expired_slots"] == 1 and stats["detached_durable"] == 0
        for _ in range(40):  # laps over the old place freely now
            assert write(p, v) >= 0
            v += 1
        head = p.head
        r = _ring.Consumer(ring_name, 0, "e", resume_only=True)
        assert r.resumed and r.expired and r.slot == c.slot
        assert (r.lost_from, r.lost_to, r.position, r.attached_at) == (rec_end, head, head, attached_at)
        assert write(p, 12345) >= 0
        assert read_values(r) == [12345]
        assert slots(ring_name)[r.slot]["state"] == "active" and p.stats()["expired_slots"] == 0
        r.close()
    finally:
        p.close(True)


def test_a_live_durable_consumer_is_never_expired(ring_name):
    p = _ring.Producer(ring_name, 4096, 2)
    p.durable_expiry_ns = int(0.05e9)
    try:
        c = _ring.Consumer(ring_name, 0, "slow")
        while write(p, 0) >= 0:
            pass
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:  # six expiry periods of blocking by a live consumer
            assert write(p, 0) < 0
        assert p.stats()["expired"] == 0 and not c.expired
        assert (c.lost_from, c.lost_to) == (c.position, c.position), "nothing lost: an empty range"
        read_values(c)
        assert write(p, 0) >= 0
        c.close()
    finally:
        p.close(True)


# --- attached_at, segment_info -------------------------------------------------------------------

def test_attached_at_is_the_start_position_and_survives_detach_and_resume(ring_name):
    p = _ring.Producer(ring_name, 1 << 16, 3, control_reserve=512)
    try:
        for v in range(3):
            write(p, v)
        h = p.head
        d = _ring.Consumer(ring_name, 0, "drain")
        a = _ring.Consumer(ring_name)
        assert d.attached_at == d.position == h == a.attached_at
        for v in range(3, 6):
            write(p, v)
        info = _ring.segment_info(ring_name)
        assert info["control_reserve"] == 512 and info["layout_version"] == 3
        got = {s["slot"]: (s["state"], s["durable"], s["name"], s["alive"], s["attached_at"], s["pid"])
               for s in info["consumers"]}
        assert got == {d.slot: ("active", True, "drain", True, h, os.getpid()),
                       a.slot: ("active", False, "", True, h, os.getpid())}
        assert read_values(d)[:1] == [3]
        d.close()
        assert slots(ring_name)[d.slot]["alive"] is False
        write(p, 6)
        r = _ring.Consumer(ring_name, 0, "drain")
        assert r.resumed and r.attached_at == h and r.position == d.released != h
        assert read_values(r) == [6]
        r.close()
        a.close()
    finally:
        p.close(True)


# --- read-only data mapping ----------------------------------------------------------------------

WRITER = r"""
import ctypes, sys
from hscapture import _ring
c = _ring.Consumer(sys.argv[1])
addr = c.data_address
before = ctypes.string_at(addr, 8)       # the data region is mapped and readable
print("read", before.hex(), flush=True)
ctypes.memmove(addr, b"XXXXXXXX", 8)     # must fault: the consumer's data mapping is PROT_READ
print("wrote", flush=True)
"""


def test_a_consumers_data_mapping_is_read_only_a_raw_write_segfaults(ring_name):
    p = _ring.Producer(ring_name, 4096, 2)
    try:
        pos = write(p, 0x1122334455667788)
        header = bytes(p.payload(pos)[:8])
        proc = subprocess.run([sys.executable, "-c", WRITER, ring_name], capture_output=True, text=True,
                              timeout=60)
        assert proc.stdout.split("\n")[0].startswith("read "), proc.stdout + proc.stderr
        assert "wrote" not in proc.stdout
        assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-2000:])
        assert bytes(p.payload(pos))[:8] == header  # nothing was written
        c = _ring.Consumer(ring_name)
        write(p, 1)
        rec = c.poll()
        assert rec.payload.readonly
        with pytest.raises(TypeError):
            rec.payload[0] = 1
        c.close()
    finally:
        p.close(True)


# --- cleanup_stale / durable_segments -------------------------------------------------------------

def _stale_segment(name: str, durable: str | None, read_all: bool) -> None:
    """A segment whose producer exited without unlinking, holding one consumer that detached
    (durable) or closed (anonymous) after reading all or none of the three records."""
    p = _ring.Producer(name, 4096, 2)
    c = _ring.Consumer(name, 0, durable or "")
    for v in range(3):
        write(p, v)
    if read_all:
        read_values(c)
    c.close()
    p.close(False)  # drops the producer lock, keeps the name: stale


def test_cleanup_keeps_a_stale_segment_with_unread_durable_data_unless_forced(ring_name):
    prefix = ring_name + "-"
    unread, drained, anon, live_name = (prefix + s for s in ("a-unread", "b-drained", "c-anon", "d-live"))
    _stale_segment(unread, "drain-x", read_all=False)
    _stale_segment(drained, "drain-x", read_all=True)
    _stale_segment(anon, None, read_all=False)
    live = _ring.Producer(live_name, 4096)
    try:
        actions = cleanup_stale(prefix)
        assert [(a.name, a.action) for a in actions] == [
            (unread, "kept"), (drained, "removed"), (anon, "removed")]
        assert "durable subscription 'drain-x' (slot 0) has 576 unread bytes (released" in actions[0].reason
        assert "force=True" in actions[0].reason
        assert os.path.exists("/dev/shm/" + unread) and os.path.exists("/dev/shm/" + live_name)
        assert not os.path.exists("/dev/shm/" + drained) and not os.path.exists("/dev/shm/" + anon)
        # the kept segment can still be resumed and drained
        c = _ring.Consumer(unread, 0, "drain-x", resume_only=True)
        assert read_values(c) == [0, 1, 2]
        c.close()
        assert [a.action for a in cleanup_stale(prefix)] == ["removed"]  # fully read now
        _stale_segment(unread, "drain-x", read_all=False)
        forced = cleanup_stale(prefix, force=True)
        assert [(a.name, a.action) for a in forced] == [(unread, "removed")]
        assert "forced despite: durable subscription 'drain-x'" in forced[0].reason
        assert not os.path.exists("/dev/shm/" + unread)
    finally:
        live.close()
        for n in (unread, drained, anon):
            if os.path.exists("/dev/shm/" + n):
                os.unlink("/dev/shm/" + n)


def test_durable_segments_lists_segments_holding_the_name_in_any_state_and_creates_nothing(ring_name):
    prefix = ring_name + "-"
    names = [prefix + s for s in ("detached", "expired", "live", "other", "unsubscribed")]
    producers = [_ring.Producer(n, 4096, 2) for n in names]
    try:
        _ring.Consumer(names[0], 0, "sub").close()
        c = _ring.Consumer(names[1], 0, "sub")
        c.close()
        producers[1].durable_expiry_ns = 1
        t0 = time.monotonic()
        while not producers[1].stats()["expired"]:  # block reservations until it expires
            write(producers[1], 0)
            assert time.monotonic() - t0 < 10
        live = _ring.Consumer(names[2], 0, "sub")
        _ring.Consumer(names[3], 0, "other-name").close()
        _ring.Consumer(names[4], 0, "sub").unsubscribe()
        before = [_ring.segment_info(n)["consumers"] for n in names]
        assert durable_segments("sub", prefix=prefix) == names[:3]
        assert durable_segments("nobody", prefix=prefix) == []
        assert [_ring.segment_info(n)["consumers"] for n in names] == before, "read-only"
        with pytest.raises(ValueError):
            durable_segments("", prefix=prefix)
        live.close()
    finally:
        for p in producers:
            p.close(True)
