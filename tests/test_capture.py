"""The capture path end to end: real producer processes, real ring, real ZeroMQ, real shards."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import torch
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_support import (  # noqa: E402
    assert_sample_exact,
    read_events,
    source,
    start_producer,
)

import hscapture  # noqa: E402
from hscapture import Producer, Subscriber  # noqa: E402
from hscapture import notice as nt  # noqa: E402
from hscapture.errors import (  # noqa: E402
    CaptureConfigError,
    IncompleteSampleError,
    SampleDroppedError,
    SampleMismatchError,
    SampleTimeoutError,
)
from hscapture.shard_check import verify_dir  # noqa: E402
from hscapture.shards import read_index  # noqa: E402

HIDDEN = 64
LAYERS = [3, 7, 11]


def spec(endpoint, requests, **over):
    out = {"endpoint": endpoint, "hidden": HIDDEN, "layers": LAYERS, "requests": requests,
           "threads": 1}
    out.update(over)
    return out


def test_interleaved_requests_from_several_threads_arrive_exact_and_nothing_else(
        endpoint, tmp_path):
    rng = random.Random(1)
    requests = [[f"req-{i}", rng.choice([1, 2, 17, 300, 1500]), rng.choice([7, 64, 4096])]
                for i in range(60)]
    proc = start_producer(spec(endpoint, requests, threads=4, shuffle_chunks=True,
                               jitter_s=0.002, unrequested=True), tmp_path)
    try:
        read_events(proc, "ready")
        with Subscriber(endpoint) as sub:
            sub.wait_ready(timeout=20)
            got = {}
            for sample in sub.samples(limit=len(requests), timeout=60):
                assert sample.rid not in got, "duplicate sample"
                assert_sample_exact(sample, sample.rid, dict((r, t) for r, t, _ in requests)[
                    sample.rid], HIDDEN, LAYERS)
                got[sample.rid] = sample.num_tokens
            assert read_events(proc, "dropped")["rids"] == []
            read_events(proc, "done")
            sub.pump(0.3)
            assert sorted(got) == sorted(r for r, _, _ in requests)
            stats = sub.stats()
            # the warm-up pass and the unrequested row produced nothing at all
            assert stats["ready"] == 0 and stats["assembling"] == 0
            assert not stats["dropped"] and not stats["incomplete"] and not stats["rejected"]
    finally:
        proc.wait(timeout=30)


def test_capture_rejects_inconsistent_arguments(endpoint):
    with Producer(endpoint, producer_id="args", capacity=1 << 20) as p:
        t = torch.zeros(4, 8)
        with pytest.raises(CaptureConfigError, match="one tensor and one kind per layer"):
            p.capture("r", [t, t], layers=[1], token_ids=range(4))
        with pytest.raises(CaptureConfigError, match="expected 4 ids"):
            p.capture("r", [t], layers=[1], token_ids=range(3))
        with pytest.raises(CaptureConfigError, match=r"expected \(4, 8\)"):
            p.capture("r", [t, torch.zeros(4, 9)], layers=[1, 2], token_ids=range(4))
        with pytest.raises(CaptureConfigError, match="dtype"):
            p.capture("r", [t.to(torch.int64)], layers=[1], token_ids=range(4))


def test_blocks_that_disagree_are_refused_naming_what_was_expected_and_found(endpoint):
    """Every block of a capture must be 2-D with the first one's token rows, dtype and device;
    each refusal says what was expected and what was found, before any sequence number is
    taken, and a valid capture after them goes through (its hidden size defaulting to the
    narrowest block)."""
    p, sub = _inproc_pair(endpoint)
    try:
        aux = torch.randn(12, 3 * 8).to(torch.bfloat16)
        last = torch.randn(12, 8).to(torch.bfloat16)
        ids = torch.arange(12)
        row = {"rid": "ok", "token_start": 0, "token_count": 12, "last": True,
               "cached_prefix": 0, "extra": {}, "fields": {}}
        lmap = [[0, 0], [0, 8], [0, 16], [1, 0]]
        cases = [
            ([], "at least one block, found none"),
            ([aux.reshape(-1)], r"blocks must be \[tokens, cols\], found \(288,\)"),
            ([aux, last[:11]], r"block 1: expected \[12, cols\] torch.bfloat16 on cpu, "
                               r"found \(11, 8\) torch.bfloat16 on cpu"),
            ([aux, last.float()], r"block 1: .* found \(12, 8\) torch.float32 on cpu"),
            ([aux, torch.empty(12, 8, dtype=torch.bfloat16, device="meta")],
             r"block 1: .* found \(12, 8\) torch.bfloat16 on meta"),
            ([aux, last[None]], r"block 1: .* found \(1, 12, 8\)"),
        ]
        for blocks, match in cases:
            with pytest.raises(CaptureConfigError, match=match):
                p.capture_rows([dict(row)], [0], blocks, layers=[0, 1, 2, 3], token_ids=ids,
                               layer_map=lmap)
        assert p.stats()["next_seq"] == 0
        assert p.capture_rows([row], [0], [aux, last], layers=[0, 1, 2, 3], token_ids=ids,
                              layer_map=lmap)
        s = sub.get("ok", timeout=10)
        assert s.hidden == 8 and s.num_tokens == 12
        assert torch.equal(s.tensors["layer_3"], last) and torch.equal(s.tensors["layer_1"],
                                                                       aux[:, 8:16])
    finally:
        p.close()
        sub.close()


def test_capture_rows_takes_wire_form_rows_exactly_and_checks_their_sources(endpoint):
    """The engine adapter's entry point: rows as wire maps plus source starts, rows
    scattered through the sources (three spans), checked before any number is taken."""
    p, sub = _inproc_pair(endpoint)
    try:
        t = torch.arange(40 * 6, dtype=torch.float32).reshape(40, 6)
        ids = torch.arange(1000, 1040)

        def row(rid, n, last=True):
            return {"rid": rid, "token_start": 0, "token_count": n, "last": last,
                    "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}
        starts = [0, 5, 20, 31]
        maps = [row("w0", 5), row("w1", 3), row("w2", 4), row("w3", 9)]
        with pytest.raises(CaptureConfigError, match="inside the sources"):
            p.capture_rows([row("bad", 10)], [35], [t], layers=[0], token_ids=ids)
        with pytest.raises(CaptureConfigError, match="one source start per row"):
            p.capture_rows(maps, starts[:2], [t], layers=[0], token_ids=ids)
        with pytest.raises(CaptureConfigError, match="expected 40 ids"):
            p.capture_rows(maps, starts, [t], layers=[0], token_ids=ids[:3])
        assert p.stats()["next_seq"] == 0
        assert p.capture_rows(maps, starts, [t], layers=[0], token_ids=ids)
        for m, s0 in zip(maps, starts):
            got = sub.get(m["rid"], timeout=10)
            n = m["token_count"]
            assert torch.equal(got.tensors["layer_0"], t[s0:s0 + n])
            assert got.token_ids.tolist() == list(range(1000 + s0, 1000 + s0 + n))
            got.release()
    finally:
        sub.close()
        p.close()


def test_token_ids_given_per_row_from_host_buffers_arrive_exactly_and_are_checked_first(
        endpoint):
    """``HostRowIds``: each row's ids from its own host buffer (array('q'), numpy int32),
    written into the entry by the CPU. A count that disagrees with the row, an id outside
    int32 or a range past its buffer is refused before any number is taken, or (the
    native checks) becomes a reported drop, never a wrong sample."""
    from array import array

    import numpy as np

    from hscapture._copies import HostRowIds

    p, sub = _inproc_pair(endpoint)
    try:
        t = torch.arange(20 * 4, dtype=torch.float32).reshape(20, 4)

        def row(rid, n):
            return {"rid": rid, "token_start": 0, "token_count": n, "last": True,
                    "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}
        a_ids = array("q", range(500, 520))
        b_ids = np.arange(900, 930, dtype=np.int32)
        maps = [row("h0", 6), row("h1", 4)]
        good = HostRowIds([(a_ids, 2, 6), (b_ids, 10, 4)])
        with pytest.raises(CaptureConfigError, match="one .buffer, start, count. per row"):
            p.capture_rows(maps, [0, 8], [t], layers=[0], token_ids=HostRowIds(good.parts[:1]))
        with pytest.raises(CaptureConfigError, match=r"\(buffer, start, 4\)"):
            p.capture_rows(maps, [0, 8], [t], layers=[0],
                           token_ids=HostRowIds([(a_ids, 2, 6), (b_ids, 10, 5)]))
        assert p.stats()["next_seq"] == 0
        assert p.capture_rows(maps, [0, 8], [t], layers=[0], token_ids=good)
        for m, s0, want in zip(maps, [0, 8], [range(502, 508), range(910, 914)]):
            got = sub.get(m["rid"], timeout=10)
            assert torch.equal(got.tensors["layer_0"], t[s0:s0 + m["token_count"]])
            assert got.token_ids.tolist() == list(want)
            got.release()
        # ids the entry format cannot hold, or a range past the buffer: a reported drop
        for rid, ids in (("neg", HostRowIds([(array("q", [1, -5, 2]), 0, 3)])),
                         ("past", HostRowIds([(array("q", [1, 2]), 0, 3)]))):
            assert p.capture_rows([row(rid, 3)], [0], [t], layers=[0], token_ids=ids) is False
            with pytest.raises(SampleDroppedError, match="copy_error"):
                sub.get(rid, timeout=10)
    finally:
        sub.close()
        p.close()


def test_close_with_a_timeout_gives_up_in_time_and_still_removes_the_names(endpoint):
    """A close that cannot take the capture lock (a signal handler interrupting a capture on
    the same thread) returns within its bound and still removes socket, claim and segment."""
    from hscapture.endpoint import ipc_path

    p = Producer(endpoint, producer_id="abandon", capacity=1 << 20)
    seg = Path(f"/dev/shm/{p.segment}")
    sock = ipc_path(endpoint)
    assert seg.exists() and sock.exists()
    p._lock.acquire()          # as if this thread were inside capture_rows
    try:
        t0 = time.monotonic()
        p.close(timeout_s=0.2)
        assert time.monotonic() - t0 < 2.0
    finally:
        p._lock.release()
    assert not seg.exists() and not sock.exists() and not Path(f"{sock}.lock").exists()
    p.close(timeout_s=0.2)     # a second close returns at once
    p._enqueue(None)           # (this process goes on: stop the publisher, unmap)
    p._thread.join(10)
    p._release_resources(unlink=True)


def _connected(fake, sub, timeout: float = 10.0) -> None:
    """Return once ``sub`` receives frames from ``fake``, a PUB socket it is connected to (a
    PUB drops what it sends before the connection is complete): a probe is sent until one
    arrives. The probe is a ``bye`` of an incarnation nobody attached to, which the subscriber
    counts as ``before_attach`` and nothing else (later probes still in flight add to that
    count only)."""
    probe = nt.encode({"v": 3, "kind": "bye", "producer": "probe", "epoch": 99,
                       "next_seq": 0, "time_ns": 0})
    deadline = time.monotonic() + timeout
    while sub.stats().get("before_attach", 0) == 0:
        assert time.monotonic() < deadline, "the fake PUB socket never reached the subscriber"
        fake.send(probe)
        sub.pump(0.01)


def _inproc_pair(endpoint, **producer_kw):
    sub_kw = producer_kw.pop("sub_kw", {})
    p = Producer(endpoint, producer_id="local", capacity=producer_kw.pop("capacity", 8 << 20),
                 **producer_kw)
    sub = Subscriber(endpoint, **sub_kw)
    sub.wait_ready(timeout=10)
    return p, sub


def _no_more_heartbeats(p) -> None:
    """No heartbeats from ``p`` from now on (its subscriber attached already). A heartbeat's
    send holds the send lock, and an inline publish that meets it leaves its entries to the
    publisher thread's grace: right, and now and then on a loaded host, but not what a test
    of who publishes when counts (CI under load, 2026-12-05: a first capture's publish met
    one)."""
    p._announcer._heartbeat = lambda: None


def _capture(p, rid, tokens, chunk=None, start=0, cached=0, last=True, layers=LAYERS):
    tensors, ids = source(rid, tokens, HIDDEN, len(layers))
    chunk = chunk or tokens
    for s in range(start, tokens, chunk):
        e = min(tokens, s + chunk)
        p.capture(rid, [t[s:e] for t in tensors], layers=layers, token_start=s,
                  is_last_chunk=last and e == tokens, token_ids=ids[s:e], cached_prefix=cached)


def test_a_prefix_cache_hole_is_reported_incomplete_never_short(endpoint):
    p, sub = _inproc_pair(endpoint)
    with p, sub:
        _capture(p, "cached", 40, start=16, cached=16)
        _capture(p, "whole", 40)
        assert_sample_exact(sub.get("whole", timeout=10), "whole", 40, HIDDEN, LAYERS)
        with pytest.raises(IncompleteSampleError, match=r"prefix cache hit: positions \[0, 16\)"):
            sub.get("cached", timeout=5)


def test_expect_rejects_a_sample_with_another_token_count(endpoint):
    p, sub = _inproc_pair(endpoint)
    with p, sub:
        sub.expect("r1", 33)
        _capture(p, "r1", 32)
        with pytest.raises(SampleMismatchError, match="expected 33 tokens, found 32"):
            sub.get("r1", timeout=10)


def test_a_full_ring_drops_and_the_subscriber_names_every_dropped_rid(endpoint):
    # borrowed (zero-copy) samples that are never released hold the ring until it is full
    p, sub = _inproc_pair(endpoint, capacity=1 << 20, sub_kw={"zero_copy": True})
    with p, sub:
        held, dropped, accepted = [], [], []
        for i in range(40):     # 40 x 3 layers x 64 x 64 x 2 B = 24 KiB each... x big tokens
            rid = f"big-{i}"
            tensors, ids = source(rid, 256, HIDDEN, len(LAYERS))
            ok = p.capture(rid, tensors, layers=LAYERS, token_ids=ids)
            (accepted if ok else dropped).append(rid)
            s = sub.poll(timeout=0.5 if ok else 0.0)
            while s is not None:
                held.append(s)          # never released: the ring fills up
                s = sub.poll(timeout=0.0)
        assert dropped, "the ring never filled"
        deadline = time.monotonic() + 10
        while set(sub.dropped) != set(dropped) and time.monotonic() < deadline:
            sub.pump(0.05)
        assert set(sub.dropped) == set(dropped)
        with pytest.raises(SampleDroppedError, match="ring_full"):
            sub.get(dropped[0], timeout=1)
        assert p.stats()["dropped"] == len(dropped)
        for s in held:
            assert_sample_exact(s, s.rid, 256, HIDDEN, LAYERS)
            s.release()
        # space came back: captures succeed again
        _capture(p, "after", 8)
        assert sub.get("after", timeout=10).num_tokens == 8


def test_notices_lost_on_the_wire_are_recovered_from_the_ring(endpoint, tmp_path):
    requests = [[f"r{i}", 5, 5] for i in range(300)]
    proc = start_producer(spec(endpoint, requests, sndhwm=1), tmp_path)
    try:
        read_events(proc, "ready")
        with Subscriber(endpoint) as sub:
            sub.wait_ready(timeout=20)
            # the producer races ahead while nobody reads: its PUB queue (HWM 1) overflows;
            # it says when every capture is committed and announced (or lost on the wire)
            read_events(proc, "dropped")
            got = {s.rid for s in sub.samples(limit=len(requests), timeout=30)}
            assert got == {r for r, _, _ in requests}
            assert sub.stats().get("recovered_from_ring", 0) > 0
    finally:
        proc.wait(timeout=30)


def test_a_restarted_producer_gets_a_new_epoch_and_old_notices_are_rejected(endpoint, tmp_path):
    first = start_producer(spec(endpoint, [["half", 64, 16]], hard_exit=True,
                                linger_s=0.5), tmp_path)
    fake = zmq.Context.instance().socket(zmq.PUB)
    fake_ep = endpoint.replace("p.sock", "fake.sock")
    fake.bind(fake_ep)
    try:
        old = read_events(first, "ready")
        with Subscriber([endpoint, fake_ep], incomplete_timeout_s=120) as sub:
            sub.wait_ready(timeout=20)
            sample = sub.get("half", timeout=20)
            assert sample.epoch == old["epoch"]
            first.wait(timeout=30)
            second = start_producer(spec(endpoint, [["half", 64, 16]]), tmp_path)
            new = read_events(second, "ready")
            assert new["epoch"] != old["epoch"]
            sample2 = sub.get("half", timeout=30)
            assert sample2.epoch == new["epoch"]
            assert_sample_exact(sample2, "half", 64, HIDDEN, LAYERS)
            # a notice of the old incarnation arriving now is rejected, never mixed in
            stale = nt.encode({"v": 3, "kind": "heartbeat", "producer": "test",
                               "epoch": old["epoch"], "pid": 1, "segment": "x", "next_seq": 0,
                               "head": 0, "committed": 0, "dropped": 0, "unrecorded": 0,
                               "backlog": 0, "recorded_through": 0, "heard": True, "errors": 0,
                               "time_ns": 0})
            _connected(fake, sub)
            fake.send(stale)
            deadline = time.monotonic() + 5
            while sub.stats().get("stale_notices", 0) == 0 and time.monotonic() < deadline:
                sub.pump(0.05)
            assert sub.stats()["stale_notices"] == 1
            assert "half" not in sub.incomplete
            second.wait(timeout=30)
    finally:
        fake.close(0)


def test_malformed_truncated_and_wrong_version_notices_never_crash_either_side(
        endpoint, tmp_path):
    fake_ep = endpoint.replace("p.sock", "fake.sock")
    fake = zmq.Context.instance().socket(zmq.PUB)
    fake.bind(fake_ep)
    try:
        p, sub = _inproc_pair(endpoint)
        with p, sub:
            sub._sock.connect(fake_ep)
            _connected(fake, sub)
            good = nt.encode({"v": 3, "kind": "bye", "producer": "x", "epoch": 5,
                              "next_seq": 0, "time_ns": 0})
            bad = [b"", b"\xc1", good[: len(good) // 2], msgpack.packb([1, 2, 3]),
                   msgpack.packb({"v": 99, "kind": "bye"}),
                   msgpack.packb({"v": 1, "kind": "record", "rid": 7}),
                   os.urandom(300)]
            for frame in bad:
                fake.send(frame)
            _capture(p, "fine", 10)
            assert_sample_exact(sub.get("fine", timeout=10), "fine", 10, HIDDEN, LAYERS)
            deadline = time.monotonic() + 5
            while sub.stats().get("malformed_notices", 0) < len(bad) and \
                    time.monotonic() < deadline:
                sub.pump(0.05)
            stats = sub.stats()
            assert stats["malformed_notices"] == len(bad)
            assert any("version" in e for e in stats["errors"])
    finally:
        fake.close(0)


def test_a_dropped_middle_chunk_makes_the_whole_sample_dropped_not_short(endpoint):
    p, sub = _inproc_pair(endpoint, capacity=1 << 20)
    with p, sub:
        tensors, ids = source("mid", 300, HIDDEN, len(LAYERS))
        p.capture("mid", [t[:100] for t in tensors], layers=LAYERS, token_start=0,
                  is_last_chunk=False, token_ids=ids[:100])
        huge = [torch.zeros(8000, HIDDEN, dtype=torch.bfloat16)] * 3   # larger than the ring
        assert not p.capture("mid", huge, layers=LAYERS, token_start=100, is_last_chunk=False,
                             token_ids=range(8000))
        p.capture("mid", [t[200:] for t in tensors], layers=LAYERS, token_start=200,
                  is_last_chunk=True, token_ids=ids[200:])
        with pytest.raises(SampleDroppedError, match="record_too_large"):
            sub.get("mid", timeout=10)


def test_abort_reports_incomplete_and_a_restart_abort_lets_the_new_attempt_complete(endpoint):
    p, sub = _inproc_pair(endpoint)
    with p, sub:
        _capture(p, "aborted", 64, chunk=16, last=False)
        p.abort("aborted", "client disconnected")
        _capture(p, "retracted", 64, chunk=32, last=False)
        p.abort("retracted", "retracted", restart=True)
        _capture(p, "retracted", 64, chunk=16)
        with pytest.raises(IncompleteSampleError, match="client disconnected"):
            sub.get("aborted", timeout=10)
        s = sub.get("retracted", timeout=10)
        assert_sample_exact(s, "retracted", 64, HIDDEN, LAYERS)
        assert s.meta["chunks"] == 4
        assert sub.stats()["restarted"] == 1


def test_a_failed_rid_starts_a_new_sample_from_its_first_row_and_drops_the_old_ones_rest(
        endpoint):
    """After a sample failed (aborted, reported incomplete), a row of the same rid from token
    0 starts a new sample (a client retrying with the same rid), delivered whole; a later
    chunk of the failed sample (not from its start) is discarded, never joined to it. The
    failure stays reported."""
    p, sub = _inproc_pair(endpoint)
    with p, sub:
        _capture(p, "retry", 64, chunk=16, last=False)           # [0, 64) of a longer prompt
        p.abort("retry", "client went away")
        _capture(p, "retry", 80, chunk=16, start=64)             # a straggler: [64, 80), last
        _capture(p, "retry", 40, chunk=16)                        # the retry: [0, 40), whole
        _capture(p, "after", 8)                                   # a marker
        got = {}
        while "after" not in got:
            s = sub.poll(timeout=10)
            assert s is not None, "the marker never arrived"
            got.setdefault(s.rid, []).append(s)
        assert [x.num_tokens for x in got["retry"]] == [40]
        assert_sample_exact(got["retry"][0], "retry", 40, HIDDEN, LAYERS)
        st = sub.stats()
        assert "client went away" in st["incomplete"]["retry"]
        assert st["discarded_chunks"] == 1 and st["new_attempts_after_failure"] == 1


def test_with_inline_publishing_off_only_the_publisher_thread_commits_and_announces(endpoint):
    """``inline_publish=False`` (the bench's ``publisher`` mode): the capturing thread never
    commits or sends a notice, the publisher thread publishes every entry (captures and an
    abort) without waiting for a later capture, and every sample still arrives exact, once;
    switching it back on at run time publishes inline again."""
    import threading

    p, sub = _inproc_pair(endpoint, inline_publish=False, commit_grace_s=30.0)
    _no_more_heartbeats(p)
    by: list[str] = []
    real = p._publish

    def publish(item):
        by.append(threading.current_thread().name)
        return real(item)
    p._publish = publish
    with p, sub:
        _capture(p, "first", 8)   # alone: nothing after it would wake a thread in its grace
        assert_sample_exact(sub.get("first", timeout=5), "first", 8, HIDDEN, LAYERS)
        for i in range(20):
            _capture(p, f"r{i}", 24, chunk=8)
        p.abort("gone", "client disconnected")
        for i in range(20):   # no flush: a 30 s grace would show as a timeout here
            assert_sample_exact(sub.get(f"r{i}", timeout=10), f"r{i}", 24, HIDDEN, LAYERS)
        with pytest.raises(IncompleteSampleError):
            sub.get("gone", timeout=10)
        assert by and set(by) == {"hscapture-publisher"}, set(by)
        p.inline_publish = True      # (its thread now waits out the 30 s grace first)
        n = len(by)
        _capture(p, "inline", 8)
        assert_sample_exact(sub.get("inline", timeout=10), "inline", 8, HIDDEN, LAYERS)
        assert by[n:] == [threading.main_thread().name], by[n:]


def test_get_times_out_with_a_typed_error_naming_what_arrived(endpoint):
    p, sub = _inproc_pair(endpoint)
    with p, sub:
        _capture(p, "partial", 32, chunk=16, last=False)
        with pytest.raises(SampleTimeoutError, match=r"\[0, 16\), \[16, 32\)"):
            sub.get("partial", timeout=1.0)


def test_samples_own_their_bytes_by_default_and_hold_no_ring_space(endpoint):
    p, sub = _inproc_pair(endpoint)
    with p, sub:
        _capture(p, "owned", 16)
        s = sub.get("owned", timeout=10)
        sub.pump(0.05)
        ring = p.stats()["ring"]
        assert ring["min_released"] == ring["head"], "an owned sample must not hold the ring"
        assert not s.borrowed
        s.release()                                   # a no-op for an owned sample
        assert_sample_exact(s, "owned", 16, HIDDEN, LAYERS)


def test_a_borrowed_sample_holds_its_ring_space_and_is_empty_after_release(endpoint):
    p, sub = _inproc_pair(endpoint, sub_kw={"zero_copy": True})
    with p, sub:
        _capture(p, "view", 16)
        s = sub.get("view", timeout=10)
        sub.pump(0.05)
        head_before = p.stats()["ring"]["min_released"]
        assert head_before < p.stats()["ring"]["head"], "held sample's record was released"
        t = s.tensors["layer_3"]   # (the mapping is read-only: tests/test_ring_durable.py)
        with s:
            assert_sample_exact(s, "view", 16, HIDDEN, LAYERS)
        assert t.numel() == 0 and s.token_ids.numel() == 0, "released tensors must be empty"
        sub.pump(0.05)
        assert p.stats()["ring"]["min_released"] > head_before


def test_public_api_is_listed_once():
    for name in hscapture.__all__:
        assert hasattr(hscapture, name), name
    assert {"Producer", "Subscriber", "Sample", "HSCaptureError"} <= set(hscapture.__all__)


# --- drain and shards ----------------------------------------------------------------------


def _drain_cmd(endpoint, out, *extra):
    return [sys.executable, "-m", "hscapture", "drain", "-e", endpoint, "-o", str(out),
            "--quiet", "--json", "--connect-timeout", "20", *extra]


def test_drain_writes_exact_shards_that_safetensors_opens(endpoint, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "shards"
    requests = [[f"d{i}", 1 + 37 * i % 400, 64] for i in range(30)]
    drain = subprocess.Popen(_drain_cmd(endpoint, out, "--samples", "30", "--shard-size", "1M"),
                             cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    proc = start_producer(spec(endpoint, requests, threads=3), tmp_path)
    try:
        report = json.loads(drain.communicate(timeout=120)[0])
        assert drain.returncode == 0, report
        assert report["samples"] == 30
        index = read_index(out)
        assert sorted(index) == sorted(r for r, _, _ in requests)
        assert verify_dir(out)["problems"] == []
        shards = sorted(out.glob("*.safetensors"))
        assert len(shards) > 1, "the 1M shard size should roll over"
        tokens = dict((r, t) for r, t, _ in requests)
        for rid, entry in index.items():
            with safe_open(str(out / entry["shard"]), "pt") as f:
                tensors, ids = source(rid, tokens[rid], HIDDEN, len(LAYERS))
                for L, t in zip(LAYERS, tensors):
                    assert torch.equal(f.get_tensor(f"{rid}/layer_{L}"), t)
                assert torch.equal(f.get_tensor(f"{rid}/token_ids").to(torch.int64), ids)
                assert json.loads(f.metadata()["layers"]) == LAYERS
    finally:
        proc.wait(timeout=30)


def _durable(out):
    """rids the shard writer made durable: indexed, or journaled in the open shard."""
    rids = set(read_index(out)) if (out / "index.jsonl").exists() else set()
    for journal in out.glob("*.journal"):
        for line in journal.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue            # a torn last line
            if entry.get("kind") == "sample":
                rids.add(entry["rid"])
    return rids


def test_a_drain_killed_mid_stream_and_restarted_resumes_without_duplicates(endpoint, tmp_path):
    out = tmp_path / "shards"
    requests = [[f"k{i}", 50, 25] for i in range(600)]
    first = subprocess.Popen(_drain_cmd(endpoint, out, "--idle-timeout", "30"), cwd=tmp_path,
                             stdout=subprocess.PIPE, text=True)
    proc = start_producer(spec(endpoint, requests, jitter_s=0.02, grace_s=60), tmp_path)
    try:
        read_events(proc, "ready")
        deadline = time.monotonic() + 60
        while len(_durable(out)) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait()
        durable = _durable(out)
        assert len(durable) >= 20
        second = subprocess.Popen(_drain_cmd(endpoint, out, "--idle-timeout", "3"),
                                  cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        report = json.loads(second.communicate(timeout=120)[0])
        index_lines = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
        rids = [e["rid"] for e in index_lines]
        assert len(rids) == len(set(rids)), "a rid was written twice"
        assert durable <= set(rids), "a sample committed before the kill was lost"
        # the restarted drain took over the dead one's place in the ring: nothing in flight
        # at the kill was lost either
        assert set(rids) == {r for r, _, _ in requests}, (sorted({r for r, _, _ in requests} - set(rids)), json.dumps(report)[:3000])
        assert verify_dir(out)["problems"] == []
        assert report["samples"] > 0 and not report["dropped"] and not report["incomplete"]
    finally:
        proc.wait(timeout=60)


def test_drain_reports_a_wrong_endpoint_and_an_unwritable_directory_clearly(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "hscapture", "drain", "-e", "nonsense",
                          "-o", str(tmp_path / "o")], cwd=tmp_path, capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "endpoint" in bad.stderr and "Traceback" not in bad.stderr
    nobody = subprocess.run([sys.executable, "-m", "hscapture", "drain", "-e",
                             "ipc:///tmp/hscapture-nobody-here.sock", "-o", str(tmp_path / "o"),
                             "--connect-timeout", "0.5"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert nobody.returncode != 0 and "no hscapture producer" in nobody.stderr
    assert "Traceback" not in nobody.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    unwritable = subprocess.run([sys.executable, "-m", "hscapture", "drain", "-e",
                                 "ipc:///tmp/x.sock", "-o", str(blocker / "sub")], cwd=tmp_path,
                                capture_output=True, text=True)
    assert unwritable.returncode != 0 and str(blocker) in unwritable.stderr
    assert "Traceback" not in unwritable.stderr


def test_the_embedded_demo_captures_a_real_model_bit_exact(tmp_path):
    from hscapture.demo import run_demo

    res = run_demo(tmp_path / "demo", requests=12, batch=4, chunk_size=48, log=False)
    assert res.ok, (res.mismatched, res.problems, res.drain_returncode)
    assert res.exact == 12


def test_two_subscribers_each_receive_every_sample(endpoint, tmp_path):
    requests = [[f"m{i}", 1 + 13 * i % 200, 50] for i in range(40)]
    proc = start_producer(spec(endpoint, requests, consumers=2), tmp_path)
    try:
        read_events(proc, "ready")
        with Subscriber(endpoint) as a, Subscriber(endpoint) as b:
            a.wait_ready(timeout=20)
            b.wait_ready(timeout=20)
            got = {id(a): set(), id(b): set()}
            deadline = time.monotonic() + 60
            while min(len(v) for v in got.values()) < len(requests):
                assert time.monotonic() < deadline, {k: len(v) for k, v in got.items()}
                for sub in (a, b):
                    s = sub.poll(timeout=0.02)
                    if s is not None:
                        tokens = dict((r, t) for r, t, _ in requests)[s.rid]
                        assert_sample_exact(s, s.rid, tokens, HIDDEN, LAYERS)
                        got[id(sub)].add(s.rid)
                        s.release()
            assert got[id(a)] == got[id(b)] == {r for r, _, _ in requests}
    finally:
        proc.wait(timeout=30)


def test_ctrl_c_stops_the_drain_cleanly_with_the_open_shard_finished(endpoint, tmp_path):
    out = tmp_path / "shards"
    requests = [[f"c{i}", 40, 40] for i in range(2000)]
    drain = subprocess.Popen(_drain_cmd(endpoint, out), cwd=tmp_path, stdout=subprocess.PIPE,
                             text=True)
    proc = start_producer(spec(endpoint, requests, jitter_s=0.01, policy="drop"), tmp_path)
    try:
        read_events(proc, "ready")
        deadline = time.monotonic() + 60
        while len(_durable(out)) < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        drain.send_signal(signal.SIGINT)
        report = json.loads(drain.communicate(timeout=60)[0])
        assert drain.returncode == 130, report          # interrupted (issue 11: exit 130)
        assert report["stopped_by"] == "signal"
        assert not list(out.glob("*.tmp")) and not list(out.glob("*.journal")), \
            "the open shard was not finished"
        index = read_index(out)
        assert len(index) == report["samples"] >= 10
        assert verify_dir(out)["problems"] == []
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_late_subscriber_gets_every_record_after_it_attached_and_is_told_each_rid_before(
        endpoint):
    with Producer(endpoint, producer_id="late", capacity=8 << 20) as p:
        for i in range(20):
            _capture(p, f"early-{i}", 16)
        p.flush()
        with Subscriber(endpoint) as sub:
            sub.wait_ready(timeout=10)
            for i in range(20):
                _capture(p, f"late-{i}", 16, chunk=5)
            got = [s.rid for s in sub.samples(limit=20, timeout=10)]
            assert sorted(got) == sorted(f"late-{i}" for i in range(20))
            deadline = time.monotonic() + 10
            while len(sub.dropped) < 20 and time.monotonic() < deadline:
                sub.pump(0.05)
            assert sub.stats()["ready"] == 0       # nothing from before the attach
            # ... but every capture made before it is NAMED to it, never only counted
            assert set(sub.dropped) == {f"early-{i}" for i in range(20)}
            assert all("before any subscriber attached" in why for why in sub.dropped.values())
            assert not sub.incomplete and not sub.rejected


def test_a_second_producer_cannot_steal_a_live_producers_endpoint(endpoint):
    from hscapture.errors import EndpointError

    with Producer(endpoint, producer_id="first", capacity=1 << 20):
        before = set(os.listdir("/dev/shm"))
        with pytest.raises(EndpointError, match=f"in use by another producer \\(pid {os.getpid()}"):
            Producer(endpoint, producer_id="second", capacity=1_000_000)
        assert set(os.listdir("/dev/shm")) == before, "the refused producer left a segment"
    # released on close: the endpoint can be bound again (capacity is rounded up to 64)
    with Producer(endpoint, producer_id="third", capacity=1_000_001) as p:
        assert p.stats()["ring"]["head"] == 0


def test_a_producer_removes_the_segment_its_killed_predecessor_left(endpoint, tmp_path):
    code = ("import os, signal, sys\n"
            "from hscapture import Producer\n"
            "p = Producer(sys.argv[1], producer_id='reborn', capacity=1 << 20)\n"
            "print(p.segment, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code, endpoint], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    old = proc.stdout.strip()
    assert old and os.path.exists(f"/dev/shm/{old}"), "the killed producer left its segment"
    with Producer(endpoint, producer_id="reborn", capacity=1 << 20) as p:
        assert not os.path.exists(f"/dev/shm/{old}")
        assert p.segment != old and os.path.exists(f"/dev/shm/{p.segment}")


def test_the_publisher_thread_publishes_only_once_captures_stopped_for_the_grace(endpoint):
    """The commit grace runs from the LAST capture, not from when the publisher thread looked:
    through steady captures that thread sleeps (the capturing thread publishes), so it never
    takes the GIL from a busy engine thread once per capture. Entries the capturing thread
    could not publish (its publish lock was taken) are published by the publisher thread only
    after no capture came for ``commit_grace_s`` (exactly: by the monotonic clock), and then
    without any further capture or flush. The captures are spaced on purpose (the scenario),
    nothing here waits by sleeping."""
    import threading

    grace = 0.6
    p, sub = _inproc_pair(endpoint, commit_grace_s=grace)
    published: list[tuple[str, float, float]] = []   # (thread, when, last enqueue then)
    real = p._publish

    def publish(item):
        published.append((threading.current_thread().name, time.monotonic(),
                          p._pubq.last_enqueue))
        return real(item)
    p._publish = publish
    with p, sub:
        for i in range(5):                       # steady: published inline, by this thread
            _capture(p, f"steady{i}", 8)
        for i in range(5):
            assert_sample_exact(sub.get(f"steady{i}", timeout=10), f"steady{i}", 8, HIDDEN,
                                LAYERS)
        # published by this thread, and by the publisher thread only after the grace: a
        # capture whose inline publish finds the send lock taken (the publisher thread
        # sending a heartbeat, descheduled on a loaded host) leaves its entry to that thread,
        # which must still wait for the grace (newcomer walk: this flaked, 1 run in 3, when
        # it asserted that no steady entry ever went that way)
        assert all(when - last >= grace for t, when, last in published
                   if t != threading.main_thread().name), published
        n = len(published)
        with p._pubq.send_lock:                        # the capture cannot publish inline
            _capture(p, "held-a", 8)
        time.sleep(grace / 2)                    # the next capture comes within the grace
        with p._pubq.send_lock:
            _capture(p, "held-b", 8)
        for rid in ("held-a", "held-b"):         # no capture, no flush: the thread's job
            assert_sample_exact(sub.get(rid, timeout=10), rid, 8, HIDDEN, LAYERS)
        late = published[n:]
        assert [t for t, _, _ in late] == ["hscapture-publisher"] * 2, late
        for _, when, last in late:
            assert when - last >= grace, f"published {when - last:.3f} s after the last " \
                                         f"capture, inside the {grace} s grace"


def test_a_capture_that_meets_the_send_lock_held_publishes_its_entry_once_the_lock_comes_back(
        endpoint):
    """The publisher thread holds the send lock for a heartbeat's send, which runs without
    the GIL; a capture that met it gave its entry up to that thread at once, and the entry
    waited for the next capture or the commit grace (plus, from an engine thread that never
    releases the GIL, the 5 ms switch interval: paced 16-record entries at 5,000/s had a
    notice p99 of 4.4-4.7 ms with heartbeats on against 1.2-1.4 without, CPU machine
    2026-12-07). The capture now waits for the lock (up to ``INLINE_LOCK_WAIT_S``, the GIL
    released) and publishes its entry itself. Here the lock is given back as soon as the
    capturing thread waits at it; the grace (60 s) is far longer than the test may take."""
    import threading

    from hscapture._announcer import INLINE_LOCK_WAIT_S

    assert 0 < INLINE_LOCK_WAIT_S <= 0.001   # a bound on what the engine's thread may wait
    p, sub = _inproc_pair(endpoint, commit_grace_s=60.0)
    with p, sub:
        _capture(p, "first", 8)
        assert_sample_exact(sub.get("first", timeout=10), "first", 8, HIDDEN, LAYERS)
        _no_more_heartbeats(p)        # the lock below is the only one held
        real = p._pubq.send_lock
        at_lock = threading.Event()
        capturer = threading.current_thread()

        class Watched:
            """The send lock, saying when the capturing thread waits at it."""

            def acquire(self, blocking=True, timeout=-1):
                if threading.current_thread() is capturer:
                    at_lock.set()
                return real.acquire(blocking, timeout)

            def release(self):
                real.release()

            __enter__ = acquire

            def __exit__(self, *exc):
                real.release()

        def publisher_like():         # holds it as a heartbeat's send does, until then
            at_lock.wait(30)
            real.release()

        real.acquire()
        p._pubq.send_lock = Watched()
        holder = threading.Thread(target=publisher_like)
        holder.start()
        try:
            # its publish must wait for the lock rather than leave the entry to the grace
            _capture(p, "held", 8)
            holder.join(30)
            announced = p._announcer.announced
        finally:
            p._pubq.send_lock = real
        assert announced > 1, "the entry was left to the publisher thread's 60 s grace"
        assert_sample_exact(sub.get("held", timeout=10), "held", 8, HIDDEN, LAYERS)


def test_the_publisher_thread_is_woken_per_entry_only_when_its_grace_is_shorter_than_its_sleep(
        endpoint):
    """The producer asks the publish queue to wake its publisher thread for a first entry
    whose copy is still running only while ``commit_grace_s`` is shorter than
    ``heartbeat_interval_s`` (the thread's sleep on an empty queue): with a grace at least
    that long (the SGLang hook's), the thread finds the entry before its grace ends anyway,
    and a busy engine thread does not hand it the GIL once per entry. Both settings are read
    at each entry; every sample arrives exact either way."""
    p, sub = _inproc_pair(endpoint, commit_grace_s=0.5, heartbeat_interval_s=0.1)
    asked: list[bool] = []
    real = p._pubq.put

    def put(item, wake=False, wake_first=True):
        if item is not None:
            asked.append(wake_first)
        return real(item, wake, wake_first)
    p._pubq.put = put
    with p, sub:
        _capture(p, "long-grace", 8)
        p.commit_grace_s = 0.005
        _capture(p, "short-grace", 8)
        p.heartbeat_interval_s = 0.001
        _capture(p, "short-sleep", 8)
        for rid in ("long-grace", "short-grace", "short-sleep"):
            assert_sample_exact(sub.get(rid, timeout=10), rid, 8, HIDDEN, LAYERS)
    assert asked == [False, True, False], asked


def test_a_publish_interval_coalesces_inline_publishing_by_time_and_by_queued_bytes(endpoint):
    """``publish_interval_s`` (the SGLang hook's default, so that the scheduler's thread wakes
    ZeroMQ's I/O thread once per interval instead of once per forward): the capturing thread
    publishes after a capture only once the interval passed since it last did, or once the
    queued entries hold 1/8 of the ring; then every completed entry goes out back to back, in
    order. Nothing is lost or duplicated on the way, and ``flush`` still publishes at once."""
    import threading

    p, sub = _inproc_pair(endpoint, publish_interval_s=30.0, commit_grace_s=60.0,
                          capacity=8 << 20)
    _no_more_heartbeats(p)
    calls: list[list[int]] = []          # the seqs of each publish_ready call, in order
    real_ready, real_publish = p._pubq.publish_ready, p._publish

    def publish_ready(block, publish, wait_s=0.0):
        calls.append([])
        return real_ready(block, publish, wait_s)

    def publish(item):
        if threading.current_thread() is threading.main_thread():
            calls[-1].append(item.seq)
        else:
            flushed.append(item.seq)
        return real_publish(item)
    flushed: list[int] = []           # published by the publisher thread (for flush)
    p._pubq.publish_ready, p._publish = publish_ready, publish
    rids: list[str] = []
    with p, sub:
        _capture(p, "first", 8)      # nothing published yet: the first capture publishes
        assert [c for c in calls if c] == [[0]]
        for i in range(9):           # inside the 30 s interval, a few KiB: all queued
            _capture(p, f"small{i}", 8)
            rids.append(f"small{i}")
        p.publish_completed()        # a decode step's call is coalesced the same way
        assert [c for c in calls if c] == [[0]] and p._pubq.held_bytes > 0
        threshold = p._publish_bytes
        published_by_bytes = False
        for i in range(8):           # ~0.3 MiB each: the byte rule fires within a few
            before, held = p.stats()["captured_bytes"], p._pubq.held_bytes
            n = len([c for c in calls if c])
            _capture(p, f"big{i}", 1536)
            rids.append(f"big{i}")
            length = p.stats()["captured_bytes"] - before
            if len([c for c in calls if c]) > n:
                assert held + length >= threshold, (held, length, threshold)
                assert p._pubq.held_bytes == 0      # every completed entry went out
                published_by_bytes = True
            else:
                assert held + length < threshold
        assert published_by_bytes
        # once published, in one call, in sequence order, each entry once
        seqs = [s for c in calls for s in c]
        assert seqs == list(range(len(seqs)))
        assert max(len(c) for c in calls) >= 10
        p.publish_interval_s = 0.2
        _capture(p, "timed-a", 8)    # the byte rule published just now: queued
        rids.append("timed-a")
        last = time.monotonic()
        n = len([c for c in calls if c])
        while time.monotonic() - last < 0.2:   # the scenario: the interval passes
            time.sleep(0.01)
        _capture(p, "timed-b", 8)    # due by time: publishes both
        rids.append("timed-b")
        assert len([c for c in calls if c]) == n + 1 and p._pubq.held_bytes == 0
        p.publish_interval_s = 30.0
        _capture(p, "flushed", 8)    # queued (inside the interval) until flush
        rids.append("flushed")
        assert not flushed
        p.flush(timeout_s=10)
        for rid in ["first"] + rids:
            s = sub.get(rid, timeout=10)
            assert s.rid == rid
        seqs = [s for c in calls for s in c] + flushed
        assert seqs == list(range(len(rids) + 1))



from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 40), st.integers(-2, 20),
                          st.one_of(st.none(), st.integers(-2, 20), st.just("bad"))),
                min_size=1, max_size=6),
       st.integers(0, 40), st.booleans(), st.booleans())
def test_capture_rows_one_pass_row_check_accepts_exactly_what_the_per_row_checks_accept(
        rows, t_src, host_ids, short_parts):
    """``capture_rows`` checks its rows in one pass (``_rows_fit``) and runs the per-row
    checks only to name a bad row: the two must agree on every input, or a bad row would be
    staged (or a good one refused). Each row: (source start, token count, its ids part's
    count: None = its own count, or another, or a malformed part); ``short_parts`` leaves a
    row without its part."""
    from hscapture._copies import HostRowIds
    from hscapture.producer import _check_row_ids, _check_source_range, _rows_fit

    maps = [{"rid": f"r{i}", "token_count": n} for i, (_, n, _) in enumerate(rows)]
    starts = [s for s, _, _ in rows]
    parts = [("bad",) if c == "bad" else (b"", 0, n if c is None else c)
             for _, n, c in rows]
    ids = HostRowIds(parts[:-1] if short_parts else parts)
    try:
        for s, m in zip(starts, maps):
            _check_source_range(m["rid"], s, m["token_count"], t_src)
        if host_ids:
            _check_row_ids(ids, maps)
        ok = True
    except CaptureConfigError:
        ok = False
    assert _rows_fit(maps, starts, ids.parts if host_ids else None, t_src) == ok
