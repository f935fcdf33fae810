"""Live streaming (``hscapture.stream``) when its producer dies: a real producer process,
SIGKILLed mid-stream with chunked samples in flight. The feed goes on until it is idle. Then
every sample the producer started is either handed out once, exact, or named in
``report()`` (incomplete: "producer stopped"), and nothing is still in flight."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_support import ProducerProc, check_exact, requests  # noqa: E402

import hscapture  # noqa: E402


@pytest.mark.parametrize("interval", [0.0, 0.02], ids=["publish-every-capture", "every-20ms"])
def test_a_producer_killed_mid_stream_leaves_every_started_sample_delivered_or_reported(
        endpoint, tmp_path, interval):
    reqs = requests(100_000, seed=31, tokens=(8, 40), chunks=(4, 8))
    sizes = {r: t for r, t, _ in reqs}
    p = ProducerProc({"endpoint": endpoint, "requests": reqs, "producer_id": "sk",
                      "consumers": 1, "interleave": 8, "capacity": 2 << 20,
                      "progress_every": 200, "publish_interval_s": interval}, tmp_path)
    try:
        # idle_timeout_s past producer_timeout_s: the dead producer's partial samples are
        # failed (reported) before the feed stops on idle
        feed = hscapture.stream(endpoint, idle_timeout_s=4.0, prefetch=8,
                                producer_timeout_s=1.0)
        delivered: list[str] = []
        killed = False
        for s in feed:
            check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
            delivered.append(s.rid)
            if not killed and p.poll_event("progress"):
                p.kill()
                p.wait(10)
                killed = True
        assert killed, "the feed went idle before the producer had made progress"
        rep = feed.report()
        assert rep["stopped"] == "idle_timeout", rep["stopped"]
        assert len(delivered) == len(set(delivered)) == rep["delivered"]
        assert not rep["in_flight"] and not rep["undelivered"], rep
        assert rep["incomplete"], "the kill hit no sample in flight"
        assert all("producer stopped" in why for why in rep["incomplete"].values())
        started = set(delivered) | set(rep["dropped"]) | set(rep["incomplete"])
        assert not set(delivered) & set(rep["incomplete"])
        # the producer had captured 200 rows (chunks) when it was killed: each of their
        # samples is delivered or reported
        assert delivered and len(started) >= 200 // 8
    finally:
        p.stop()
