"""Deferred captures (``Producer.capture_rows(defer=True)``): several forwards, one ring entry.

Real producer, real subscriber, real ring and ZeroMQ, host tensors (the native CUDA twin of
the copies is tests/test_gpu.py's). What is specified: every staged row arrives once and
exact, or is reported by rid; the ring's order is the order of the calls (an abort or an
immediate capture after staged rows comes after them); a staged rid seen again, a full stage,
an idle one, ``flush`` and ``close`` each write the stage; snapshots are taken at the call.
"""

from __future__ import annotations

import time
from array import array

import pytest
import torch

from hscapture import Producer, Subscriber
from hscapture._copies import HostRowIds
from hscapture._staging import Stage, StagedGroup, entry_spans
from hscapture.errors import IncompleteSampleError, SampleDroppedError

H = 8


def _row(rid, start, count, last=True, cached=0):
    return {"rid": rid, "token_start": start, "token_count": count, "last": last,
            "cached_prefix": cached, "extra": {"attempt": 0}, "fields": {}}


class Forward:
    """One fake forward pass: ``tokens`` source rows whose values name (forward, row)."""

    def __init__(self, k: int, tokens: int) -> None:
        self.k = k
        self.aux = (torch.arange(tokens * 2 * H, dtype=torch.float32).reshape(tokens, 2 * H)
                    + 1_000_000 * k)
        self.ids = array("q", range(10_000 * k, 10_000 * k + tokens))

    def capture(self, p, rows, starts, **kw):
        return p.capture_rows(rows, starts, [self.aux], layers=[3, 5],
                              token_ids=HostRowIds([(self.ids, s, r["token_count"])
                                                    for r, s in zip(rows, starts)]),
                              layer_map=[[0, 0], [0, H]], hidden=H, **kw)

    def expect(self, sample, start, count):
        rows = self.aux[start:start + count]
        assert torch.equal(sample.tensors["layer_3"], rows[:, :H])
        assert torch.equal(sample.tensors["layer_5"], rows[:, H:])
        assert sample.token_ids.tolist() == list(self.ids[start:start + count])


@pytest.fixture
def pair(endpoint):
    made = []

    def make(interval=60.0, **kw):
        sub_kw = kw.pop("sub_kw", {})
        p = Producer(endpoint, producer_id="stage", capacity=kw.pop("capacity", 8 << 20),
                     stage_interval_s=interval, **kw)
        sub = Subscriber(endpoint, **sub_kw)
        sub.wait_ready(timeout=10)
        made.append((p, sub))
        return p, sub

    yield make
    for p, sub in made:
        sub.close()
        p.close()


def test_deferred_captures_of_several_forwards_become_one_entry_with_exact_bytes(pair):
    p, sub = pair()
    f1, f2, f3 = Forward(1, 30), Forward(2, 20), Forward(3, 12)
    assert f1.capture(p, [_row("a", 0, 5), _row("b", 0, 7)], [2, 20], defer=True)
    # CUDA-graph-like outputs: the engine overwrites them right after the call
    assert f2.capture(p, [_row("c", 0, 9)], [4], defer=True, snapshot=True)
    original = f2.aux.clone()
    f2.aux.fill_(-1.0)
    assert f3.capture(p, [_row("d", 0, 12)], [0], defer=True)
    st = p.stats()
    assert st["next_seq"] == 0 and st["staged_rows"] == 4 and not st.get("stage_writes")
    p.flush(timeout_s=10)
    st = p.stats()
    assert st["next_seq"] == 4 and st["stage_writes"] == 1
    f2.aux = original
    for f, rid, start, n in ((f1, "a", 2, 5), (f1, "b", 20, 7), (f2, "c", 4, 9),
                             (f3, "d", 0, 12)):
        s = sub.get(rid, timeout=10)
        f.expect(s, start, n)
        assert s.meta["seqs"] == [{"a": 0, "b": 1, "c": 2, "d": 3}[rid]]
        s.release()


