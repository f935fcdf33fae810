"""The benchmarks' arithmetic (benchmarks/_stats.py): properties that every figure relies on."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import _stats  # noqa: E402

values = st.lists(st.floats(min_value=1e-6, max_value=1e9, allow_nan=False,
                            allow_infinity=False), min_size=1, max_size=40)
pairs = st.integers(min_value=1, max_value=30).flatmap(
    lambda n: st.tuples(*(st.tuples(st.floats(1e-3, 1e6), st.floats(1e-3, 1e6))
                          for _ in range(n))))


@given(values)
def test_median_lies_within_min_max(xs):
    lo, hi = _stats.spread(xs)
    assert lo <= _stats.median(xs) <= hi


@given(values, st.floats(0, 100))
def test_percentile_is_one_of_the_values_and_bounded(xs, q):
    p = _stats.percentile(xs, q)
    assert p in xs
    assert min(xs) <= p <= max(xs)
    assert _stats.percentile(xs, 0) == min(xs)
    assert _stats.percentile(xs, 100) == max(xs)


@given(values, st.floats(0, 100), st.floats(0, 100))
def test_percentile_is_monotone_in_q(xs, q1, q2):
    lo, hi = sorted((q1, q2))
    assert _stats.percentile(xs, lo) <= _stats.percentile(xs, hi)


def test_percentile_nearest_rank_of_a_known_list():
    xs = list(range(1, 101))  # 1..100
    assert _stats.percentile(xs, 50) == 50
    assert _stats.percentile(xs, 99) == 99
    assert _stats.percentile(xs, 99.5) == 100


@settings(max_examples=60, deadline=None)
@given(values, st.integers(0, 1000))
def test_bootstrap_interval_of_median_is_inside_spread_and_deterministic(xs, seed):
    lo, hi = _stats.bootstrap_ci(xs, seed=seed, n_boot=300)
    assert min(xs) <= lo <= hi <= max(xs)
    assert (lo, hi) == _stats.bootstrap_ci(xs, seed=seed, n_boot=300)


@given(st.floats(1e-3, 1e6), st.integers(1, 20))
def test_bootstrap_interval_of_constant_values_is_a_point(c, n):
    assert _stats.bootstrap_ci([c] * n, n_boot=200) == (c, c)


def test_bootstrap_interval_narrows_with_more_repetitions():
    import random

    rng = random.Random(1)
    few = [1 + rng.gauss(0, 0.05) for _ in range(5)]
    many = [1 + rng.gauss(0, 0.05) for _ in range(500)]
    w_few = _stats.bootstrap_ci(few, n_boot=500)
    w_many = _stats.bootstrap_ci(many, n_boot=500)
    assert w_many[1] - w_many[0] < w_few[1] - w_few[0]


@given(pairs, st.floats(0.01, 100))
def test_paired_ratios_scale_with_the_candidate(ps, k):
    cand = [c for c, _ in ps]
    base = [b for _, b in ps]
    r = _stats.paired_ratios(cand, base)
    rk = _stats.paired_ratios([c * k for c in cand], base)
    assert all(math.isclose(b, a * k, rel_tol=1e-9) for a, b in zip(r, rk))
    assert all(x == 1.0 for x in _stats.paired_ratios(base, base))


def test_paired_ratios_refuse_unpaired_or_nonpositive_baselines():
    with pytest.raises(ValueError, match="as many"):
        _stats.paired_ratios([1, 2], [1])
    with pytest.raises(ValueError, match="positive"):
        _stats.paired_ratios([1], [0])
    with pytest.raises(ValueError, match="finite"):
        _stats.paired_ratios([float("nan")], [1])


@given(values, st.floats(1e-6, 1e9))
def test_goal_met_only_when_every_value_clears_it(xs, goal):
    assert _stats.goal_met(xs, goal, ">=") == all(x >= goal for x in xs)
    assert _stats.goal_met(xs, goal, "<=") == all(x <= goal for x in xs)


def test_goal_missed_when_the_median_clears_but_the_spread_does_not():
    ratios = [0.95, 0.96, 0.97, 0.91, 0.89]        # median 0.95 >= 0.9, min 0.89 < 0.9
    assert _stats.median(ratios) >= 0.9
    assert not _stats.goal_met(ratios, 0.9, ">=")
    assert _stats.goal_met(ratios, 0.89, ">=")
    slow = [0.4, 0.8, 1.2]                          # % slowdowns against a <= 1 % goal
    assert not _stats.goal_met(slow, 1.0, "<=")


def test_goal_never_met_without_values_or_with_nan():
    assert not _stats.goal_met([], 0.0, ">=")
    assert not _stats.goal_met([1.0, float("nan")], 0.0, ">=")
    with pytest.raises(ValueError, match="direction"):
        _stats.goal_met([1.0], 1.0, ">")


@given(pairs)
def test_slowdown_is_zero_for_equal_rates_and_positive_when_slower(ps):
    base = [b for _, b in ps]
    assert all(abs(x) < 1e-9 for x in _stats.slowdown_pct(base, base))
    assert all(x > 0 for x in _stats.slowdown_pct([b * 0.9 for b in base], base))


@given(st.integers(1, 8), st.integers(0, 3))
def test_run_paired_alternates_and_discards_warmup(reps, warmup):
    calls = []

    def cand(i):
        calls.append(("A", i))
        return {"v": 2.0, "rep": i}

    def base(i):
        calls.append(("B", i))
        return {"v": 1.0, "rep": i}

    p = _stats.run_paired(cand, base, reps=reps, warmup=warmup, key="v")
    assert [t for t, _ in calls] == ["A", "B"] * (reps + warmup)
    assert [i for _, i in calls[::2]] == list(range(-warmup, reps))
    assert len(p.candidate) == len(p.baseline) == reps
    assert len(p.warmup_runs) == warmup
    assert all(r["rep"] >= 0 for r in p.candidate_runs + p.baseline_runs)
    assert p.ratios() == [2.0] * reps
    assert p.order[:2 * warmup] == ["warmup:A", "warmup:B"] * warmup


def test_run_paired_abba_swaps_the_first_method_every_repetition():
    seen = []
    _stats.run_paired(lambda i: seen.append("A") or 1.0, lambda i: seen.append("B") or 1.0,
                      reps=4, warmup=0, order="ABBA")
    assert "".join(seen) == "ABBAABBA"


def test_run_alternating_rotates_the_order_and_keeps_counted_reps():
    seen = []
    fns = {n: (lambda n: lambda i: seen.append(n) or i)(n) for n in "XYZ"}
    runs, order = _stats.run_alternating(fns, reps=3, warmup=1)
    assert {n: len(v) for n, v in runs.items()} == {"X": 3, "Y": 3, "Z": 3}
    assert all(min(v) >= 0 for v in runs.values())
    assert "".join(seen) == "ZXY" + "XYZ" + "YZX" + "ZXY"


def test_record_states_its_timed_region_machine_and_commit(tmp_path):
    tr = {"ring": _stats.timed_region(["producer copy", "consumer copy"], ["process start"],
                                      "CLOCK_MONOTONIC")}
    g = _stats.goal_record("ring/memcpy", [0.9, 0.95], 0.8, ">=")
    rec = _stats.write_record(tmp_path / "r.json", benchmark="t", timed_regions=tr,
                              results={"x": 1}, goals=[g])
    on_disk = json.loads((tmp_path / "r.json").read_text())
    assert on_disk == json.loads(json.dumps(rec))
    assert on_disk["timed_region"]["ring"]["inside"] == ["producer copy", "consumer copy"]
    assert on_disk["machine"]["cpus"] >= 1 and on_disk["machine"]["cpu"]
    assert len(on_disk["machine"]["commit"]) == 40
    assert on_disk["goals"][0]["met"] is True and on_disk["goals"][0]["min"] == 0.9


def test_record_without_a_timed_region_is_refused(tmp_path):
    with pytest.raises(ValueError, match="timed_region"):
        _stats.write_record(tmp_path / "r.json", benchmark="t", timed_regions={}, results={})
    with pytest.raises(ValueError, match="inside"):
        _stats.write_record(tmp_path / "r.json", benchmark="t",
                            timed_regions={"x": {"clock": "c", "outside": []}}, results={})
    assert not (tmp_path / "r.json").exists()


# -- the paired-ratio decision: distribution-free interval of the median ------------------

@given(values, st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_median_interval_contains_the_median_and_lies_within_the_values(xs, level):
    lo, hi, cov = _stats.median_ci(xs, level)
    assert min(xs) <= lo <= _stats.median(xs) <= hi <= max(xs)
    assert lo in xs and hi in xs                     # order statistics, never interpolated
    assert 0.0 <= cov <= 1.0


@given(st.floats(1e-3, 1e6), st.integers(1, 60))
def test_median_interval_of_constant_values_is_that_value(c, n):
    lo, hi, _ = _stats.median_ci([c] * n)
    assert lo == hi == c


@given(values)
def test_median_interval_claims_its_level_once_there_are_enough_values(xs):
    _, _, cov = _stats.median_ci(xs, 0.95)
    if len(xs) >= 6:
        assert cov >= 0.95
    else:                                            # the whole range, with its real coverage
        assert cov < 0.95 and _stats.median_ci(xs)[:2] == (min(xs), max(xs))


@settings(max_examples=60)
@given(st.lists(st.floats(0.5, 1.5), min_size=2, max_size=12), st.integers(1, 6))
def test_median_interval_shrinks_as_the_same_values_repeat(xs, k):
    lo1, hi1, _ = _stats.median_ci(xs * k)
    lo2, hi2, _ = _stats.median_ci(xs * (k + 1))
    assert lo1 <= lo2 and hi2 <= hi1


def test_median_interval_matches_the_binomial_table():
    assert _stats.median_ci(list(range(1, 101)))[:2] == (40, 61)     # n=100: x(40)..x(61)
    lo, hi, cov = _stats.median_ci(list(range(1, 21)))               # n=20: x(6)..x(15)
    assert (lo, hi) == (6, 15) and abs(cov - 0.9586) < 1e-3


def test_median_interval_resolves_two_percent_with_enough_pairs_but_not_with_five():
    import random

    rng = random.Random(3)
    noisy = [0.97 * (1 + rng.gauss(0, 0.05)) for _ in range(200)]   # 3 % slower, 5 % noise
    assert not _stats.pair_summary(noisy[:5], 0.98)["met"]
    s = _stats.pair_summary(noisy[:5] + noisy, 0.995)
    assert s["ci"][1] < 0.995 and not s["met"]                       # resolved: below 0.995
    fine = _stats.pair_summary([1 + rng.gauss(0, 0.05) for _ in range(200)], 0.98)
    assert fine["met"] and not fine["met_whole_spread"]              # judged on the CI
    assert "lower end" in fine["judged_on"]


@given(st.lists(st.sampled_from(["on", "on:noop", "on:x"]), min_size=1, max_size=3,
                unique=True), st.integers(1, 9))
def test_abba_order_pairs_every_candidate_with_the_baseline_and_alternates(cands, blocks):
    order = _stats.abba_order(["off", *cands], blocks)
    assert len(order) == blocks * len(cands)
    for j, c in enumerate(cands):
        mine = [(f, s) for _, f, s in order if c in (f, s)]
        assert all("off" in pair for pair in mine) and len(mine) == blocks
        firsts = [f == "off" for f, _ in mine]
        assert firsts == [(b + j) % 2 == 0 for b in range(blocks)]   # ABBA across blocks


@given(st.integers(1, 4), st.integers(1, 12))
def test_abba_order_rotates_the_candidates_so_each_holds_each_position_equally(k, blocks):
    cands = [f"on:{i}" for i in range(k)]
    order = _stats.abba_order(["off", *cands], blocks)
    for b in range(blocks):
        mine = [next(x for x in (f, s) if x != "off") for bb, f, s in order if bb == b]
        assert sorted(mine) == sorted(cands)                  # each candidate once a block
        assert mine == cands[b % k:] + cands[:b % k]          # rotated by one per block
    if blocks % k == 0:
        for c in cands:
            spots = [[next(x for x in (f, s) if x != "off") for bb, f, s in order
                      if bb == b].index(c) for b in range(blocks)]
            assert all(spots.count(p) == blocks // k for p in range(k))


def test_abba_order_refuses_nothing_to_compare():
    with pytest.raises(ValueError, match="candidate"):
        _stats.abba_order(["off"], 3)
    with pytest.raises(ValueError, match="blocks"):
        _stats.abba_order(["off", "on"], 0)


# -- bench_server's bookkeeping (pure functions; the bench itself needs the GPU host) ------

def _bench_server():
    import bench_server
    return bench_server


def test_bench_server_pairs_give_one_ratio_each_and_refuse_a_half_pair():
    bs = _bench_server()
    rounds = [{"pair": "b0-on", "mode": "off", "tok_per_s": 100.0},
              {"pair": "b0-on", "mode": "on", "tok_per_s": 98.0},
              {"pair": "b0-on:noop", "mode": "on:noop", "tok_per_s": 101.0},
              {"pair": "b0-on:noop", "mode": "off", "tok_per_s": 100.0},
              {"pair": "b1-on", "mode": "on", "tok_per_s": 50.0},
              {"pair": "b1-on", "mode": "off", "tok_per_s": 40.0}]
    assert bs.pair_ratios(rounds, "on") == [0.98, 1.25]
    assert bs.pair_ratios(rounds, "on:noop") == [1.01]
    with pytest.raises(ValueError, match="expected one 'off'"):
        bs.pair_ratios(rounds[:2] + [{"pair": "b2-on", "mode": "on", "tok_per_s": 1.0}], "on")


def test_bench_server_account_closes_only_when_every_expected_rid_is_received_or_reported():
    bs = _bench_server()
    expected = {"a": (3, 11), "b": (4, 22), "c": (5, 33), "d": (6, 44)}
    got = {"a": {"n": 3, "crc": 11}, "b": {"n": 4, "crc": 99}}
    reports = {"dropped": {"c": "dropped by producer: ring_full"},
               "incomplete": {"x": "never expected"}, "rejected": {}}
    v = bs.verify(expected, got, reports)
    assert (v["expected"], v["received"], v["n_reported"], v["missing"]) == (4, 2, 1, 1)
    assert v["missing_rids"] == ["d"] and v["wrong"] == ["b"] and not v["ok"]
    assert v["reported"] == {"dropped": {"dropped by producer: ring_full": 1}}
    ok = bs.verify({"a": (3, 11), "c": (5, 33)}, {"a": {"n": 3, "crc": 11}}, reports)
    assert ok["ok"] and ok["missing"] == 0
    extra = bs.verify({"a": (3, 11)}, {"a": {"n": 3, "crc": 11}, "plain-1": {"n": 1, "crc": 0}},
                      {})
    assert not extra["ok"] and extra["unrequested"] == ["plain-1"]


def test_bench_server_optional_samples_of_a_partial_mode_may_be_absent_but_never_wrong():
    """``on:alt=N`` captures some of its requests by design: each of its rids may arrive or
    not (neither missing nor unrequested), but one that arrives must be exact."""
    bs = _bench_server()
    assert bs.partial("on:alt=8") and not bs.captures("on:alt=8") and not bs.partial("on")
    optional = {"x": (4, 40), "y": (5, 50), "z": (6, 60)}
    v = bs.verify({"a": (3, 11)}, {"a": {"n": 3, "crc": 11}, "x": {"n": 4, "crc": 40}}, {},
                  optional=optional)
    assert v["ok"] and (v["optional"], v["optional_received"]) == (3, 1)
    bad = bs.verify({}, {"y": {"n": 5, "crc": 51}}, {}, optional=optional)
    assert not bad["ok"] and bad["wrong"] == ["y"] and bad["n_unrequested"] == 0


def test_bench_server_crc_matches_what_the_subscriber_computes():
    import numpy as np
    import zlib

    bs = _bench_server()
    ids = [5, 70000, 31999]
    assert bs.ids_crc(ids) == zlib.crc32(np.asarray(ids, dtype=np.int32).astype("<i4").tobytes())


def test_bench_server_subscriber_drains_to_the_producers_head_and_accounts_for_every_rid(
        endpoint, tmp_path):
    """The bench's subscriber process against a real producer: it is asked to stop while
    samples are still in the ring, and still delivers every one of them before it stops."""
    import subprocess

    import torch
    from hscapture import Producer

    bs = _bench_server()
    out, stop = tmp_path / "samples.jsonl", tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, bs.__file__, "--subscribe", endpoint, str(out),
                             str(stop), "30"])
    try:
        with Producer(endpoint, producer_id="benchsub", capacity=64 << 20) as p:
            deadline = time.monotonic() + 60
            while not (tmp_path / "stop.ready").exists():
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
            expected = {}
            for i in range(40):
                n = 300 + 7 * i
                ids = torch.randint(3, 32000, (n,), dtype=torch.int32)
                h = torch.randn(n, 64).to(torch.bfloat16)
                for s in range(0, n, 256):                     # multi-chunk samples
                    e = min(n, s + 256)
                    assert p.capture(f"hscap-{i}", [h[s:e]], layers=[0], token_start=s,
                                     is_last_chunk=e == n, token_ids=ids[s:e])
                expected[f"hscap-{i}"] = (n, bs.ids_crc(ids.tolist()))
            p.flush()
            tmp = tmp_path / "stop.tmp"                          # at once: samples in flight
            tmp.write_text(json.dumps(sorted(expected)))
            os.replace(tmp, stop)
            assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    got, tail = {}, {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        if "stats" in rec:
            tail = rec
        else:
            got[rec["rid"]] = rec
    v = bs.verify(expected, got, {k: tail["stats"][k] for k in ("dropped", "incomplete",
                                                                "rejected")})
    assert v["ok"] and v["received"] == 40, v
    assert tail["drain"]["ended"].startswith("caught up"), tail["drain"]


def _answer(handler: Any, code: int, obj: Any) -> None:
    """Send ``obj`` as the JSON answer of an ``http.server`` request handler."""
    data = json.dumps(obj).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def test_bench_server_round_sends_batches_and_maps_every_output_to_its_prompt():
    """``run_round`` with ``batch`` > 1 posts SGLang's batch form of /generate (lists of
    input_ids and rids, ``batch`` per request, the last one shorter) and hands back each
    prompt's output ids in prompt order: here a real HTTP server on loopback answers each
    prompt with its own first id and its rid's length, so a misrouted answer shows."""
    import http.server
    import json as _json
    import threading

    bs = _bench_server()
    seen: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids, rids = body["input_ids"], body["rid"]
            if isinstance(rids, str):
                out: object = {"output_ids": [ids[0], len(rids)]}
                seen.append(1)
            else:
                assert len(ids) == len(rids)
                out = [{"output_ids": [p[0], len(r)]} for p, r in zip(ids, rids)]
                seen.append(len(ids))
            _answer(self, 200, out)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        prompts = [[100 + i, 7] for i in range(11)]
        rids = ["r" * (i + 1) for i in range(11)]
        _, outs = bs.run_round(url, prompts, rids, concurrency=3, batch=4)
        assert outs == [[100 + i, i + 1] for i in range(11)]
        assert sorted(seen) == [3, 4, 4]
        seen.clear()
        _, outs = bs.run_round(url, prompts[:2], rids[:2], concurrency=2, batch=1)
        assert outs == [[100, 1], [101, 2]] and seen == [1, 1]
    finally:
        srv.shutdown()
        srv.server_close()


