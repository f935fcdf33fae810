"""StreamDataset / stream: live samples from a real producer process into a training loop."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch.utils.data import DataLoader

import hscapture
from hscapture.errors import CaptureConfigError
from hscapture.stream import StreamDataset
from capture_support import assert_sample_exact, read_events, start_producer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_from_stream.py"
HIDDEN, LAYERS = 64, [2, 5, 7]


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (NaN-safe equality), as a flat uint8 tensor."""
    return t.contiguous().view(-1).view(torch.uint8)


def spec(endpoint, requests, **over):
    out = {"endpoint": endpoint, "hidden": HIDDEN, "layers": LAYERS, "requests": requests,
           "threads": 1}
    out.update(over)
    return out


@contextlib.contextmanager
def warnings_said() -> Iterator[list[str]]:
    """The messages hscapture logs at WARNING and above meanwhile (its own handler: the CLI's
    tests may stop the logger's propagation to pytest's)."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())   # type: ignore
    logger = logging.getLogger("hscapture")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def finish(proc):
    try:
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dataloader_yields_every_sample_exact_and_never_holds_more_than_prefetch(
        endpoint, tmp_path):
    requests = [[f"s{i}", 1 + 53 * i % 300, 64] for i in range(30)]   # multi-chunk ones too
    proc = start_producer(spec(endpoint, requests, threads=3, policy="wait"), tmp_path)
    try:
        ds = StreamDataset(endpoint, max_samples=30, idle_timeout_s=20, prefetch=3)
        seen = {}
        for item in DataLoader(ds, batch_size=None, num_workers=0):
            assert ds._feed.buffered <= 3
            seen[item["rid"]] = item
        by_rid = {r[0]: r[1] for r in requests}
        assert sorted(seen) == sorted(by_rid)
        for rid, item in seen.items():
            sample = hscapture.Sample(rid, "test", 0, by_rid[rid], item["input_ids"],
                                      {f"layer_{L}": item[f"layer_{L}"] for L in LAYERS},
                                      LAYERS, ["residual"] * 3, "bfloat16", HIDDEN)
            assert_sample_exact(sample, rid, by_rid[rid], HIDDEN, LAYERS)
            assert item["input_ids"].dtype == torch.int64
            assert "loss_mask" not in item          # this producer attaches no fields
        assert 1 <= ds.max_buffered <= 3
        report = ds.report()
        assert report["delivered"] == 30 and report["stopped"] == "max_samples"
        assert not (report["dropped"] or report["incomplete"] or report["rejected"]
                    or report["lost"] or report["undelivered"])
        assert ds._feed.subscriber is None            # closed once exhausted
    finally:
        finish(proc)


def test_slow_trainer_fills_the_ring_and_every_drop_is_reported_by_rid(endpoint, tmp_path):
    # 40 samples of 200 tokens x 3 layers x 64 bf16 = 77 KB each, a 1 MiB ring: a trainer that
    # stops reading after one sample leaves the ring full and the producer must drop
    requests = [[f"d{i}", 200, 200] for i in range(40)]
    proc = start_producer(spec(endpoint, requests, capacity=1 << 20, policy="drop"), tmp_path)
    try:
        # the producer is up before the feed's idle clock runs (it captures once we attach)
        read_events(proc, "ready")
        ds = StreamDataset(endpoint, idle_timeout_s=3, prefetch=2)
        it = iter(ds)
        first = [next(it)["rid"]]
        dropped = read_events(proc, "dropped", timeout=60)["rids"]  # producer done meanwhile
        assert dropped, "the ring never filled: the test proves nothing"
        assert ds._feed.buffered <= 2
        rest = [item["rid"] for item in it]
        got = first + rest
        report = ds.report()
        assert sorted(report["dropped"]) == sorted(dropped)
        assert all("ring_full" in why for why in report["dropped"].values())
        assert sorted(got + dropped) == sorted(r[0] for r in requests)   # once or reported
        assert report["stopped"] == "idle_timeout" and report["delivered"] == len(got)
        assert ds.max_buffered <= 2
    finally:
        finish(proc)


def test_dataloader_workers_are_refused_with_a_clear_error(endpoint):
    ds = StreamDataset(endpoint, max_samples=1, idle_timeout_s=1)
    with pytest.raises(CaptureConfigError, match="num_workers=0"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=2)))


def test_a_stream_that_never_met_a_producer_says_so_when_it_stops(endpoint):
    # a wrong endpoint, or a server without capture, looked like a quiet server: an empty
    # feed and a report without a word (newcomer walk, 2026-12-05)
    with warnings_said() as said:
        feed = hscapture.stream(endpoint, idle_timeout_s=0.3)
        assert list(feed) == []
    assert feed.report()["stopped"] == "idle_timeout"
    assert any("no producer ever announced itself" in m and endpoint in m for m in said), said


def test_stream_stops_when_idle_and_closes_its_subscriber(endpoint):
    s = hscapture.stream(endpoint, idle_timeout_s=0.2)
    assert list(s) == []
    assert s.subscriber is None and s.report()["stopped"] == "idle_timeout"


def test_abandoned_iterator_closes_the_subscriber_and_reports_what_it_held(endpoint, tmp_path):
    requests = [[f"g{i}", 10, 10] for i in range(12)]
    proc = start_producer(spec(endpoint, requests, policy="wait"), tmp_path)
    try:
        ds = StreamDataset(endpoint, idle_timeout_s=20, prefetch=4)
        it = iter(ds)
        assert next(it)["rid"] == "g0"
        assert read_events(proc, "dropped", timeout=60)["rids"] == []
        sub = ds._feed.subscriber
        deadline = time.monotonic() + 20
        while ds._feed.buffered + sub.stats()["ready"] < 11:   # all received, none handed out
            assert time.monotonic() < deadline, sub.stats()
            sub.pump(0.05)
        del it
        gc.collect()
        report = ds.report()
        assert ds._feed.subscriber is None and report["stopped"] == "closed"
        # the samples received but never handed out are named, not silently lost
        assert report["delivered"] == 1
        assert sorted(report["undelivered"]) == sorted(f"g{i}" for i in range(1, 12))
    finally:
        finish(proc)


def test_a_stream_stopped_early_names_every_sample_still_unread_in_the_ring(endpoint, tmp_path):
    # max_samples stops an anonymous stream with most of what was committed still in the
    # ring, unread: each of those is named in the report (undelivered, or in flight), never
    # gone in silence. Until 2026-12-05 only the samples already read were named.
    requests = [[f"u{i}", 12, 4 if i % 3 == 0 else 64] for i in range(50)]   # some chunked
    proc = start_producer(spec(endpoint, requests, policy="wait", hold=True), tmp_path)
    try:
        feed = hscapture.stream(endpoint, max_samples=5, idle_timeout_s=20, prefetch=2)
        it = iter(feed)
        handed = [next(it).rid]
        assert read_events(proc, "dropped", timeout=60)["rids"] == []   # all 50 committed
        handed += [s.rid for s in it]
        report = feed.report()
        assert report["stopped"] == "max_samples" and len(handed) == 5
        named = set(report["undelivered"]) | set(report["in_flight"])
        assert named | set(handed) == {r for r, _, _ in requests}, report
        assert not named & set(handed)
    finally:
        finish(proc)


def test_a_loop_that_breaks_out_of_a_stream_gets_every_sample_it_left_named_in_the_log(
        endpoint, tmp_path):
    # `for s in hscapture.stream(...): ... break` (or a training step that raises) drops the
    # iterator: the feed is collected, and its report, the only place that named what it
    # never handed out, is read by nobody. Until 2026-12-05 those samples went in silence;
    # now every one of them is named in a warning.
    requests = [[f"b{i}", 12, 64] for i in range(30)]
    proc = start_producer(spec(endpoint, requests, policy="wait", hold=True), tmp_path)
    try:
        def train() -> list[str]:
            got: list[str] = []
            for sample in hscapture.stream(endpoint, idle_timeout_s=20, prefetch=2):
                got.append(sample.rid)
                if len(got) == 1:     # every sample committed before the loop goes on
                    assert read_events(proc, "dropped", timeout=60)["rids"] == []
                if len(got) == 3:
                    break
            return got

        with warnings_said() as messages:
            handed = train()
            gc.collect()
        said = "\n".join(m for m in messages if "stream stopped (garbage_collected)" in m)
        assert len(handed) == 3 and "with 27 sample(s) not handed out" in said, said
        named = set(re.findall(r"\bb\d+\b", said))
        assert named == {r for r, _, _ in requests} - set(handed), said
    finally:
        finish(proc)


def test_an_anonymous_subscriber_closed_early_names_every_sample_it_never_handed_out(
        endpoint, tmp_path):
    # A plain Subscriber read a few samples and closed with the rest committed, some ready,
    # most unread in the ring: close() names each in stats()["undelivered"] (in_flight keeps
    # the half-assembled) and in a warning. Until 2026-12-05 only skim_unread(), called by
    # hand before close(), named them: a user who just closed lost them in silence.
    requests = [[f"c{i}", 12, 4 if i % 4 == 0 else 64] for i in range(40)]
    proc = start_producer(spec(endpoint, requests, policy="wait", hold=True), tmp_path)
    try:
        sub = hscapture.Subscriber(endpoint)
        sub.wait_ready(timeout=30)
        handed: list[str] = []
        while len(handed) < 3:
            s = sub.poll(timeout=10)
            assert s is not None
            handed.append(s.rid)
        assert read_events(proc, "dropped", timeout=60)["rids"] == []   # all 40 committed
        with warnings_said() as said:
            sub.close()
        st = sub.stats()
        named = set(st["undelivered"]) | set(st["in_flight"])
        assert named | set(handed) == {r for r, _, _ in requests}, st
        assert not named & set(handed) and len(st["undelivered"]) == len(set(st["undelivered"]))
        assert any("never handed out" in m for m in said), said
        sub.close()                          # a second close names nothing twice
        assert sub.stats()["undelivered"] == st["undelivered"]
    finally:
        finish(proc)


def test_an_anonymous_subscriber_dropped_without_close_names_every_sample_in_the_log(
        endpoint, tmp_path):
    # No close(): the subscriber is collected with its handle, and stats() can no longer be
    # read. Until 2026-12-05 nothing was said of the samples it never handed out; now it
    # closes itself and its warning names every one of them.
    requests = [[f"n{i}", 12, 64] for i in range(30)]
    proc = start_producer(spec(endpoint, requests, policy="wait", hold=True), tmp_path)
    try:
        def use() -> list[str]:
            sub = hscapture.Subscriber(endpoint)
            sub.wait_ready(timeout=30)
            got: list[str] = []
            while len(got) < 3:
                s = sub.poll(timeout=10)
                assert s is not None
                got.append(s.rid)
            assert read_events(proc, "dropped", timeout=60)["rids"] == []   # all committed
            return got

        with warnings_said() as messages:
            handed = use()
            gc.collect()
        said = "\n".join(m for m in messages if "never handed out" in m)
        assert set(re.findall(r"\bn\d+\b", said)) == \
            {r for r, _, _ in requests} - set(handed), said
    finally:
        finish(proc)


def test_an_anonymous_subscriber_that_filters_rids_names_only_the_ones_it_wanted(
        endpoint, tmp_path):
    requests = [[f"{'keep' if i % 2 else 'skip'}{i}", 6, 6] for i in range(20)]
    proc = start_producer(spec(endpoint, requests, policy="wait", hold=True), tmp_path)
    try:
        sub = hscapture.Subscriber(endpoint, rid_filter=lambda r: r.startswith("keep"))
        sub.wait_ready(timeout=30)
        first = sub.poll(timeout=30)
        assert first is not None and first.rid.startswith("keep")
        assert read_events(proc, "dropped", timeout=60)["rids"] == []
        sub.close()
        assert set(sub.stats()["undelivered"]) == \
            {r for r, _, _ in requests if r.startswith("keep")} - {first.rid}
    finally:
        finish(proc)


def test_a_new_iteration_keeps_the_report_of_the_one_it_ended(endpoint, tmp_path):
    # A second iter() over a StreamDataset ends the first one (one subscription at a time).
    # What the first had not handed out stays named in reports(); until 2026-12-05 report()
    # moved on to the new iteration and those rids were reachable through no public API.
    requests = [[f"e{i}", 6, 6] for i in range(12)]
    proc = start_producer(spec(endpoint, requests, policy="wait", hold=True), tmp_path)
    try:
        ds = StreamDataset(endpoint, idle_timeout_s=20, prefetch=4)
        first = iter(ds)
        handed = [next(first)["rid"]]
        assert read_events(proc, "dropped", timeout=60)["rids"] == []   # all 12 committed
        handed.append(next(first)["rid"])
        second = iter(ds)                      # ends the first iteration, still alive
        earlier, latest = ds.reports()
        assert earlier["stopped"] == "closed" and earlier["delivered"] == 2
        named = set(earlier["undelivered"]) | set(earlier["in_flight"])
        assert named == {r for r, _, _ in requests} - set(handed), earlier
        assert latest is not earlier and ds.report()["delivered"] == 0
        del first, second
    finally:
        finish(proc)


def test_a_sample_its_transform_raised_on_is_named_not_counted_delivered(endpoint, tmp_path):
    # The sample is acknowledged as it is handed out; when the transform then raises, the
    # training loop never sees it: the report names it undelivered (until 2026-12-05 it
    # counted as delivered, and a durable stream lost it without a word).
    requests = [[f"t{i}", 4, 4] for i in range(6)]
    proc = start_producer(spec(endpoint, requests, policy="wait"), tmp_path)

    def transform(item):
        if item["rid"] == "t2":
            raise ValueError("a bad sample for this trainer")
        return item

    try:
        ds = StreamDataset(endpoint, idle_timeout_s=20, prefetch=2, transform=transform)
        seen = []
        with pytest.raises(ValueError, match="bad sample"):
            for item in ds:
                seen.append(item["rid"])
        assert seen == ["t0", "t1"]
        report = ds.report()
        assert report["delivered"] == 2 and report["undelivered"][0] == "t2", report
    finally:
        finish(proc)


def test_plain_stream_yields_owned_samples_exact(endpoint, tmp_path):
    requests = [[f"p{i}", 5 + i, 4] for i in range(6)]
    proc = start_producer(spec(endpoint, requests, policy="wait"), tmp_path)
    try:
        with hscapture.stream(endpoint, max_samples=6, idle_timeout_s=20, prefetch=2) as s:
            samples = list(s)
        assert [x.rid for x in samples] == [r[0] for r in requests]
        for x, r in zip(samples, requests):
            assert not x.borrowed
            assert_sample_exact(x, r[0], r[1], HIDDEN, LAYERS)
        assert s.report()["delivered"] == 6
    finally:
        finish(proc)


def test_bad_bounds_are_refused():
    with pytest.raises(CaptureConfigError, match="prefetch"):
        StreamDataset("ipc:///tmp/x.sock", prefetch=0)
    with pytest.raises(CaptureConfigError, match="zero_copy"):
        hscapture.stream("ipc:///tmp/x.sock", zero_copy=False)


def test_example_trains_a_draft_head_from_a_live_producer_and_loss_masks_arrive(tmp_path):
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_from_stream as ex
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    out = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "12", "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["losses"]) == 12
    assert result["losses"][-1] < result["losses"][0]
    assert result["report"]["delivered"] == 12 and result["producer_dropped"] == []
    assert not result["report"]["dropped"] and not result["report"]["undelivered"]
    assert "loss" in out.stdout and "not seen:" in out.stdout


def test_loss_masks_and_aux_layers_from_the_example_producer_arrive_exact(endpoint, tmp_path):
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_from_stream as ex
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--produce", "--endpoint", endpoint,
                             "--requests", "8", "--chunk", "16"], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    try:
        ds = StreamDataset(endpoint, max_samples=8, idle_timeout_s=20, prefetch=2)
        items = list(DataLoader(ds, batch_size=None, num_workers=0))
        plan = dict(ex.request_plan(8))
        assert sorted(i["rid"] for i in items) == sorted(plan)
        for item in items:
            ids, layers, mask = ex.synthetic(item["rid"], plan[item["rid"]])
            assert torch.equal(item["input_ids"], ids)
            assert item["loss_mask"].dtype == torch.int64
            assert torch.equal(item["loss_mask"], mask.to(torch.int64))
            assert item["loss_mask"].sum() < len(ids)      # masked positions exist
            for L, t in zip(ex.AUX_LAYERS, layers):
                assert torch.equal(item[f"layer_{L}"], t)
    finally:
        finish(proc)


# -- device= -----------------------------------------------------------------------------------

def test_device_cpu_hands_out_owned_exact_samples_and_releases_every_ring_slot(
        endpoint, tmp_path):
    requests = [[f"c{i}", 3 + 41 * i % 200, 64] for i in range(10)]   # multi-chunk ones too
    proc = start_producer(spec(endpoint, requests, policy="wait"), tmp_path)
    try:
        s = hscapture.stream(endpoint, max_samples=10, idle_timeout_s=20, prefetch=3,
                             device=torch.device("cpu"))
        assert s.device is None                      # "cpu" is the plain host path
        got = []
        for x in s:
            assert not x.borrowed and x.released     # an owned copy, its slot given back
            assert x.token_ids.device.type == "cpu"
            assert s.held <= 3
            got.append(x)
        assert [x.rid for x in got] == [r[0] for r in requests]
        for x, r in zip(got, requests):
            assert_sample_exact(x, r[0], r[1], HIDDEN, LAYERS)
        report = s.report()
        assert report["delivered"] == 10 and not report["undelivered"]
    finally:
        finish(proc)


@pytest.mark.parametrize("device, found", [
    ("gpu:0", "gpu:0"), ("meta", "'meta' is not supported"), ("cuda:x", "expected None, 'cpu'"),
    ("cuda:99" if torch.cuda.is_available() else "cuda", "expected a" )])
def test_an_invalid_device_is_refused_with_a_typed_error_before_anything_attaches(
        endpoint, device, found):
    with pytest.raises(CaptureConfigError, match="device") as exc:
        hscapture.stream(endpoint, device=device)
    assert found in str(exc.value)
    with pytest.raises(CaptureConfigError, match="device"):
        StreamDataset(endpoint, device=device)


def test_the_device_copy_plan_covers_packed_ring_views_with_few_copies_byte_exact(endpoint):
    """The layout a device copy uses, run on the CPU: a batch entry's packed block of three
    layers [T, 3H] becomes ONE straight copy per row (the strided layer views are rebuilt from
    it), the [T, H] block and the token ids straight copies too; only the loss_mask (not ring
    memory) is staged. Every tensor rebuilt from the flat buffer equals the ring's view."""
    from hscapture import Producer, Subscriber
    from hscapture.producer import Row
    from hscapture.stream import plan_copy, run_plan

    h, k, lens = 32, 3, [5, 70, 1, 33]
    T = sum(lens)
    g = torch.Generator().manual_seed(5)
    aux = torch.randn(T, k * h, generator=g).to(torch.bfloat16)
    last = torch.randn(T, h, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 50_000, (T,), generator=g, dtype=torch.int32)
    offs = [sum(lens[:i]) for i in range(len(lens))]
    rows = [Row(f"r{i}", offs[i], lens[i], fields={"loss_mask": bytes([i % 2]) * lens[i]})
            for i in range(len(lens))]
    p = Producer(endpoint, producer_id="plan", capacity=8 << 20, full_policy="wait",
                 wait_timeout_s=10)
    sub = Subscriber(endpoint, zero_copy=True)
    try:
        sub.wait_ready(timeout=20)
        assert p.capture_batch(rows, [aux, last], layers=[1, 2, 3, 9],
                               layer_kinds=["residual"] * 3 + ["final_norm"],
                               layer_map=[[0, 0], [0, h], [0, 2 * h], [1, 0]], hidden=h,
                               token_ids=ids)
        p.flush()
        for i, n in enumerate(lens):
            s = sub.get(f"r{i}", timeout=20)
            assert s.borrowed
            lo, size = sub._sources[s.epoch].data_region()
            names = list(s.tensors)
            host = [s.tensors[x] for x in names] + [s.token_ids, s.fields["loss_mask"]]
            assert n == 1 or not host[0].is_contiguous()  # a column slice of the packed block
            plan = plan_copy(host, (lo, lo + size))
            assert plan.direct == [True] * 5 + [False]    # ring views straight, the mask staged
            assert len(plan.spans) <= 3                   # packed rows, last rows, ids
            aux_bytes = n * k * h * 2
            span_of = {off: nbytes for _, nbytes, off in plan.spans}
            assert any(nb >= aux_bytes for nb in span_of.values())
            flat = torch.zeros(plan.total, dtype=torch.uint8)
            out = run_plan(plan, host, flat, None)
            for name, got, want in zip(names + ["ids", "mask"], out, host):
                assert got.is_contiguous() and got.dtype == want.dtype
                assert got.shape == want.shape, f"r{i} {name}"
                assert torch.equal(bytes_of(got), bytes_of(want)), f"r{i} {name}"
            assert torch.equal(out[names.index("layer_2")],
                               aux[offs[i]:offs[i] + n, h:2 * h])
            s.release()
    finally:
        sub.close()
        p.close()


