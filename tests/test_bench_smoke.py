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


def _bench(tmp_path: Path, script: str, *args: str, out_flag: str = "--out") -> dict:
    """Run ``benchmarks/<script>`` with ``args`` and ``out_flag`` (``--out``, or ``--json`` for
    the scripts that name it so); its JSON (exit 0 asserted)."""
    out = tmp_path / "out.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args,
                          out_flag, str(out)], capture_output=True, text=True, timeout=300)
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
    # where the hscapture run's clock went: its phases add up to the clock
    run = r["runs"]["hscapture_shm"][0]
    ph = run["phases"]
    assert min(ph["head"], ph["body"], ph["tail"]) >= 0
    assert abs(ph["head"] + ph["body"] + ph["tail"] - run["seconds"]) < 1e-6
    assert r["phases"]["shm"]["raw_ms"] > 0


def test_bench_stream_streams_every_sample_cleanly_beside_its_raw_baseline(tmp_path):
    rec = _bench(tmp_path, "bench_stream.py", "--device", "cpu", "--samples", "8", "--tokens",
                 "64", "--hidden", "256", "--ring-mb", "16", "--reps", "1")
    assert rec["results"]["clean"] is True
    assert set(rec["results"]["summary"]["methods"]) >= {"stream", "raw"}


def test_bench_shards_times_the_writer_and_raw_write_into_each_directory(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    rec = _bench(tmp_path, "bench_shards.py", "--dir", str(dirs[0]), "--dir", str(dirs[1]),
                 "--total-mib", "1", "--tokens", "16", "--hidden", "256", "--flush-every", "2",
                 "--max-shard-mib", "1", "--reps", "2")
    r = rec["results"]
    assert r["sample_bytes"] > 0 and r["samples"] == (1 << 20) // r["sample_bytes"]
    assert set(r["dirs"]) == {str(d) for d in dirs}
    for d in r["dirs"].values():
        for key in ("shardwriter_GBps", "raw_write_fsync_GBps", "ratio",
                    "shardwriter_samples_per_s"):
            assert d[key]["n"] == 2 and d[key]["min"] > 0, (key, d[key])
        assert [m for m in d["order"] if not m.startswith("warmup:")] == ["A", "B", "A", "B"]
    assert set(rec["timed_region"]) == {"shardwriter", "raw"}
    assert [g["name"] for g in rec["goals"]] == [f"ShardWriter/raw into {d}" for d in dirs]


def test_bench_reader_reads_every_sample_by_reader_safe_open_and_legacy_path(tmp_path):
    rec = _bench(tmp_path, "bench_reader.py", "--samples", "8", "--tokens", "16", "--hidden",
                 "64", "--layers", "2", "--reps", "2", "--legacy-samples", "2", "--dir",
                 str(tmp_path), out_flag="--json")
    assert rec["reps"] == 2 and rec["touch"] is True
    assert rec["bytes"] == 8 * (16 * 64 * 2 * 2 + 16 * 5)   # 2 bf16 layers + int32 ids + u8 mask
    for side in ("reader", "safe_open", "legacy_load_sample"):
        r = rec[side]
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], (side, r)
        assert r["samples_per_s"] > 0 and r["gb_per_s"] > 0
    assert rec["reader_vs_safe_open"] > 0
    lo, hi = rec["ratio_min_max"]
    assert 0 < lo <= hi


def test_bench_compact_writes_and_reads_back_every_codec_and_measures_fp8_error(tmp_path):
    rec = _bench(tmp_path, "bench_compact.py", "--hidden", "64", "--layers", "4", "--vocab",
                 "256", "--samples", "2", "--tokens", "16", "--batch", "2", "--reps", "2",
                 "--dir", str(tmp_path))
    r = rec["results"]
    assert r["samples"] == 2 and r["tokens"] == 32 and r["logical_bytes"] > 0
    assert r["model"]["kind"].startswith("random weights")
    methods = ("none", "zstd", "fp8")
    assert set(r["methods"]) == set(methods) and set(rec["timed_region"]) == set(methods)
    for m in methods:
        mm = r["methods"][m]
        for key in ("bytes_per_token", "write_gb_s", "read_gb_s"):
            assert mm[key]["n"] == 2 and mm[key]["min"] > 0, (m, key, mm[key])
        assert len(mm["runs"]) == 2 and mm["data_bytes_per_token"] > 0
    # fp8 stores one byte an element (+ scales) where none stores bf16's two
    assert r["methods"]["fp8"]["data_bytes_per_token"] < r["methods"]["none"]["data_bytes_per_token"]
    counted = [m for m in r["order"] if not m.startswith("warmup:")]
    assert sorted(counted[:3]) == sorted(methods) and counted[:3] != counted[3:]
    assert set(r["fp8_error"]) == set(r["layers"])
    for name, e in r["fp8_error"].items():
        assert 0 < e["rel_rms"] < 0.1 and e["max_abs"] > 0, (name, e)
    # the last decoder layer is its own (pre-norm) output, not the final norm's a second time
    assert r["fp8_error"]["layer_3"] != r["fp8_error"]["final_norm"]