class _LoopbackSGLang:
    """A real HTTP server on loopback answering SGLang's /generate (single and batch form)
    for the steady-load tests: it records every request's rids, its mode (read from the
    rid, laid out as :func:`_rid_of` does: ``hscap|plain-short-MODE-sK-i``), and
    how many were in flight; requests whose mode is in ``hold``
    wait until ``release`` is set; a rid in ``fail`` gets HTTP 500."""

    def __init__(self) -> None:
        import http.server
        import json as _json
        import threading

        self.lock = threading.Lock()
        self.arrivals: list[tuple[str, list[str]]] = []   # (mode, rids) in arrival order
        self.inflight = 0
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.fail: set[str] = set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rids = body["rid"] if isinstance(body["rid"], list) else [body["rid"]]
                mode = _mode_of(rids[0])
                with outer.lock:
                    outer.arrivals.append((mode, rids))
                    outer.inflight += 1
                if mode in outer.hold:
                    outer.release.wait(30)
                with outer.lock:     # done before its answer leaves (the client sees it after)
                    outer.inflight -= 1
                _answer(self, 500 if outer.fail & set(rids) else 200,
                        [{"output_ids": [1]} for _ in rids] if isinstance(body["rid"], list)
                        else {"output_ids": [1]})

            def log_message(self, *args: object) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.srv.shutdown()
        self.srv.server_close()


