"""Subscriber.poll returns about when its timeout says, however large the samples in the ring.

A real producer process publishes multi-chunk samples (3 MB each, 256-token chunks of 1 MB)
as fast as the ring takes them, and this process polls with ``timeout=0.001`` while the ring
holds a backlog. One call used to read 64 chunks (64 MB copied with torch's OpenMP pool, which
stalls when the host's cores are busy) and returned up to seconds late; now each pump reads at
most ``_POLL_BUDGET_BYTES`` per ring, the copies run on this thread, and a call returns after
at most one pump past its deadline.
"""

from __future__ import annotations

import time

import pytest

from hscapture import Subscriber
from hscapture import subscriber as subscriber_mod

from capture_support import assert_sample_exact, read_events, start_producer

HIDDEN, LAYERS, TOKENS, CHUNK, SAMPLES = 1024, [0, 1, 2, 3], 384, 256, 60
CHUNK_BYTES = CHUNK * HIDDEN * len(LAYERS) * 2 + CHUNK * 4       # bf16 layers + int32 ids


def test_poll_with_a_backlog_of_large_chunks_reads_a_bounded_amount_per_call(endpoint, tmp_path):
    spec = {"endpoint": endpoint, "hidden": HIDDEN, "layers": LAYERS, "capacity": 128 << 20,
            "producer_id": "latency", "threads": 2, "policy": "wait",
            "requests": [[f"r{i}", TOKENS, CHUNK] for i in range(SAMPLES)]}
    proc = start_producer(spec, tmp_path)
    try:
        read_events(proc, "ready")
        with Subscriber(endpoint) as sub:
            sub.wait_ready(30)
            # let the producer fill the ring first: the backlog is what one call could read
            deadline = time.monotonic() + 60
            while sub._sources and next(iter(sub._sources.values())).consumer.head < 64 << 20:
                assert time.monotonic() < deadline, "the producer did not fill 64 MB of ring"
                time.sleep(0.01)
            got, calls = {}, []
            deadline = time.monotonic() + 120
            while len(got) < SAMPLES:
                assert time.monotonic() < deadline, f"{len(got)} of {SAMPLES} in 120 s"
                st = sub.stats()
                before, entries = st.get("ring_bytes_read", 0), st.get("entries", 0)
                c0, t0 = time.thread_time(), time.perf_counter()
                s = sub.poll(timeout=0.001)
                st = sub.stats()
                calls.append((time.perf_counter() - t0, time.thread_time() - c0,
                              st.get("ring_bytes_read", 0) - before, st.get("entries", 0) - entries))
                if s is not None:
                    assert s.rid not in got, f"{s.rid} delivered twice"
                    got[s.rid] = s
            for rid, s in got.items():
                assert_sample_exact(s, rid, TOKENS, HIDDEN, LAYERS)
            assert sub.stats()["dropped"] == {} and sub.stats()["incomplete"] == {}
    finally:
        proc.wait(60)
    worst_wall = max(c[0] for c in calls)
    worst_cpu = max(c[1] for c in calls)
    most_bytes = max(c[2] for c in calls)
    most_entries = max(c[3] for c in calls)
    print(f"poll(timeout=0.001) x {len(calls)}: worst wall {worst_wall * 1e3:.1f} ms, worst "
          f"thread CPU {worst_cpu * 1e3:.1f} ms, most ring bytes in one call {most_bytes} "
          f"({most_entries} entries of one {CHUNK}-token chunk each)")
    # at most one budgeted pump after the 1 ms deadline, and pumps before it that fit in 1 ms:
    # a pump reads its budget plus the one entry that crosses it
    bound = 2 * (subscriber_mod._POLL_BUDGET_BYTES + CHUNK_BYTES + 4096)
    assert most_bytes <= bound, f"one poll read {most_bytes} ring bytes, expected <= {bound}"
    assert most_entries <= bound // CHUNK_BYTES, \
        f"one poll read {most_entries} chunks of {CHUNK_BYTES} bytes, expected <= " \
        f"{bound // CHUNK_BYTES}"
    # CPU time, not wall (this host is shared): 16 MB of copies is milliseconds of work
    assert worst_cpu < 0.1, f"one poll(timeout=0.001) took {worst_cpu:.3f} s of CPU"


@pytest.mark.parametrize("timeout", [0.0, 0.01])
def test_poll_of_an_idle_subscriber_returns_within_its_timeout(endpoint, timeout):
    from hscapture import Producer

    with Producer(endpoint, producer_id="idle", capacity=1 << 20) as p, \
            Subscriber(endpoint) as sub:
        sub.wait_ready(10)
        p.wait_for_consumers(1, 10)
        worst = 0.0
        for _ in range(20):
            t0 = time.perf_counter()
            assert sub.poll(timeout=timeout) is None
            worst = max(worst, time.perf_counter() - t0)
        assert worst < timeout + 0.2, f"poll(timeout={timeout}) took {worst:.3f} s"
