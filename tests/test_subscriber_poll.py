"""Subscriber.poll reads a burst in bounded steps (and hands out the first sample early);
pump() still reads everything; nothing is lost or delivered twice either way."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import zmq

from hscapture import Producer, Subscriber
from hscapture import notice as nt
from hscapture.producer import Row

ROWS = 300


def _burst(p: Producer, prefix: str) -> torch.Tensor:
    """ROWS one-token requests in ONE ring entry; returns the captured block."""
    block = torch.arange(ROWS * 8, dtype=torch.float32).reshape(ROWS, 8).to(torch.bfloat16)
    rows = [Row(f"{prefix}{i}", i, 1) for i in range(ROWS)]
    assert p.capture_batch(rows, [block], layers=[0], token_ids=torch.arange(ROWS,
                                                                               dtype=torch.int32))
    p.flush()
    return block


def test_poll_hands_out_a_burst_before_reading_all_of_it_and_loses_nothing(endpoint):
    with Producer(endpoint, producer_id="pollb", capacity=8 << 20) as p, \
            Subscriber(endpoint) as sub:
        sub.wait_ready(10)
        p.wait_for_consumers(1, 10)
        block = _burst(p, "a")
        first = sub.poll(timeout=10)
        assert first is not None
        # an entry is read whole (its rows are one dispatch), then handed out one by one
        got = {first.rid: first}
        while len(got) < ROWS:
            s = sub.poll(timeout=10)
            assert s is not None, f"only {len(got)} of {ROWS} delivered"
            assert s.rid not in got, "delivered twice"
            got[s.rid] = s
        for i in range(ROWS):
            assert torch.equal(got[f"a{i}"].tensors["layer_0"][0], block[i])
            assert int(got[f"a{i}"].token_ids[0]) == i
        assert sub.poll(timeout=0.2) is None


def test_poll_reads_many_small_entries_in_steps_and_pump_reads_them_all(endpoint):
    with Producer(endpoint, producer_id="polls", capacity=8 << 20) as p, \
            Subscriber(endpoint) as sub:
        sub.wait_ready(10)
        p.wait_for_consumers(1, 10)
        probe = zmq.Context.instance().socket(zmq.SUB)   # sees the notices as sub does
        probe.setsockopt(zmq.SUBSCRIBE, b"")
        probe.connect(endpoint)
        t = torch.ones(1, 8, dtype=torch.bfloat16)
        try:
            assert probe.poll(10_000), "no heartbeat reached the probe"   # connected
            for i in range(ROWS):
                assert p.capture(f"s{i}", [t], layers=[0], token_ids=[i])
            p.flush()
            seen = 0
            while seen < ROWS:   # every entry's notice is on the wire: a whole-burst read
                assert probe.poll(10_000), f"only {seen} of {ROWS} entry notices arrived"
                seen += nt.decode(probe.recv())["kind"] == "entry"
        finally:
            probe.close(0)
        first = sub.poll(timeout=10)
        assert first is not None
        st = sub.stats()
        assert st["entries"] <= 64, "poll() read the whole burst before handing out one"
        deadline = time.monotonic() + 10
        while sub.stats()["samples"] < ROWS:   # pump() is not budgeted: it reads what is there
            assert time.monotonic() < deadline, sub.stats()
            sub.pump(0.05)
        rids = {first.rid} | {s.rid for s in sub.samples(limit=ROWS - 1, timeout=5)}
        assert rids == {f"s{i}" for i in range(ROWS)}


def test_a_borrowed_sample_view_raises_no_warning(endpoint):
    with Producer(endpoint, producer_id="pollw", capacity=8 << 20) as p, \
            Subscriber(endpoint, zero_copy=True) as sub:
        sub.wait_ready(10)
        p.wait_for_consumers(1, 10)
        _burst(p, "w")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(ROWS):
                s = sub.poll(timeout=10)
                assert s is not None and s.borrowed
                s.release()


def test_zero_copy_samples_of_one_entry_give_the_ring_back_when_the_last_is_released(endpoint):
    """A ring entry's zero-copy samples hold its record together: released in any order, the
    ring is given back only once the last of them is, and their views are emptied each at
    its own release (the ring memory behind the others stays theirs)."""
    import random

    with Producer(endpoint, producer_id="zcrel", capacity=8 << 20) as p, \
            Subscriber(endpoint, zero_copy=True) as sub:
        sub.wait_ready(10)
        p.wait_for_consumers(1, 10)
        block = _burst(p, "z")
        samples = []
        while len(samples) < ROWS:
            s = sub.poll(timeout=10)
            assert s is not None
            samples.append(s)
        src = next(iter(sub._sources.values()))
        held = src.consumer.released
        assert held < src.consumer.position              # the entry's record is held
        random.Random(7).shuffle(samples)
        for s in samples[:-1]:
            want = block[int(s.rid[1:])]
            assert torch.equal(s.tensors["layer_0"][0], want)
            s.release()
            assert s.tensors["layer_0"].numel() == 0      # its own view emptied
            assert src.consumer.released == held, "the ring was given back under a live sample"
        last = samples[-1]
        assert torch.equal(last.tensors["layer_0"][0], block[int(last.rid[1:])])
        last.release()
        assert src.consumer.released == src.consumer.position   # all of it given back