def _mode_of(rid: str) -> str:
    import re

    return re.fullmatch(r"(?:hscap|plain)-short-(.+)-s\d+-\d+", rid).group(1)


def _rid_of(mode: str, k: int, n: int) -> list[str]:
    return [f"{'hscap' if mode.startswith('on') else 'plain'}-short-{mode.replace(':', '-')}"
            f"-s{k}-{i}" for i in range(n)]


@given(st.lists(st.tuples(st.floats(0, 10), st.sampled_from(["off", "on"]),
                          st.integers(1, 500)), max_size=40),
       st.floats(0, 5), st.floats(0.01, 5))
def test_steady_window_counts_exactly_its_modes_answers_inside_it(done, t_a, length):
    bs = _bench_server()
    t_b = t_a + length
    got = bs.window_rate(done, "on", t_a, t_b)
    inside = [k for t, m, k in done if m == "on" and t_a <= t <= t_b]
    assert got["requests"] == len(inside) and got["tokens"] == sum(inside)
    assert math.isclose(got["tok_per_s"], sum(inside) / (t_b - t_a))
    with pytest.raises(ValueError, match="t_b > t_a"):
        bs.window_rate(done, "on", t_b, t_a)


def test_steady_load_switches_modes_only_with_nothing_in_flight_and_accounts_every_request():
    """``pause`` returns with nothing in flight at the server; after ``resume(B)`` no
    request of the old mode arrives; ``on_sent`` names exactly the rids the server saw, once
    each; ``stop`` leaves nothing in flight; every window counts only its own mode."""
    bs = _bench_server()
    srv = _LoopbackSGLang()
    sent: list[tuple[str, str]] = []
    prompts = [[5] * (10 + i) for i in range(7)]
    try:
        load = bs.SteadyLoad(srv.url, prompts, concurrency=4, batch=3, rid_of=_rid_of,
                             on_sent=lambda m, rids, g: sent.extend((m, r) for r in rids))
        for mode in ("off", "on", "on:noop", "off"):
            load.pause()
            with srv.lock:
                assert srv.inflight == 0, "pause() returned with requests in flight"
                mark = len(srv.arrivals)
            ramp = load.resume(mode)
            assert ramp >= 0
            w = load.window(0.05)
            with srv.lock:
                later = [m for m, _ in srv.arrivals[mark:]]
            assert later and set(later) == {mode.replace(":", "-")}, later
            assert w["tokens"] == 0 or w["requests"] > 0
        load.stop()
        with srv.lock:
            assert srv.inflight == 0
            seen = [r for _, rids in srv.arrivals for r in rids]
        assert sorted(seen) == sorted(r for _, r in sent) and len(set(seen)) == len(seen)
        assert all(_mode_of(r) == m.replace(":", "-") for m, r in sent)
    finally:
        srv.close()


