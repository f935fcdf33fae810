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
from hscapture.sample import layer_name

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


def _row_by_row(sub: Subscriber) -> Subscriber:
    """``sub``, its batch entries taken one RowView at a time (Delivery._on_row), as before
    whole rows were read from their entry's columns."""
    d = sub._delivery

    def on_batch(src, record, entry):
        for rv in entry.row_views(record.payload):
            d._on_row(src, record, entry.meta, d._shape(entry.meta), rv)
    d._on_batch = on_batch
    return sub


@pytest.mark.parametrize("zero_copy,dtype,turn_away", [
    (False, torch.bfloat16, None), (False, torch.float16, None), (False, torch.float32, None),
    (False, torch.float8_e4m3fn, None), (True, torch.bfloat16, None),
    (False, torch.bfloat16, "rid_filter"), (False, torch.bfloat16, "skip_rid")])
def test_a_sample_is_the_same_whichever_way_its_entry_was_read(endpoint, zero_copy, dtype,
                                                              turn_away):
    """Whole rows are read from their entry's columns and arrays (Delivery._on_batch; owned
    ones copied natively, Entry.row_capsules, but fp8), the other rows one by one; the same
    entries read one RowView at a time give the same samples: tensors (names, dtype, shape,
    layout, bytes), token ids, fields, meta, and the same counts, with a rid filter or
    skip_rid too. Two layers side by side in one block, a
    third in a block of its own; whole rows of one and several tokens, with extra and
    fields, beside a sample in two chunks of two entries and a prefix-cache hit."""
    hidden = 4
    t = 5
    wide = torch.arange(t * 2 * hidden, dtype=torch.float32).reshape(t, 2 * hidden).to(dtype)
    last = (100 + torch.arange(t * hidden, dtype=torch.float32)).reshape(t, hidden).to(dtype)
    ids = torch.arange(1000, 1000 + t, dtype=torch.int32)
    kw = dict(layers=[2, 5, 7], layer_kinds=["residual", "residual", "final_norm"],
              token_ids=ids, layer_map=[[0, 0], [0, hidden], [1, 0]], hidden=hidden)
    away = {turn_away: (lambda rid: rid != "three") if turn_away == "rid_filter"
            else (lambda rid: rid == "three")} if turn_away else {}
    want = ["one", "split", "tail"] + ([] if turn_away else ["three"])
    with Producer(endpoint, producer_id="paths", capacity=8 << 20) as p, \
            Subscriber(endpoint, zero_copy=zero_copy, **away) as direct, \
            _row_by_row(Subscriber(endpoint, zero_copy=zero_copy, **away)) as by_row:
        for sub in (direct, by_row):
            sub.wait_ready(10)
        p.wait_for_consumers(2, 10)
        assert p.capture_batch([Row("one", 0, 1, extra={"t": 1, "ph": "x"}),
                                Row("three", 1, 3, fields={"loss_mask": b"\x00\x01\x01"}),
                                Row("split", 4, 1, last=False)], [wide, last], **kw)
        assert p.capture_batch([Row("split", 0, 2, token_start=1, extra={"k": "v"}),
                                Row("cached", 2, 2, token_start=3, cached_prefix=3),
                                Row("tail", 4, 1, fields={"m": b"\x07"})], [wide, last], **kw)
        p.flush()
        got = {}
        for name, sub in (("direct", direct), ("by_row", by_row)):
            got[name] = {}
            deadline = time.monotonic() + 10
            while len(got[name]) < len(want) and time.monotonic() < deadline:
                s = sub.poll(timeout=0.2)
                if s is not None:
                    got[name][s.rid] = s
            sub.pump(0.1)
        assert sorted(got["direct"]) == sorted(got["by_row"]) == sorted(want)
        for rid, a in got["direct"].items():
            b = got["by_row"][rid]
            for k in ("producer_id", "epoch", "num_tokens", "layers", "layer_kinds", "dtype",
                      "hidden", "meta", "borrowed"):
                assert getattr(a, k) == getattr(b, k), (rid, k)
            for x, y in [(a.token_ids, b.token_ids), *zip(a.tensors.values(),
                                                          b.tensors.values()),
                         *zip(a.fields.values(), b.fields.values())]:
                assert (x.dtype, x.shape, x.stride()) == (y.dtype, y.shape, y.stride()), rid
                assert (x.is_contiguous() or zero_copy) and not x.requires_grad, rid
                assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), rid
            assert list(a.tensors) == list(b.tensors) == ["layer_2", "layer_5", "final_norm"]
            assert list(a.fields) == list(b.fields)
        one = got["direct"]["one"]
        assert torch.equal(one.tensors["layer_5"].view(torch.uint8),
                           wide[0:1, hidden:].contiguous().view(torch.uint8))
        assert torch.equal(one.tensors["final_norm"].view(torch.uint8),
                           last[0:1].view(torch.uint8))
        assert one.meta["extra"] == {"t": 1, "ph": "x"} and one.token_ids.tolist() == [1000]
        if not turn_away:
            assert got["direct"]["three"].fields["loss_mask"].tolist() == [0, 1, 1]
        assert torch.equal(got["direct"]["split"].tensors["layer_2"].view(torch.uint8),
                           torch.cat([wide[4:5, :hidden], wide[0:2, :hidden]]).view(torch.uint8))
        sa, sb = direct.stats(), by_row.stats()
        for k in ("samples", "sample_bytes", "entries", "filtered", "already_written"):
            assert sa.get(k) == sb.get(k), k
        assert (sa.get("filtered"), sa.get("already_written")) == (
            (1, None) if turn_away == "rid_filter" else (None, 1) if turn_away else (None, None))
        assert sa["skipped"] == sb["skipped"]
        assert sa["incomplete"] == sb["incomplete"] and "cached" in sa["incomplete"]
        for s in [*got["direct"].values(), *got["by_row"].values()]:
            s.release()


