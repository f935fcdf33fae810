"""What a durable place tells its resumer (hscapture._settlement), on a real ring's real
consumer slot: which rows continuing a sample the resumer never saw start may be skipped as
acknowledged, and that an unsettled partial (one that stopped pinning the ring, or began
without its first row) keeps its rows from being skipped until ``delivered`` covers it. The
multi-process scenario behind it: tests/test_stream_durable.py."""

from __future__ import annotations

from hscapture import _ring
from hscapture._settlement import Settlement


def resumed(ring_name: str) -> tuple[_ring.Consumer, Settlement]:
    c = _ring.Consumer(ring_name, 0, "t", resume_only=True)
    return c, Settlement(c, c.resumed)


def test_a_resumer_skips_continuations_below_delivered_when_nothing_was_unsettled(ring_name):
    p = _ring.Producer(ring_name, 1 << 16, 2)
    try:
        c = _ring.Consumer(ring_name, 0, "t")
        s = Settlement(c, c.resumed)
        assert (s.acknowledged_below, s.continuations_below) == (0, 0)
        a, b = s.queue(5), s.queue(9)
        s.acknowledge(b)                  # out of order: nothing is acknowledged in order yet
        assert c.delivered == 0
        s.acknowledge(a)
        assert c.delivered == 10 and c.unsettled == 0
        c.close()
        c, s = resumed(ring_name)
        assert (s.acknowledged_below, s.continuations_below) == (10, 10)
        c.close()
    finally:
        p.close(True)


def test_an_unsettled_partial_bounds_the_skip_until_delivered_covers_it(ring_name):
    p = _ring.Producer(ring_name, 1 << 16, 2)
    try:
        c = _ring.Consumer(ring_name, 0, "t")
        s = Settlement(c, c.resumed)
        first = s.queue(3)
        s.track("x", 4)                   # x's rows from seq 4 may be missing for a resumer
        assert c.unsettled == 5
        s.acknowledge(first)
        later = s.queue(20)
        s.acknowledge(later)              # delivered 21, but x is still open
        assert c.delivered == 21 and c.unsettled == 5
        c.close()
        c, s2 = resumed(ring_name)
        assert (s2.acknowledged_below, s2.continuations_below) == (21, 4)
        # the resumer inherits the bound until it has read up to the inherited delivered
        s2.read(12)
        assert c.unsettled == 5
        s2.read(21)
        assert c.unsettled == 0
        c.close()
        # the first owner's x finishing: it stops counting only once delivered passes it
        c, s3 = resumed(ring_name)
        s3.read(30)
        s3.track("y", 25)
        s3.finish("y", 31)
        assert c.unsettled == 26          # 31 >= delivered (21): still in force
        s3.acknowledge(s3.queue(31))
        assert c.delivered == 32 and c.unsettled == 0
        c.close()
    finally:
        p.close(True)


def test_an_anonymous_consumer_settles_nothing(ring_name):
    p = _ring.Producer(ring_name, 1 << 16, 2)
    try:
        c = _ring.Consumer(ring_name)
        s = Settlement(c, False)
        assert s.queue(3) is None
        s.track("x", 1)
        assert c.unsettled == 0 and s.continuations_below == 0
        c.close()
    finally:
        p.close(True)