def test_steady_load_resume_waits_out_the_ramp_and_an_http_error_stops_it():
    """``resume`` returns only once ``concurrency`` requests of the new mode were answered
    (held here until released: it must still be waiting); a failed request makes the next
    call raise, and ``stop`` then returns."""
    import threading

    bs = _bench_server()
    srv = _LoopbackSGLang()
    try:
        load = bs.SteadyLoad(srv.url, [[5, 6, 7]], concurrency=3, batch=1, rid_of=_rid_of)
        srv.hold.add("on")
        back: list[float] = []
        t = threading.Thread(target=lambda: back.append(load.resume("on")), daemon=True)
        t.start()
        t.join(0.3)
        assert t.is_alive() and not back, "resume() returned before any answer"
        srv.release.set()
        t.join(30)
        assert back and back[0] >= 0.3
        load.pause()
        srv.fail.add("hscap-short-on-s100-0")      # a request sent later fails
        with pytest.raises(RuntimeError, match="request failed"):
            load.resume("on")
            for _ in range(200):                   # until request 100 was sent and failed
                load.window(0.01)
        with pytest.raises(RuntimeError, match="request failed"):
            load.stop()
    finally:
        srv.close()


# -- server_trace: reading SGLang's profiler traces ----------------------------------------

@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=25))
def test_server_trace_union_counts_every_covered_instant_once(spans):
    import server_trace

    intervals = [(s, s + d) for s, d in spans]
    covered = {t for s, e in intervals for t in range(s, e)}     # unit cells [t, t+1)
    assert server_trace.union_us(intervals) == len(covered)


