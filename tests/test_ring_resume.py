"""A consumer restarted under its resume name takes over its dead predecessor's place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from hscapture import _ring
from hscapture.errors import RingError

CHILD = r"""
import sys, time
from hscapture import _ring
c = _ring.Consumer(sys.argv[1], 0, "drain-x")
n = 0
while n < int(sys.argv[2]):
    r = c.poll()
    if r is None:
        time.sleep(0.001); continue
    n += 1
    c.release(r.end)
print("read", n, flush=True)
time.sleep(60)   # hold the slot until killed
"""


@pytest.fixture
def seg():
    name = f"hsctest-resume-{uuid.uuid4().hex[:12]}"
    yield name
    try:
        _ring.unlink(name)
    except RingError:
        pass


def _fill(p, n, size=100):
    out = []
    for i in range(n):
        pos = p.reserve(size, i)
        assert pos >= 0
        p.payload(pos)[:8] = i.to_bytes(8, "little")
        p.commit(pos)
        out.append(pos)
    return out


def test_a_restarted_consumer_resumes_at_its_predecessors_released_position(seg):
    p = _ring.Producer(seg, 1 << 16, 4)
    try:
        _fill(p, 3)   # before the child attaches: not its records
        child = subprocess.Popen([sys.executable, "-c", CHILD, seg, "4"], stdout=subprocess.PIPE,
                                 text=True)
        deadline = time.monotonic() + 20
        while p.stats()["live_consumers"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        _fill(p, 10)  # the child reads and releases the first 4 of these, then dies
        assert child.stdout.readline().split() == ["read", "4"]
        child.send_signal(signal.SIGKILL)
        child.wait()
        c = _ring.Consumer(seg, 0, "drain-x")
        assert c.resumed
        seqs = []
        while (r := c.poll()) is not None:
            seqs.append(int.from_bytes(bytes(r.payload[:8]), "little"))
        assert seqs == list(range(4, 10)), "exactly the records the dead consumer had not released"
        c.close()
    finally:
        p.close(True)


def test_a_live_consumers_place_is_never_taken_over(seg):
    p = _ring.Producer(seg, 1 << 16, 4)
    try:
        a = _ring.Consumer(seg, 0, "same-name")
        b = _ring.Consumer(seg, 0, "same-name")
        assert not a.resumed and not b.resumed and a.slot != b.slot
        a.close()
        b.close()
    finally:
        p.close(True)


def test_a_dead_consumer_is_dropped_once_its_grace_period_is_over(seg):
    p = _ring.Producer(seg, 4096, 4)
    p.dead_consumer_grace_ns = int(0.3e9)
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, seg, "0"], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline().split() == ["read", "0"]
        child.send_signal(signal.SIGKILL)
        child.wait()
        # fill the ring: the dead consumer (which released nothing) blocks it
        while (pos := p.reserve(100, 0)) >= 0:
            p.commit(pos)
        t0 = time.monotonic()
        while (pos := p.reserve(100, 0)) < 0:
            assert time.monotonic() - t0 < 5, "the dead consumer was never dropped"
            time.sleep(0.01)
        p.commit(pos)
        waited = time.monotonic() - t0
        assert 0.25 <= waited < 2.0, waited
        assert p.stats()["reaped"] == 1
    finally:
        p.close(True)


def test_a_resume_name_longer_than_the_slot_field_is_refused(seg):
    p = _ring.Producer(seg, 4096, 2)
    try:
        with pytest.raises(ValueError, match="at most 63 bytes"):
            _ring.Consumer(seg, 0, "x" * 64)
    finally:
        p.close(True)