def test_a_sample_aborted_in_the_rows_a_closing_subscriber_reads_is_named_only_as_incomplete(
        endpoint):
    # The close reads the rows still unread (skim_unread): a first chunk followed by the
    # abort of its sample is named by the abort (incomplete), not also as a committed sample
    # never handed out; a retry of the rid after the abort is such a sample. Until
    # 2026-12-06 the aborted rid was named both ways (fault hunt H18)
    x = [torch.ones(4, 32, dtype=torch.bfloat16)] * 2
    ids = torch.arange(4)
    with hscapture.Producer(endpoint, producer_id="skab", capacity=1 << 20,
                            heartbeat_interval_s=0.02) as p:
        sub = hscapture.Subscriber(endpoint)
        sub.wait_ready(timeout=10)
        p.capture("whole-1", x, layers=[0, 1], token_ids=ids)
        p.capture("ab", x, layers=[0, 1], token_ids=ids, is_last_chunk=False)
        p.abort("ab", "client went away")
        p.capture("ab", x, layers=[0, 1], token_ids=ids)                 # its retry, whole
        p.capture("cut", x, layers=[0, 1], token_ids=ids, is_last_chunk=False)
        p.abort("cut", "client went away")
        p.capture("whole-2", x, layers=[0, 1], token_ids=ids)
        p.flush()
        sub.close()
        st = sub.stats()
        assert st["undelivered"] == ["whole-1", "ab", "whole-2"], st
        assert set(st["incomplete"]) == {"ab", "cut"}, st