def test_server_trace_summary_and_the_hooks_exclusive_time(tmp_path):
    """A hand-made trace: two overlapping kernels and a later one (busy 30 of 40 us), one
    copy, two steps, one hook range holding a Python call that holds a torch op: the
    summary and the per-call exclusive times are what the events say."""
    import gzip

    import server_trace

    def x(name, cat, ts, dur, tid=1):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid,
                "pid": 1}

    events = [x("k1", "kernel", 100, 10, 7), x("k2", "kernel", 105, 10, 8),
              x("k3", "kernel", 125, 15, 7),
              x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 110, 4, 9),
              x("step[EXTEND bs=2 toks=64]", "user_annotation", 90, 30),
              x("step[EXTEND bs=1 toks=8]", "user_annotation", 121, 10),
              x("hscapture.hook", "user_annotation", 200, 50),
              x("hook.py(1): _publish", "python_function", 205, 40),
              x("aten::copy_", "cpu_op", 210, 15),
              {"ph": "M", "name": "process_name", "pid": 1}]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    ev = server_trace.load(str(path))
    assert len(ev) == len(events) - 1           # the metadata event has no duration
    s = server_trace.summarize(ev)
    assert s["kernels"] == 3
    assert s["kernel_busy_ms"] == pytest.approx(0.030)
    assert s["kernel_span_ms"] == pytest.approx(0.040)
    assert s["gpu_busy_share"] == pytest.approx(0.75)
    assert s["copies"] == {"Memcpy DtoH (Device -> Pinned)": {"n": 1, "total_ms": 0.004}}
    assert s["annotations"]["step[...]"]["n"] == 2
    assert s["annotations"]["step[...]"]["total_ms"] == pytest.approx(0.040)
    rows = {r["name"]: r for r in server_trace.hook_exclusive(ev)}
    assert rows["hook.py(1): _publish"]["exclusive_us"] == pytest.approx(25)
    assert rows["hook.py(1): _publish"]["inclusive_us"] == pytest.approx(40)
    assert rows["aten::copy_"]["exclusive_us"] == pytest.approx(15)


