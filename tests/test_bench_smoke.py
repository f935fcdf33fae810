"""Benchmarks that reach into the producer's internals still run (a rename breaks them here,
not on the GPU host). Tiny sizes: this checks that they run and report, not their figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_capture_host_times_hot_and_cold_calls_and_every_stage(tmp_path):
    out = tmp_path / "bch.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_capture_host.py"),
                          "--calls", "20", "--reps", "5", "--sweep-mib", "4", "--breakdown",
                          "--meta-ab", "--rows", "2", "--torch-costs", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads(out.read_text())
    r = rec["results"]
    assert r["hot"]["n"] == 5 and r["cold"]["n"] == 5 and r["hot"]["median"] > 0
    stages = {"checks", "entry meta", "reserve", "header", "copies", "enqueue",
              "inline publish", "notice encode"}
    for mode in ("hot", "cold"):
        assert set(r["breakdown_us"][mode]) == stages, r["breakdown_us"][mode]
    assert set(rec["timed_region"]) == {"hot", "cold"}
    ab = r["meta_ab"]
    assert ab["cold native meta"]["n"] == 5 and ab["cold python meta"]["n"] == 5
    assert ab["native_over_python"]["median"] > 0
    assert {m for m in r["torch_costs"] if m != "order"} == {
        f"{w} {t}" for w in ("25 attribute reads", "slice + int32 copy") for t in ("hot", "cold")}
    assert all(v["median"] > 0 for m, v in r["torch_costs"].items() if m != "order")


def _bench(tmp_path: Path, script: str, *args: str) -> dict:
    """Run ``benchmarks/<script>`` with ``args`` and ``--out``; its JSON (exit 0 asserted)."""
    out = tmp_path / "out.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args,
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(out.read_text())


def test_bench_publish_times_the_inline_commit_and_notice_with_a_subscriber_process(tmp_path):
    rec = _bench(tmp_path, "bench_publish.py", "--calls", "20", "--reps", "5",
                 "--sweep-mib", "4")
    for mode in ("hot", "cold"):
        r = rec["results_us"][mode]
        assert 0 < r["publish"]["median"] < r["whole"]["median"], r
    # every call announced its entry: 6 repetitions x 2 modes x 20 calls, nothing dropped
    assert rec["stats"]["captured_rows"] == 240 and rec["stats"].get("dropped", 0) == 0


def test_bench_delivery_drains_every_sample_it_wrote(tmp_path):
    rec = _bench(tmp_path, "bench_delivery.py", "--entries", "20", "--rows", "8", "--reps", "5")
    assert len(rec["samples_per_s"]["all"]) == 5 and rec["samples_per_s"]["min"] > 0


def test_bench_ring_runs_all_four_methods_alternating_and_judges_the_goal_on_the_put_take_pair(
        tmp_path):
    rec = _bench(tmp_path, "bench_ring.py", "--sizes", "4096", "--gb", "0.002", "--reps", "2")
    row = rec["results"]["rows"][0]
    methods = ("ring", "memcpy", "ring_views", "memcpy_numpy")
    assert {m: len(row["runs"][m]) for m in methods} == {m: 2 for m in methods}
    assert all(r["records"] == row["records_per_run"] for m in methods for r in row["runs"][m])
    assert row["ratio"]["n"] == 2 and row["views_ratio"]["n"] == 2
    # every repetition runs each method once, the first one rotating
    counted = [m for m in row["order"] if not m.startswith("warmup:")]
    assert counted[:4] != counted[4:] and sorted(counted[:4]) == sorted(methods)
    assert rec["goals"][0]["name"] == "ring/memcpy at 4 KiB"
    assert rec["goals"][0]["values"] == row["ratio"]["values"]
    assert set(rec["timed_region"]) == set(methods)


def test_bench_e2e_runs_every_method_with_its_producer_settings_and_reads_the_shards_back(tmp_path):
    # a Producer setting outside its bounds (wait_timeout_s=600) broke this benchmark unseen
    rec = _bench(tmp_path, "bench_e2e.py", "--gb", "0.02", "--old-gb", "0.01", "--hidden", "256",
                 "--ring-mb", "32", "--flush-mb", "8", "--reps", "1", "--warmup", "0",
                 "--targets", "shm", "--disk-dir", str(tmp_path / "disk"))
    r = rec["results"]
    assert r["ok"] is True
    assert r["drops"] == {"hscapture_shm": 0, "raw_shm": 0, "deliver": 0, "old": 0}
    assert all(v["median"] > 0 for v in r["samples_per_s"].values())


def test_bench_stream_streams_every_sample_cleanly_beside_its_raw_baseline(tmp_path):
    rec = _bench(tmp_path, "bench_stream.py", "--device", "cpu", "--samples", "8", "--tokens",
                 "64", "--hidden", "256", "--ring-mb", "16", "--reps", "1")
    assert rec["results"]["clean"] is True
    assert set(rec["results"]["summary"]["methods"]) >= {"stream", "raw"}