def test_a_chunk_continuing_a_staged_row_is_merged_into_it_and_arrives_as_one_row(pair):
    """A prompt split across two forwards (the usual case with long chunks and short
    prompts): its second chunk continues the staged row, so the entry holds ONE row of 16
    tokens taken piece by piece from both forwards' sources, with its loss mask joined."""
    p, sub = pair()
    f1, f2 = Forward(1, 16), Forward(2, 16)
    head = _row("long", 0, 10, last=False)
    head["fields"] = {"loss_mask": bytes([0] * 4 + [1] * 6)}
    tail = _row("long", 10, 6)
    tail["fields"] = {"loss_mask": bytes([1] * 5 + [0])}
    assert f1.capture(p, [_row("x", 0, 4), head], [10, 0], defer=True)
    assert f2.capture(p, [tail], [3], defer=True)
    p.flush(timeout_s=10)
    st = p.stats()
    assert st["stage_writes"] == 1 and st["next_seq"] == 2 and st["staged_rows"] == 3
    s = sub.get("long", timeout=10)
    assert s.num_tokens == 16 and s.meta["chunks"] == 1
    assert torch.equal(s.tensors["layer_3"][:10], f1.aux[0:10, :H])
    assert torch.equal(s.tensors["layer_5"][10:], f2.aux[3:9, H:])
    assert s.token_ids.tolist() == list(f1.ids[0:10]) + list(f2.ids[3:9])
    assert bytes(s.fields["loss_mask"].tolist()) == head["fields"]["loss_mask"] + \
        tail["fields"]["loss_mask"]
    f1.expect(sub.get("x", timeout=10), 10, 4)


def test_a_staged_rid_that_does_not_continue_writes_the_stage_first(pair):
    """The same rid again, but not where its staged row ends (a new request reusing the rid
    after a complete one): never two rows of one rid in one entry, so the stage is written
    first and each arrives on its own."""
    p, sub = pair()
    f1, f2 = Forward(1, 16), Forward(2, 16)
    assert f1.capture(p, [_row("again", 0, 8)], [0], defer=True)
    assert f2.capture(p, [_row("again", 0, 5)], [2], defer=True)
    assert p.stats()["stage_writes"] == 1
    f1.expect(sub.get("again", timeout=10), 0, 8)
    p.flush(timeout_s=10)
    f2.expect(sub.get("again", timeout=10), 2, 5)


def test_a_stage_is_written_before_it_outgrows_its_bound_so_merged_rows_always_fit(pair):
    """A stage bound asked larger than the ring is held to a quarter of it; a capture that
    would take the stage past the bound writes the stage first. Three 94 KiB chunks of one
    sample on a 1 MiB ring: the first two merge into one row, the third goes into the next
    entry; the sample arrives whole, from two rows."""
    p, sub = pair(capacity=1 << 20, stage_bytes=64 << 20)
    fs = [Forward(k, 1500) for k in range(1, 4)]            # 1500 x 64 B = 94 KiB each
    for k, f in enumerate(fs):
        assert f.capture(p, [_row("big", 1500 * k, 1500, last=k == 2)], [0], defer=True)
    assert p.stats()["stage_writes"] == 1
    p.flush(timeout_s=10)
    s = sub.get("big", timeout=30)
    assert s.num_tokens == 4500 and s.meta["chunks"] == 2
    for k, f in enumerate(fs):
        assert torch.equal(s.tensors["layer_3"][1500 * k:1500 * (k + 1)], f.aux[:, :H])
    assert p.stats()["next_seq"] == 2 and p.stats().get("dropped", 0) == 0


def test_an_abort_after_staged_rows_comes_after_them_in_the_ring(pair):
    """A retraction: the old attempt's first chunk is staged, then aborted with a restart,
    then the new attempt runs whole. Were the staged chunk written after the abort, it would
    join the new attempt (rejected as tokens delivered twice) instead of being discarded."""
    p, sub = pair()
    old, new = Forward(1, 8), Forward(2, 16)
    assert old.capture(p, [_row("re", 0, 8, last=False)], [0], defer=True)
    p.abort("re", "retracted", restart=True)
    assert new.capture(p, [_row("re", 0, 16)], [0], defer=True)
    p.flush(timeout_s=10)
    new.expect(sub.get("re", timeout=10), 0, 16)
    assert sub.stats()["restarted"] == 1