def test_server_trace_measures_how_long_small_result_copies_waited_behind_large_ones():
    """Stream 7: a kernel ends at 100, then SGLang's small result copy, launched at 90, starts
    at 601: it waited 501 us, right behind the capture's 25 MB copy on stream 20 (100-600).
    A second small copy, launched at 700 after its stream's kernel ended at 650, starts at
    702: a 2 us wait, behind nothing. A third starts 3 us after a second large copy ended
    (800-900), but its stream's kernel ran until 902: a 1 us wait, not behind the large copy.
    The large copies themselves are not counted as waiting."""
    import server_trace

    def gpu(name, cat, ts, dur, stream, corr, nbytes=0):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": stream,
                "pid": 0, "args": {"stream": stream, "correlation": corr, "bytes": nbytes}}

    def api(ts, corr):
        return {"ph": "X", "name": "cudaMemcpyAsync", "cat": "cuda_runtime", "ts": ts,
                "dur": 3, "tid": 1, "pid": 1, "args": {"correlation": corr}}

    dtoh = "Memcpy DtoH (Device -> Pinned)"
    events = [gpu("k", "kernel", 50, 50, 7, 1), gpu(dtoh, "gpu_memcpy", 100, 500, 20, 2,
                                                     25 << 20),
              api(90, 3), gpu(dtoh, "gpu_memcpy", 601, 2, 7, 3, 8 << 10),
              gpu("k", "kernel", 640, 10, 7, 4), api(700, 5),
              gpu(dtoh, "gpu_memcpy", 702, 2, 7, 5, 4 << 10),
              gpu(dtoh, "gpu_memcpy", 800, 100, 20, 6, 25 << 20),
              gpu("k", "kernel", 850, 52, 7, 7), api(880, 8),
              gpu(dtoh, "gpu_memcpy", 903, 2, 7, 8, 4 << 10)]
    w = server_trace.dtoh_waits(events)
    assert w["n"] == 3 and w["large_copies"] == 2
    assert w["max_us"] == pytest.approx(501) and w["mean_us"] == pytest.approx(168)
    assert w["behind_large"] == {"n": 1, "mean_us": pytest.approx(501),
                                 "max_us": pytest.approx(501)}
    assert server_trace.summarize(events)["small_dtoh_waits"] == w


