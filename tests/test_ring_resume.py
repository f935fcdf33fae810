"""Durable (named) subscriptions across real consumer processes: detach, SIGKILL, resume.

A child process attaches under a resume name, reads and releases some records, then detaches
(clean close) or is SIGKILLed. The producer keeps writing until the ring is full; the
subscription's place must hold, and a resumed consumer must get every record from its
released position on, exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from hscapture import _ring
from hscapture.errors import ConsumerSlotsExhaustedError, SubscriptionInUseError

# argv: segment, resume_name, records to read, records to release (<= read), "close" | "hold"
CHILD = r"""
import sys
from hscapture import _ring
seg, name, n_read, n_release, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
c = _ring.Consumer(seg, 0, name)
print("attached", c.slot, c.attached_at, c.position, flush=True)
sys.stdin.readline()                      # the parent has written the records
ends = []
while len(ends) < n_read:
    r = c.poll()
    if r is not None:
        ends.append(r.end)
if n_release:
    c.release(ends[n_release - 1])
print("released", c.released, flush=True)
if how == "close":
    c.close()                             # durable: detach, keep the place
    print("closed", flush=True)
else:
    sys.stdin.readline()                  # hold the slot until SIGKILLed
"""


def start_child(seg: str, name: str, n_read: int, n_release: int, how: str) -> tuple[subprocess.Popen, list[str]]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, seg, name, str(n_read), str(n_release), how],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    words = child.stdout.readline().split()
    assert words[0] == "attached", words
    return child, words[1:]


def finish_child(child: subprocess.Popen, how: str) -> int:
    """Lets the child read, returns its released position once it detached or was killed."""
    child.stdin.write("go\n")
    child.stdin.flush()
    words = child.stdout.readline().split()
    assert words[0] == "released", words
    if how == "close":
        assert child.stdout.readline().split() == ["closed"]
        assert child.wait(20) == 0
    else:
        child.send_signal(signal.SIGKILL)
        assert child.wait(20) == -signal.SIGKILL
    return int(words[1])


def write(p: _ring.Producer, value: int, size: int = 100) -> int:
    """One committed record whose payload starts with `value`; -1 if the ring is full."""
    pos = p.reserve(size, value)
    if pos >= 0:
        p.payload(pos)[:8] = value.to_bytes(8, "little")
        p.commit(pos)
    return pos


def read_values(c: _ring.Consumer) -> list[int]:
    out = []
    while (r := c.poll()) is not None:
        out.append(int.from_bytes(bytes(r.payload[:8]), "little"))
        c.release(r.end)
    return out


def slot_of(seg: str, slot: int) -> dict:
    return next(s for s in _ring.segment_info(seg)["consumers"] if s["slot"] == slot)


@pytest.mark.parametrize("how", ["close", "sigkill"])
def test_a_durable_subscription_keeps_its_place_until_full_and_resumes_with_every_record_after_released(
        ring_name, how):
    p = _ring.Producer(ring_name, 1 << 14, 4)
    try:
        for v in range(1000, 1003):  # before the child attaches: never its records
            write(p, v)
        child, (slot, attached_at, position) = start_child(ring_name, "drain-a", 5, 4, how)
        assert int(attached_at) == int(position) == p.head
        for v in range(10):
            assert write(p, v) >= 0
        released = finish_child(child, how)  # read 5, released 4: record 4 was read, not released
        info = slot_of(ring_name, int(slot))
        assert (info["state"], info["durable"], info["name"], info["alive"], info["released"]) == (
            "active", True, "drain-a", False, released)
        stats = p.stats()
        assert stats["live_consumers"] == 0 and stats["detached_durable"] == 1
        assert p.reap() == 0, "a durable slot is never reaped"
        v = 10
        while write(p, v) >= 0:  # the producer keeps writing until the subscription's place stops it
            v += 1
        assert p.head - released > p.capacity - _ring.record_total_len(100)
        assert all(write(p, 0) < 0 for _ in range(200)), "a detached durable slot must keep bounding"
        assert p.stats()["reaped"] == 0
        c = _ring.Consumer(ring_name, 0, "drain-a", resume_only=True)
        assert c.resumed and not c.expired and c.slot == int(slot)
        assert c.position == c.released == released and c.attached_at == int(attached_at)
        assert read_values(c) == list(range(4, v)), "every record from the released position, once"
        assert write(p, v) >= 0  # released: the producer moves again
        assert read_values(c) == [v]
        c.close()
    finally:
        p.close(True)


@pytest.mark.parametrize("how", ["close", "sigkill"])
def test_a_dead_or_detached_named_slot_is_taken_neither_by_an_anonymous_nor_a_differently_named_consumer(
        ring_name, how):
    p = _ring.Producer(ring_name, 1 << 14, max_consumers=3)
    try:
        child, (slot_a, _, _) = start_child(ring_name, "a", 2, 2, how)
        for v in range(5):
            write(p, v)
        released = finish_child(child, how)
        anon = _ring.Consumer(ring_name)
        b = _ring.Consumer(ring_name, 0, "b")
        assert int(slot_a) not in (anon.slot, b.slot) and anon.slot != b.slot
        assert not anon.durable and b.durable and not b.resumed
        with pytest.raises(ConsumerSlotsExhaustedError, match=r"1 by live anonymous consumers, 2 by durable subscriptions, live or detached"):
            _ring.Consumer(ring_name)
        with pytest.raises(ConsumerSlotsExhaustedError):
            _ring.Consumer(ring_name, 0, "c")
        while write(p, 99) >= 0:  # reservations blocked by the dead/detached "a": still never reaped
            assert read_values(anon) and read_values(b)
        assert p.reap() == 0 and p.stats()["reaped"] == 0
        assert slot_of(ring_name, int(slot_a))["name"] == "a"
        a = _ring.Consumer(ring_name, 0, "a")
        assert a.resumed and a.slot == int(slot_a) and a.position == released
        values = read_values(a)
        assert values[:3] == [2, 3, 4] and set(values[3:]) == {99}
        for c in (a, anon, b):
            c.close()
    finally:
        p.close(True)


def test_a_second_live_consumer_under_the_same_name_is_refused(ring_name):
    p = _ring.Producer(ring_name, 1 << 16, 4)
    try:
        a = _ring.Consumer(ring_name, 0, "same-name")
        with pytest.raises(SubscriptionInUseError, match=r"'same-name' \(slot 0\) is held by a live consumer"):
            _ring.Consumer(ring_name, 0, "same-name")
        assert [s["slot"] for s in _ring.segment_info(ring_name)["consumers"]] == [0]
        a.close()
        b = _ring.Consumer(ring_name, 0, "same-name")  # detached now: b takes it over
        assert b.resumed and b.slot == 0
        b.unsubscribe()
    finally:
        p.close(True)


def test_a_resume_name_longer_than_the_slot_field_is_refused(ring_name):
    p = _ring.Producer(ring_name, 4096, 2)
    try:
        with pytest.raises(ValueError, match="at most 63 bytes"):
            _ring.Consumer(ring_name, 0, "x" * 64)
        with pytest.raises(ValueError, match="resume_only=True needs a resume_name"):
            _ring.Consumer(ring_name, 0, "", resume_only=True)
    finally:
        p.close(True)


def test_the_deprecated_grace_attribute_is_accepted_and_has_no_effect(ring_name):
    p = _ring.Producer(ring_name, 4096, 2)
    try:
        p.dead_consumer_grace_ns = 123
        assert p.dead_consumer_grace_ns == 123
        child, _ = start_child(ring_name, "", 0, 0, "sigkill")  # an anonymous consumer
        finish_child(child, "sigkill")
        # three laps of the ring: the dead anonymous slot (released nothing) is reaped by the
        # first reservation that needs its space, with no grace period
        for _ in range(3 * 4096 // _ring.record_total_len(100)):
            assert write(p, 0) >= 0
        assert p.stats()["reaped"] == 1
    finally:
        p.close(True)