def test_an_immediate_capture_after_staged_rows_comes_after_them(pair):
    p, sub = pair()
    f1, f2 = Forward(1, 8), Forward(2, 8)
    assert f1.capture(p, [_row("s", 0, 8)], [0], defer=True)
    assert f2.capture(p, [_row("i", 0, 8)], [0])            # not deferred
    p.flush(timeout_s=10)
    s, i = sub.get("s", timeout=10), sub.get("i", timeout=10)
    assert s.meta["seqs"] == [0] and i.meta["seqs"] == [1]


def test_the_publisher_thread_writes_a_stage_left_behind_when_captures_stop(pair):
    p, sub = pair(interval=0.02, heartbeat_interval_s=0.02)
    f = Forward(1, 8)
    t0 = time.monotonic()
    assert f.capture(p, [_row("idle", 0, 8)], [0], defer=True)
    f.expect(sub.get("idle", timeout=10), 0, 8)
    assert time.monotonic() - t0 < 5


def test_a_stage_past_its_interval_is_written_by_the_next_call(pair):
    p, sub = pair(interval=0.0001, heartbeat_interval_s=2.0)
    f1, f2 = Forward(1, 8), Forward(2, 8)
    assert f1.capture(p, [_row("first", 0, 8)], [0], defer=True)
    deadline = time.monotonic() + 5
    while not p._stage.due() and time.monotonic() < deadline:
        pass                                                # the interval is 0.1 ms
    assert f2.capture(p, [_row("second", 0, 8)], [0], defer=True)
    assert p.stats()["stage_writes"] == 1
    f1.expect(sub.get("first", timeout=10), 0, 8)
    p.publish_completed()                                   # due again by now
    f2.expect(sub.get("second", timeout=10), 0, 8)


def test_close_writes_the_staged_rows_and_announces_them(pair):
    p, sub = pair()
    f = Forward(1, 8)
    assert f.capture(p, [_row("last", 0, 8)], [0], defer=True)
    p.close()
    f.expect(sub.get("last", timeout=10), 0, 8)


def test_a_full_ring_drops_the_whole_staged_entry_and_names_every_rid(pair):
    """Two forwards staged as one 312 KiB entry while a borrowed sample holds all but ~205
    KiB of the ring: the entry is dropped whole and every rid in it named; the dropped
    sample's later chunk is discarded, never delivered short."""
    p, sub = pair(capacity=2 << 20, stage_bytes=512 << 10, sub_kw={"zero_copy": True})
    big = Forward(1, 24800)                       # 24800 x 64 B = 1.51 MiB
    assert big.capture(p, [_row("hold", 0, 24800)], [0])
    held = sub.get("hold", timeout=10)            # borrowed, not released: holds the ring
    f, g = Forward(2, 3000), Forward(3, 2000)
    assert f.capture(p, [_row("d1", 0, 1500), _row("d2", 0, 1200, last=False)], [0, 1500],
                     defer=True)
    assert g.capture(p, [_row("d3", 0, 2000)], [0], defer=True)
    p.flush(timeout_s=10)
    assert p.stats()["dropped"] == 3 and p.stats()["stage_writes"] == 1
    for rid in ("d1", "d2", "d3"):
        with pytest.raises(SampleDroppedError, match="ring_full"):
            sub.get(rid, timeout=10)
    held.release()
    assert f.capture(p, [_row("d2", 1200, 300)], [2700], defer=True)
    assert f.capture(p, [_row("ok", 0, 10)], [0])
    f.expect(sub.get("ok", timeout=10), 0, 10)
    with pytest.raises(SampleDroppedError):
        sub.get("d2", timeout=1)