def test_bench_server_expects_a_sample_for_exactly_the_modes_that_capture():
    bs = _bench_server()
    assert [m for m in ("off", "on", "on:noop", "on:nocapture", "on:publisher",
                        "on:devids", "on:grace=0.005", "on:interval=0", "on:alt=8")
            if bs.captures(m)] == \
        ["on", "on:publisher", "on:devids", "on:grace=0.005", "on:interval=0"]


def _forward_log(tmp_path: Path, passes: list[tuple[int, ...]]) -> Any:
    """``passes`` (t_ns, hook_ns, tokens, rows, extend[, phase]) written by a real
    ForwardLog, read back as bench_server reads it."""
    from types import SimpleNamespace

    from hscapture.sglang.timing import ForwardLog, read_forward_log

    log = ForwardLog(str(tmp_path / "forwards.bin"), capacity=3)   # flushes mid-way too
    for t, h, tokens, rows, extend, *phase in passes:
        mode = SimpleNamespace(name="EXTEND" if extend else "DECODE")
        log.add(t, h, SimpleNamespace(forward_mode=mode, extend_num_tokens=tokens,
                                      reqs=[None] * tokens), rows, *phase)
    log.flush()
    log.close()
    return read_forward_log(log.path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5_000_000), st.sampled_from([512, 2048, 2048, 2048]),
                          st.booleans()), min_size=4, max_size=40))
def test_scheduler_window_is_the_loops_own_throughput_and_its_full_pass_cost(tmp_path_factory,
                                                                             passes):
    """Over the passes whose hook ran inside the window: prefill tokens (all but the last
    pass's) over first-to-last hook time; and the median over full prefill passes of tokens
    over the loop turn after them. Decode passes take time but give no prefill tokens."""
    bs = _bench_server()
    if sum(e for _, _, e in passes[:-1]) < 2 or not any(
            e and k == 2048 for _, k, e in passes[:-1]):
        return       # the refusals are the next test's
    t, rows = 10**12, []
    for gap, tokens, extend in passes:
        rows.append((t, 7_000, tokens if extend else 3, 1, int(extend)))
        t += gap
    # passes outside the window on both sides are left out
    log = _forward_log(tmp_path_factory.mktemp("log"),
                       [(10**12 - 10**9, 1, 2048, 0, 1)] + rows + [(t + 10**9, 1, 2048, 0, 1)])
    got = bs.scheduler_window(log, 10**3, (rows[-1][0] + 1) / 1e9, 2048)
    head, turns = rows[:-1], [b[0] - a[0] for a, b in zip(rows, rows[1:])]
    tokens = sum(r[2] for r in head if r[4])
    assert math.isclose(got["sched_tok_per_s"], tokens / (rows[-1][0] - rows[0][0]) * 1e9)
    per_token = sorted(r[2] / d * 1e9 for r, d in zip(head, turns) if r[4] and r[2] >= 2048)
    assert math.isclose(got["full_tok_per_s"], float(np.median(per_token)))
    assert got["forwards"] == len(rows) and got["full_forwards"] == len(per_token)
    assert got["rows"] == len(rows) and math.isclose(got["hook_us_mean"], 7.0)
    assert bs.full_batch_tokens(log) == 2048


def test_scheduler_window_refuses_a_window_without_enough_prefill_or_without_a_full_pass(
        tmp_path):
    bs = _bench_server()
    log = _forward_log(tmp_path, [(10**9, 1, 100, 0, 1), (2 * 10**9, 1, 100, 0, 1),
                                  (3 * 10**9, 1, 100, 0, 1), (4 * 10**9, 1, 3, 0, 0)])
    with pytest.raises(ValueError, match="no prefill pass of >= 2048"):
        bs.scheduler_window(log, 0.5, 4.5, 2048)
    with pytest.raises(ValueError, match="expected at least 2"):
        bs.scheduler_window(log, 2.5, 4.5, 100)
    assert bs.full_batch_tokens(log) == 100
    with pytest.raises(ValueError, match="no prefill pass"):
        bs.full_batch_tokens(log[log["extend"] == 0])


