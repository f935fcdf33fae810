"""``Producer.upstream``: an engine adapter that holds captures back (the SGLang hook's pass
log) hands them over at every point where the producer itself must not leave anything behind:
``flush`` and ``close`` (at once), and its publisher thread once captures stop (``idle``). A
failing hand-over is counted and logged, never raised into the caller."""

from __future__ import annotations

import threading
import uuid

import torch

from hscapture import Producer, Subscriber


def _capture(p: Producer, rid: str) -> None:
    t = torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8)
    assert p.capture(rid, [t], layers=[3], token_ids=torch.arange(4))


def test_flush_close_and_the_idle_publisher_hand_over_what_upstream_holds(endpoint):
    p = Producer(endpoint, producer_id=f"up-{uuid.uuid4().hex[:8]}", capacity=8 << 20,
                 heartbeat_interval_s=0.05)
    sub = Subscriber(endpoint)
    calls: list[tuple[str, bool]] = []
    held = ["held-0"]
    idle_seen = threading.Event()

    def upstream(idle: bool) -> None:
        calls.append((threading.current_thread().name, idle))
        while held:                  # hand over whatever is held, as the hook's drain does
            _capture(p, held.pop())
        if idle:
            idle_seen.set()

    try:
        sub.wait_ready(timeout=20)
        p.upstream = upstream
        p.flush(timeout_s=10)
        assert calls[0] == (threading.current_thread().name, False)
        sub.get("held-0", timeout=10).release()
        # nothing captured since: the publisher thread calls it, idle, from its own thread
        assert idle_seen.wait(10)
        assert any(idle and name != threading.current_thread().name for name, idle in calls)
        held.append("held-1")
        sub.get("held-1", timeout=10).release()       # handed over by the publisher thread
        held.append("held-2")
        n = len(calls)
        p.close(timeout_s=10)                          # close hands over first, not idle
        assert (threading.current_thread().name, False) in calls[n:]
        sub.get("held-2", timeout=10).release()
    finally:
        sub.close()
        p.close()


def test_a_failing_upstream_is_counted_never_raised(endpoint):
    p = Producer(endpoint, producer_id=f"up-{uuid.uuid4().hex[:8]}", capacity=8 << 20)

    def upstream(idle: bool) -> None:
        raise RuntimeError("the adapter broke")

    try:
        p.upstream = upstream
        before = p.stats().get("errors", 0)
        p.flush(timeout_s=10)                          # does not raise
        assert p.stats().get("errors", 0) >= before + 1
    finally:
        p.close(timeout_s=10)