def test_a_staged_forward_too_large_for_the_ring_is_split_and_every_row_arrives_or_is_named(
        pair):
    """One deferred forward whose three rows (~312 KiB each) can never fit the 1 MiB ring as
    one entry: it is split by rows and written piece by piece; the pieces that find room
    arrive exact, the others are dropped and named by rid."""
    p, sub = pair(capacity=1 << 20)
    f = Forward(1, 15000)
    rids = ["r0", "r1", "r2"]
    assert f.capture(p, [_row(r, 0, 5000) for r in rids], [0, 5000, 10000], defer=True)
    p.flush(timeout_s=10)
    arrived, named = [], []
    for k, rid in enumerate(rids):
        try:
            s = sub.get(rid, timeout=10)
        except SampleDroppedError as exc:
            assert "ring_full" in str(exc)
            named.append(rid)
            continue
        f.expect(s, 5000 * k, 5000)
        arrived.append(rid)
    assert arrived[:1] == ["r0"]                  # the first piece always fits
    assert sorted(arrived + named) == rids
    assert p.stats().get("dropped", 0) == len(named) and p.stats()["next_seq"] == 3


def test_device_token_ids_or_no_interval_capture_at_once(pair):
    p, sub = pair()
    f = Forward(1, 8)
    ids = torch.arange(8)
    assert p.capture_rows([_row("t", 0, 8)], [0], [f.aux], layers=[3, 5], token_ids=ids,
                          layer_map=[[0, 0], [0, H]], hidden=H, defer=True)
    assert p.stats()["next_seq"] == 1 and not p.stats().get("staged_rows")
    q = Producer(p.endpoint.replace(".sock", "-b.sock"), producer_id="nostage",
                 capacity=1 << 20)
    with q:
        assert f.capture(q, [_row("n", 0, 8)], [0], defer=True)
        assert q.stats()["next_seq"] == 1


def test_an_abort_of_a_sample_whose_chunk_is_staged_reports_it_incomplete(pair):
    p, sub = pair()
    f = Forward(1, 8)
    assert f.capture(p, [_row("ab", 0, 8, last=False)], [0], defer=True)
    p.abort("ab", "client went away")
    with pytest.raises(IncompleteSampleError, match="client went away"):
        sub.get("ab", timeout=10)


def _add(st, key, g, rows, now):
    maps = [_row(rid, start, n, last) for rid, start, n, last in rows]
    st.add(key, StagedGroup(("host",), [], 10), maps, [0] * len(maps),
           [(None, 0, m["token_count"]) for m in maps], now=now)
    return maps


def test_a_stage_refuses_another_layout_or_a_rid_that_does_not_continue_and_merges_one_that_does():
    st = Stage(interval_s=1.0, max_bytes=25)
    assert not st and st.accepts("k", [_row("a", 0, 1)]) and not st.due()
    _add(st, "k", 0, [("a", 0, 4, False), ("b", 0, 2, True)], now=100.0)
    assert st.accepts("k", [_row("c", 0, 1)])
    assert st.accepts("k", [_row("a", 4, 3)])                 # continues a
    assert not st.accepts("k", [_row("a", 5, 3)])             # a gap
    assert not st.accepts("k", [_row("b", 2, 1)])             # b was complete
    assert not st.accepts("other", [_row("c", 0, 1)])
    other_extra = _row("a", 4, 3)
    other_extra["extra"] = {"attempt": 1}
    assert not st.accepts("k", [other_extra])
    _add(st, "k", 1, [("a", 4, 3, True), ("c", 0, 1, True)], now=100.5)
    assert not st.due(now=100.9) and st.due(now=101.0)
    _add(st, "k", 2, [("d", 0, 1, True)], now=100.6)
    assert st.due(now=100.7)                                  # 30 bytes >= 25
    groups, rows = st.take()
    assert len(groups) == 3
    assert [(r.map["rid"], r.map["token_start"], r.map["token_count"], r.map["last"])
            for r in rows] == [("a", 0, 7, True), ("b", 0, 2, True), ("c", 0, 1, True),
                               ("d", 0, 1, True)]
    assert rows[0].pieces == [(0, 0, 4), (1, 0, 3)]
    assert entry_spans(rows) == [(0, 0, 4), (1, 0, 3), (0, 0, 2), (1, 0, 1), (2, 0, 1)]
    assert not st and st.accepts("other", [_row("a", 4, 1)])