def _alt_passes(n: int, cycles: int, turn_ns: Any, hook_on: int, lagged: int,
                tokens: int = 2048, hook_off: int = 30_000) -> list[tuple[int, ...]]:
    """A forward log of ``alt=n``: ``cycles`` x (n captured + n skipped) prefill passes. Pass
    i's loop turn is ``turn_ns(i)`` (the host's own speed, drifting as it likes) plus its
    hook (``hook_on`` captured, ``hook_off`` skipped) plus ``lagged`` when the PREVIOUS pass
    was captured (what the overlap scheduler shows one turn late)."""
    rows, t, prev_on = [], 10**12, False
    for i in range(2 * n * cycles):
        on = (i // n) % 2 == 0
        hook = hook_on if on else hook_off
        rows.append((t, hook, tokens, 8 if on else 0, 1, 1 if on else 2))
        t += int(turn_ns(i)) + hook + (lagged if prev_on else 0)
        prev_on = on
    return rows


@pytest.mark.parametrize("drift", ["flat", "linear", "steps"])
def test_interleaved_charges_each_capture_its_hook_and_its_lagged_cost_whatever_the_drift(
        tmp_path, drift):
    """The alt=N window's ratio: a captured pass costs 400 us of hook and 200 us one turn
    late on a 15 ms step; the skipped ones 30 us of hook. The host's speed drifts (not at
    all, linearly, or by a step every few blocks): the ratio per captured block is the true
    one, 15.03 / 15.6, within the drift's own leftover; unshifted (each pass's own turn)
    sees only (N-2)/N of the lagged cost."""
    bs = _bench_server()
    n, base = 8, 15_000_000
    turn = {"flat": lambda i: base, "linear": lambda i: base * (1 + i / 4000),
            "steps": lambda i: base * (1.3 if (i // 48) % 2 else 1.0)}[drift]
    log = _forward_log(tmp_path, _alt_passes(n, 40, turn, 400_000, 200_000))
    got = bs.interleaved(log, 0, 10**6)
    # the true ratio of each captured block (blocks 2, 4, ... of the window: the first cut)
    mids = [turn((2 * k) * n + n // 2) for k in range(1, 39)]
    truth = float(np.median([(b + 30_000) / (b + 600_000) for b in mids]))
    seen = float(np.median([(b + 30_000 + 200_000 / n) / (b + 400_000 + 200_000 * (n - 1) / n)
                            for b in mids]))
    assert got["passes_per_block"] == n and len(got["ratios"]) >= 30
    if drift == "steps":
        # the blocks next to a step are off by the step; the median stays between the two
        # levels' true ratios
        lo, hi = min((b + 30_000) / (b + 600_000) for b in mids), \
            max((b + 30_000) / (b + 600_000) for b in mids)
        assert lo - 1e-3 <= float(np.median(got["ratios"])) <= hi + 1e-3
        assert got["outside_us_median"] == pytest.approx(200.0 * 6 / n, abs=2.0)
        return
    assert abs(float(np.median(got["ratios"])) - truth) < 1e-3
    assert abs(float(np.median(got["ratios_unshifted"])) - seen) < 1e-3
    assert got["hook_us_mean"] == {"captured": pytest.approx(400.0),
                                   "skipped": pytest.approx(30.0)}
    # outside the hook: the lagged cost lands after 7 of 8 captured passes, 1 of 8 skipped
    assert got["outside_us_median"] == pytest.approx(200.0 * 6 / n, abs=2.0)


def test_interleaved_leaves_out_passes_of_other_modes_and_refuses_a_window_too_short(tmp_path):
    bs = _bench_server()
    passes = _alt_passes(4, 5, lambda i: 10_000_000, 300_000, 0)
    # passes of another mode (phase 0) in the window, before and after, are no blocks
    before = [(passes[0][0] - k * 10_000_000, 1, 2048, 0, 1, 0) for k in range(4, 0, -1)]
    after = [(passes[-1][0] + k * 10_000_000, 1, 2048, 0, 1, 0) for k in range(1, 5)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    got = bs.interleaved(_forward_log(tmp_path / "a", before + passes + after), 0, 10**6)
    # 10 blocks, the two the window cuts left out: 4 captured ones between skipped ones...
    # of which the last one's right neighbour is the block the window cut
    assert got["blocks"] == 8 and len(got["ratios"]) == 3, got
    assert all(r == pytest.approx(10.03 / 10.3) for r in got["ratios"])
    with pytest.raises(ValueError, match="expected at least 3"):
        bs.interleaved(_forward_log(tmp_path / "b", passes[:24]), 0, 10**6)


def test_a_forward_log_that_cannot_be_written_switches_off_and_never_raises(tmp_path):
    """A full disk (``/dev/full``: every write fails with ENOSPC) switches the log off at
    its first flush; later passes are ignored; nothing is raised into the forward pass."""
    from types import SimpleNamespace

    from hscapture.sglang.timing import ForwardLog

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this host")
    log = ForwardLog("/dev/full", capacity=2)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND"), extend_num_tokens=4)
    for i in range(5):
        log.add(i, 1, batch, 0)          # the 2nd add flushes, fails, switches the log off
    log.flush()
    assert log._fd is None