def test_bench_export_raw_renamed_renames_every_raw_file_and_says_so(tmp_path):
    # the diagnostic that prices the export's renames: the raw side writes tmp + rename too
    rec = _bench(tmp_path, "bench_export.py", "--samples", "3", "--tokens", "16", "--hidden",
                 "64", "--reps", "5", "--formats", "specforge", "--workers", "2",
                 "--raw-renamed", "--crc-thread-min", "0", "--dir", str(tmp_path),
                 out_flag="--json")
    assert rec["config"]["raw_renamed"] is True
    assert rec["config"]["crc_thread_min"] == 0      # every CRC by the helper thread
    v = rec["results"]["specforge"]
    # (the script exits non-zero when a raw file is missing or left under its temporary name)
    assert v["export_vs_raw"]["n"] == 5 and v["export_vs_raw"]["min"] > 0


def test_bench_export_pairs_every_format_with_raw_and_profiles_and_breaks_down_specforge(
        tmp_path):
    rec = _bench(tmp_path, "bench_export.py", "--samples", "4", "--tokens", "16", "--hidden",
                 "64", "--reps", "5", "--formats", "specforge,specforge:nocrc,speculators",
                 "--workers", "2", "--profile", "--breakdown", "--dir", str(tmp_path),
                 out_flag="--json")
    r = rec["results"]
    assert set(r) == {"specforge", "specforge:nocrc", "speculators"}
    for label, v in r.items():
        # the script exits non-zero when raw and export did not write the same byte count
        assert v["bytes_written"] > 0
        assert v["export_s"]["n"] == 5 and v["raw_s"]["n"] == 5, label
        assert v["export_s"]["min"] > 0 and v["raw_s"]["min"] > 0
        assert v["export_vs_raw"]["n"] == 5 and v["export_vs_raw"]["min"] > 0
        assert v["export_gb_per_s"] > 0 and v["raw_gb_per_s"] > 0
    for fmt in ("specforge", "speculators"):
        prof = r[fmt]["profile_ms_per_sample"]
        assert {"export.load", "export.build", "export.write", "raw.load", "raw.writev"} <= set(prof)
        assert all(x > 0 for x in prof.values()), prof
    assert "profile_ms_per_sample" not in r["specforge:nocrc"]
    bd = r["specforge"]["breakdown_us_per_sample"]
    assert {"raw.writev", "aux.native_writev_crc32", "final.crc32", "whole_file"} <= set(bd)
    assert all(x > 0 for x in bd.values()), bd
    assert "breakdown_us_per_sample" not in r["speculators"]
    assert set(rec["timed_region"]) == {"export", "raw"}
    assert [g["name"] for g in rec["goals"]] == [f"{k} export/raw speed" for k in r]


def test_bench_crc_write_times_raw_helper_and_inline_writes_and_cleans_up(tmp_path):
    rec = _bench(tmp_path, "bench_crc_write.py", "--sources", "2", "--tokens", "64",
                 "--hidden", "256", "--reps", "5", "--dir", str(tmp_path), out_flag="--json")
    r = rec["results"]
    assert set(r) == {"raw", "helper", "inline"} == set(rec["timed_region"])
    for way, v in r.items():
        assert len(v["all_us"]) == 5 and v["min_us"] > 0, way
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]   # its scratch removed


def _bench_gpu(tmp_path: Path, section: str, *args: str) -> dict:
    """Run ``bench_gpu.py <section> --device cpu`` (its dry run) into ``tmp_path``; the JSON of
    that section (exit 0 asserted)."""
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), section,
                          "--device", "cpu", "--out-dir", str(tmp_path), *args],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads((tmp_path / f"gpu_{section}.json").read_text())