@pytest.mark.parametrize("layers", [[5], [3, 7, 11]])
def test_an_owned_sample_equals_the_borrowed_and_the_expected_reading_of_the_same_row(
        endpoint, layers):
    # Owned samples of whole rows are built on the entry's fast path (one native copy per
    # entry, no per-row checks left to make); a zero-copy subscriber and one that expect()s
    # every rid read the same rows the general way. All three must hand out equal samples:
    # every field, tensor bytes and dtype, meta, per-token fields, list types
    hidden, n = 8, 6
    counts = [1, 3, 2, 5, 1, 4]
    starts = [sum(counts[:i]) for i in range(n)]
    tokens = sum(counts)
    block = torch.randn(tokens, hidden * len(layers)).to(torch.bfloat16)
    ids = torch.arange(500, 500 + tokens, dtype=torch.int32)
    maps = [{"rid": f"e{i}", "token_start": 0, "token_count": c, "last": True,
             "cached_prefix": 0, "extra": {"attempt": 0, "i": i, "ph": "x" * i},
             "fields": {"loss_mask": bytes((i + k) % 2 for k in range(c))} if i % 2 else {}}
            for i, c in enumerate(counts)]
    with Producer(endpoint, producer_id="eqv", capacity=8 << 20) as p, \
            Subscriber(endpoint) as owned, Subscriber(endpoint, zero_copy=True) as borrowed, \
            Subscriber(endpoint) as checked:
        for s in (owned, borrowed, checked):
            s.wait_ready(10)
        p.wait_for_consumers(3, 10)
        for m in maps:
            checked.expect(m["rid"], m["token_count"])
        assert p.capture_rows(maps, starts, [block], layers=layers, token_ids=ids,
                              layer_map=[[0, i * hidden] for i in range(len(layers))],
                              hidden=hidden)
        p.flush()
        for i, m in enumerate(maps):
            a, b, c = (s.get(m["rid"], timeout=10) for s in (owned, borrowed, checked))
            assert not a.borrowed and b.borrowed and not c.borrowed
            rows = slice(starts[i], starts[i] + counts[i])
            for x in (a, b, c):
                assert (x.rid, x.producer_id, x.num_tokens, x.dtype, x.hidden) == \
                    (m["rid"], "eqv", counts[i], "bfloat16", hidden)
                assert x.layers == layers and type(x.layers) is list
                assert x.layer_kinds == ["residual"] * len(layers)
                assert type(x.layer_kinds) is list
                assert x.token_ids.dtype == torch.int32 and torch.equal(x.token_ids, ids[rows])
                assert list(x.tensors) == [layer_name(l, "residual") for l in layers]
                for j, t in enumerate(x.tensors.values()):
                    assert t.dtype == torch.bfloat16 and t.shape == (counts[i], hidden)
                    assert torch.equal(t, block[rows, j * hidden:(j + 1) * hidden])
                assert {k: bytes(v.tolist()) for k, v in x.fields.items()} == m["fields"]
                assert all(v.dtype == torch.uint8 for v in x.fields.values())
                assert x.meta == a.meta and x.meta["extra"] == m["extra"]
                assert x.meta["chunks"] == 1 and x.meta["cached_prefix"] == 0
                assert x.epoch == a.epoch
            assert a.layers is not c.layers and a.layers is not b.layers   # each its own
            b.release()