def test_bench_gpu_copy_dry_run_times_ring_pageable_and_producer_with_no_drops(tmp_path):
    rec = _bench_gpu(tmp_path, "copy", "--reps", "2", "--max-mb", "2", "--copy-gb", "0.002")
    r = rec["results"]
    assert r["device"] == "cpu" and r["dry_run"] is True and r["sizes"] == [1 << 20, 2 << 20]
    methods = {"ring", "pageable", "producer"}   # pinned needs CUDA: skipped and said so
    assert any("pinned skipped" in n for n in rec["notes"])
    assert set(rec["timed_region"]) == methods
    for row in r["rows"]:
        assert set(row["runs"]) == methods
        assert all(row["GBps"][m]["n"] == 2 and row["GBps"][m]["min"] > 0 for m in methods)
        assert row["producer_dropped"] == 0
        assert all(x["committed"] == x["iters"] for x in row["runs"]["producer"])
        assert row["producer_capture_call_us"]["min"] > 0
        assert {m: v["n"] for m, v in row["ratio_to_pageable"].items()} == {"ring": 2,
                                                                            "producer": 2}


def test_bench_gpu_overhead_dry_run_times_capture_on_and_off_and_the_consumer_gets_every_row(
        tmp_path):
    rec = _bench_gpu(tmp_path, "overhead", "--reps", "2", "--mixes", "1x16,2x8", "--iters", "1",
                     "--warmup-forwards", "1", "--ring-mb", "64")
    r = rec["results"]
    assert r["device"] == "cpu" and r["dry_run"] is True
    assert [(m["shape"], m["batch"], m["seq"]) for m in r["mixes"]] == [("tiny", 1, 16),
                                                                       ("tiny", 2, 8)]
    for m in r["mixes"]:
        assert m["drops"] == 0
        for key in ("off_tokens_per_s", "on_tokens_per_s", "slowdown_pct"):
            assert m[key]["n"] == 2, (key, m[key])
        assert m["off_tokens_per_s"]["min"] > 0 and m["on_tokens_per_s"]["min"] > 0
    # every captured row reached the consumer process, none dropped on either side
    captured = r["producer_stats"]["captured_rows"]
    assert captured == sum(m["batch"] for m in r["mixes"]) * (1 + 1 + 2)   # warm-ups + reps
    assert r["consumer"]["samples"] == captured
    assert r["consumer"]["dropped"] == r["consumer"]["incomplete"] == 0
    assert set(rec["timed_region"]) == {"off", "on"}


def test_bench_gpu_notices_dry_run_delivers_every_record_of_bursts_and_paced_phases(tmp_path):
    rec = _bench_gpu(tmp_path, "notices", "--reps", "2", "--notices", "200", "--notice-rows",
                     "8", "--paced-rates", "20000", "--paced-seconds", "0.05")
    r = rec["results"]
    phases = r["phases"]
    assert set(phases) == {"burst-1", "burst0", "burst1", "burst1row0", "burst1row1",
                           *(f"paced20000{p}-{i}" for p in ("sleep", "spin") for i in (0, 1))}
    for name, ph in phases.items():
        assert ph["received"] == ph["count"] == ph["committed"], (name, ph)
        assert ph["end_to_end_per_s"] > 0 and ph["latency_us"]["n"] == ph["count"]
    assert r["bursts_per_s"]["n"] == 2 and r["bursts_per_s"]["min"] > 0
    assert r["bursts_one_row_per_entry_per_s"]["n"] == 2
    assert set(r["paced"]) == {"20000/sleep", "20000/spin"}
    for p in r["paced"].values():
        assert p["received"] == p["count"] and p["p99_us"]["n"] == 2
        # where a paced entry's latency went: every entry's parts, one p50/p99 per repetition
        assert set(p["parts_us"]) == {"capture", "to_first", "rest"}
        assert all(p["parts_us"][k]["p99"]["n"] == 2 for k in p["parts_us"])
    for name, ph in phases.items():
        parts = ph["latency_parts_us"]
        if name.startswith("paced"):   # one record a paced entry (the default)
            assert parts["received"] == parts["entries"] == ph["count"], (name, parts)
            # each part is within the entry's latency (to_first may be below 0: the notice
            # goes out inside capture_batch(), which can return after the poll() did)
            assert 0 < parts["capture"]["max"] <= ph["latency_us"]["max"], (name, parts)
            assert parts["to_first"]["max"] <= ph["latency_us"]["max"], (name, parts)
        else:
            assert parts["entries"] == 0
    sub = r["subscriber"]
    assert sub["dropped"] == sub["lost"] == sub["incomplete"] == sub["errors"] == 0
    assert all("why_not" not in g for g in rec["goals"])   # no goal lost a record
    assert set(rec["timed_region"]) == {"burst", "latency"}
