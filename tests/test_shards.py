"""Tests of the safetensors shard writer (hscapture/shards.py)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

from hscapture.errors import ShardError
from hscapture.sample import Sample
from hscapture.shard_check import verify_dir
from hscapture.shards import (
    INDEX_NAME,
    DuplicateRidError,
    ShardWriter,
    load_sample,
    read_index,
)

import hscapture

# Children import the same hscapture package the tests import.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(hscapture.__file__)))

# Shared by the tests and the subprocesses they start, so both build bit-identical samples.
SAMPLE_SRC = '''
import zlib
import torch
from hscapture.sample import Sample

def make_sample(rid, T=5, H=64, dtype=torch.bfloat16, tok=torch.int32, seed=None, **kw):
    g = torch.Generator().manual_seed(seed if seed is not None else zlib.crc32(rid.encode('utf-8', 'surrogatepass')))
    a = torch.randn(T, H, generator=g).to(dtype)
    b = torch.randn(T, H, generator=g).to(dtype)
    return Sample(rid=rid, producer_id=kw.get("producer_id", "p"), epoch=kw.get("epoch", 1),
                  num_tokens=T, token_ids=torch.arange(T, dtype=tok),
                  tensors={"layer_3": a, "final_norm": b}, layers=[3, -1],
                  layer_kinds=["residual", "final_norm"],
                  dtype=str(dtype).removeprefix("torch."), hidden=H, meta=kw.get("meta", {}))
'''
exec(SAMPLE_SRC)
make_sample = globals()["make_sample"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same(loaded: dict, s: Sample) -> None:
    assert set(loaded) == set(s.tensors) | {"token_ids"}
    for k, v in s.tensors.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape
        assert torch.equal(bits(loaded[k]), bits(v)), k
    assert loaded["token_ids"].dtype == s.token_ids.dtype
    assert torch.equal(loaded["token_ids"], s.token_ids)


def run_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", SAMPLE_SRC + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def leftovers(d) -> list[str]:
    return [f for f in os.listdir(d) if f.endswith(".tmp") or f.endswith(".journal")]


# -- round trip --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tok", [torch.int32, torch.int64])
def test_round_trip_through_safetensors_is_bit_exact(tmp_path, dtype, tok):
    rids = ["a", "req/with/slashes", 'odd "quoted" rid \\ \u00e9\u4e2d', "x" * 300, "__metadata__"]
    samples = [make_sample(r, T=3 + i, H=48, dtype=dtype, tok=tok) for i, r in enumerate(rids)]
    samples[0].tensors["layer_3"][0, 0] = float("nan")
    with ShardWriter(tmp_path) as w:
        for s in samples:
            w.add(s)
    shard = tmp_path / "shard-00000.safetensors"
    flat = load_file(str(shard))
    assert len(flat) == 3 * len(samples)
    with safe_open(str(shard), "pt") as f:
        keys = set(f.keys())
        for s in samples:
            assert_same({k: flat[f"{s.rid}/{k}"] for k in list(s.tensors) + ["token_ids"]}, s)
            assert_same({k: f.get_tensor(f"{s.rid}/{k}") for k in list(s.tensors) + ["token_ids"]}, s)
            assert_same(load_sample(tmp_path, s.rid), s)
    assert keys == set(flat)
    assert set(read_index(tmp_path)) == set(rids)
    rep = verify_dir(tmp_path)
    assert rep["ok"], rep["problems"]
    assert rep["samples"] == len(rids) and rep["shards"] == 1


def test_header_is_space_padded_and_data_starts_8_aligned(tmp_path):
    with ShardWriter(tmp_path, header_reserve=65536) as w:
        w.add(make_sample("r", T=3, H=10))
    raw = (tmp_path / "shard-00000.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0 and 8 + n == 65536
    hdr = raw[8 : 8 + n]
    h = json.loads(hdr)
    assert hdr.endswith(b" ") and max(v["data_offsets"][1] for k, v in h.items()
                                      if k != "__metadata__") == len(raw) - 8 - n


def test_zero_copy_views_and_non_contiguous_tensors_are_written_correctly(tmp_path):
    s = make_sample("nc", T=4, H=32)
    base = torch.randn(32, 4).to(torch.bfloat16)
    s.tensors["layer_3"] = base.t()  # non-contiguous view
    with ShardWriter(tmp_path) as w:
        w.add(s)
    assert_same(load_sample(tmp_path, "nc"), s)


def test_metadata_present(tmp_path):
    s = make_sample("m", meta={"model": "meta-llama/X", "convention": "sglang-aux", "complete": True})
    with ShardWriter(tmp_path, metadata={"run": "r1", "model": "ignored-default"}) as w:
        w.add(s)
        w.add(make_sample("m2", producer_id="q", epoch=7,
                          meta={"model": "meta-llama/X", "convention": "sglang-aux"}))
    with safe_open(str(tmp_path / "shard-00000.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "hscapture.shard" and meta["format_version"] == "1"
    assert json.loads(meta["layers"]) == [3, None]          # the final norm has no layer id
    assert "final_norm_after_layer" not in meta and "num_layers" not in meta   # id -1: unknown
    assert json.loads(meta["layer_kinds"]) == ["residual", "final_norm"]
    assert json.loads(meta["layer_names"]) == ["layer_3", "final_norm"]
    assert meta["convention"] == "sglang-aux" and meta["model"] == "meta-llama/X"
    assert meta["dtype"] == "bfloat16" and meta["hidden"] == "64"
    assert json.loads(meta["producers"]) == {"p": [1], "q": [7]}
    assert meta["num_samples"] == "2" and meta["run"] == "r1"
    assert time.strptime(meta["created"], "%Y-%m-%dT%H:%M:%SZ")
    entry = read_index(tmp_path)["m"]
    assert entry["shard"] == "shard-00000.safetensors" and entry["num_tokens"] == 5
    assert entry["layers"] == [3, -1] and entry["producer_id"] == "p" and entry["epoch"] == 1
    assert entry["complete"] is True and entry["nbytes"] == s.nbytes


def test_reserved_metadata_key_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        ShardWriter(tmp_path, metadata={"format": "mine"})


def test_model_default_from_writer_metadata(tmp_path):
    with ShardWriter(tmp_path, metadata={"model": "m0"}) as w:
        w.add(make_sample("a"))
    with safe_open(str(tmp_path / "shard-00000.safetensors"), "pt") as f:
        assert f.metadata()["model"] == "m0" and f.metadata()["convention"] == ""


# -- rollover / durability contract ------------------------------------------------------------


def test_shards_roll_over_at_max_shard_bytes(tmp_path):
    per = make_sample("x", T=8, H=64).nbytes + 8 * 4  # 2 KiB hidden + token ids
    limit = 3 * per + 10
    samples = [make_sample(f"s{i}", T=8, H=64) for i in range(10)]
    big = make_sample("big", T=64, H=64)  # larger than the limit: a shard of its own
    with ShardWriter(tmp_path, max_shard_bytes=limit) as w:
        for s in samples[:5]:
            w.add(s)
        w.add(big)
        for s in samples[5:]:
            w.add(s)
    shards = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert shards == [f"shard-{i:05d}.safetensors" for i in range(5)]
    idx = read_index(tmp_path)
    counts = {}
    for e in idx.values():
        counts[e["shard"]] = counts.get(e["shard"], 0) + 1
    assert [counts[s] for s in shards] == [3, 2, 1, 3, 2]
    assert idx["big"]["shard"] == "shard-00002.safetensors"
    for s in shards:
        raw = (tmp_path / s).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        assert len(raw) - 8 - n <= limit or s == "shard-00002.safetensors"
    for s in samples + [big]:
        assert_same(load_sample(tmp_path, s.rid), s)
    assert verify_dir(tmp_path)["ok"]


def test_header_length_accounting_is_exact(tmp_path):
    w = ShardWriter(tmp_path)
    for r in ["a", "x/y", 'q"\\\u00e9\u4e2d\x7f', "r" * 100]:
        s = make_sample(r, T=3, H=8)
        s.tensors["odd \"name\u00e9"] = s.tensors.pop("layer_3")
        w.add(s)
    sh = w._shard
    tensors = {f"{e.rid}/{n}": {"dtype": d, "shape": sh_, "data_offsets": o}
               for e in sh.entries for n, d, sh_, o in e.tensors}
    body = json.dumps(tensors, separators=(",", ":"), ensure_ascii=False).encode()
    assert sh.tensors_json_len == len(body) - 2 + 1  # without braces, one comma per entry
    w.close()


def test_shard_closes_early_when_header_reserve_is_full(tmp_path):
    with ShardWriter(tmp_path, header_reserve=4096) as w:
        for i in range(40):
            w.add(make_sample(f"rid-{i:04d}", T=1, H=8))
    shards = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert len(shards) > 1
    assert len(read_index(tmp_path)) == 40 and verify_dir(tmp_path)["ok"]


def test_schema_change_starts_a_new_shard(tmp_path):
    with ShardWriter(tmp_path) as w:
        w.add(make_sample("a", H=64))
        w.add(make_sample("b", H=32))
        w.add(make_sample("c", H=32, dtype=torch.float16))
    idx = read_index(tmp_path)
    assert len({idx[r]["shard"] for r in "abc"}) == 3
    assert verify_dir(tmp_path)["ok"]


def test_flush_reports_each_rid_exactly_once(tmp_path):
    w = ShardWriter(tmp_path, max_shard_bytes=3000)
    reported = []
    for i in range(12):
        w.add(make_sample(f"r{i}", T=4, H=64))  # 1 KiB each: ~2 per shard
        if i % 5 == 4:
            got = w.flush()
            reported += got
            assert set(got) <= {f"r{j}" for j in range(i + 1)}
    reported += w.flush()
    assert w.flush() == []
    w.add(make_sample("last", T=4, H=64))
    reported += w.close()
    assert sorted(reported) == sorted([f"r{i}" for i in range(12)] + ["last"])
    assert len(reported) == len(set(reported))
    assert w.close() == [] and w.flush() == []


def test_flushed_samples_are_in_the_journal(tmp_path):
    w = ShardWriter(tmp_path)
    w.add(make_sample("j1"))
    w.add(make_sample("j2"))
    assert w.flush() == ["j1", "j2"]
    lines = (tmp_path / "shard-00000.journal").read_text().splitlines()
    recs = [json.loads(l) for l in lines]
    assert recs[0]["kind"] == "shard" and [r["rid"] for r in recs[1:]] == ["j1", "j2"]
    assert {t[0] for t in recs[1]["tensors"]} == {"layer_3", "final_norm", "token_ids"}
    w.close()
    assert leftovers(tmp_path) == []


def test_restart_skips_seen_rids_and_continues_numbering(tmp_path):
    with ShardWriter(tmp_path) as w:
        w.add(make_sample("a"))
    w = ShardWriter(tmp_path)
    assert w.seen("a") and "a" in w.rids and not w.seen("b")
    with pytest.raises(DuplicateRidError):
        w.add(make_sample("a"))
    w.add(make_sample("b"))
    assert w.seen("b")
    with pytest.raises(DuplicateRidError):
        w.add(make_sample("b"))
    w.close()
    assert read_index(tmp_path)["b"]["shard"] == "shard-00001.safetensors"
    assert verify_dir(tmp_path)["ok"]


def test_invalid_samples_are_rejected_and_writer_stays_usable(tmp_path):
    w = ShardWriter(tmp_path)
    with pytest.raises(ShardError):
        w.add(make_sample(""))
    with pytest.raises(ShardError, match="surrogate"):
        w.add(make_sample("bad\udc80"))
    s = make_sample("shape")
    s.num_tokens = 6
    with pytest.raises(ShardError, match="shape"):
        w.add(s)
    s = make_sample("slash")
    s.tensors["a/b"] = s.tensors.pop("layer_3")
    with pytest.raises(ShardError, match="name"):
        w.add(s)
    w.add(make_sample("ok"))
    w.close()
    assert list(read_index(tmp_path)) == ["ok"] and verify_dir(tmp_path)["ok"]


def test_second_writer_on_the_same_dir_is_refused(tmp_path):
    w = ShardWriter(tmp_path)
    with pytest.raises(ShardError, match="locked"):
        ShardWriter(tmp_path)
    w.add(make_sample("a"))
    w.flush()
    rep = verify_dir(tmp_path)  # a live writer's tmp/journal are in progress, not problems
    assert rep["ok"] and rep["in_progress"]
    w.close()
    ShardWriter(tmp_path).close()


# -- crash recovery (real processes) -------------------------------------------------------------


def test_sigkill_between_flush_and_close_recovers_flushed_samples(tmp_path):
    code = f"""
    import os, sys, time
    from hscapture.shards import ShardWriter
    w = ShardWriter({str(tmp_path)!r}, max_shard_bytes=1 << 20)
    for i in range(6):
        w.add(make_sample(f"f{{i}}", T=7, H=64))
        if i == 2:
            w.flush()
    assert w.flush() == [f"f{{i}}" for i in range(3, 6)]
    for i in range(3):
        w.add(make_sample(f"u{{i}}", T=7, H=64))   # written, never flushed
    print("READY", flush=True)
    time.sleep(60)
    """
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", SAMPLE_SRC + textwrap.dedent(code)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    assert sorted(leftovers(tmp_path)) == ["shard-00000.journal", "shard-00000.safetensors.tmp"]
    w = ShardWriter(tmp_path)
    assert leftovers(tmp_path) == []
    flushed = {f"f{i}" for i in range(6)}
    assert flushed <= w.rids
    lines = [json.loads(l) for l in (tmp_path / INDEX_NAME).read_text().splitlines()]
    assert sorted(l["rid"] for l in lines) == sorted(flushed)  # each once, unflushed dropped
    w.add(make_sample("after", T=7, H=64))
    w.close()
    assert read_index(tmp_path)["after"]["shard"] == "shard-00001.safetensors"
    for r in flushed:
        assert_same(load_sample(tmp_path, r), make_sample(r, T=7, H=64))
    rep = verify_dir(tmp_path)
    assert rep["ok"], rep["problems"]
    assert rep["samples"] == 7


_CRASH_IN_INDEX_APPEND = """
import os, signal, json
import hscapture.shard_index as shard_index
from hscapture.shards import ShardWriter
def crash(d, shard, entries, index, fsync):
    lines = [json.dumps({{**e.index, "shard": shard}}) + "\\n" for e in entries]
    with open(os.path.join(d, "index.jsonl"), "a") as f:
        f.write("".join(lines)[:{nchars}])   # a prefix of the index append, then death
    os.kill(os.getpid(), signal.SIGKILL)
w = ShardWriter({d!r})
w.add(make_sample("before"))
w.close()
shard_index.append_index = crash
w = ShardWriter({d!r})
for i in range(4):
    w.add(make_sample(f"c{{i}}"))
w.flush()
w.add(make_sample("c4"))   # unflushed, but close() journals it before the rename
w.close()
"""


@pytest.mark.parametrize("nchars", [0, 200, 10_000], ids=["no-line", "torn-line", "all-lines"])
def test_crash_after_rename_before_index_append(tmp_path, nchars):
    r = run_child(_CRASH_IN_INDEX_APPEND.format(d=str(tmp_path), nchars=nchars))
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert os.path.exists(tmp_path / "shard-00001.safetensors")  # renamed already
    assert leftovers(tmp_path) == ["shard-00001.journal"]
    w = ShardWriter(tmp_path)
    expect = ["before"] + [f"c{i}" for i in range(5)]
    assert sorted(w.rids) == sorted(expect)
    w.close()
    lines = (tmp_path / INDEX_NAME).read_text().splitlines()
    assert sorted(json.loads(l)["rid"] for l in lines) == sorted(expect)  # exactly once each
    for r in expect:
        assert_same(load_sample(tmp_path, r), make_sample(r))
    assert verify_dir(tmp_path)["ok"] and leftovers(tmp_path) == []


def test_tmp_without_journal_is_discarded(tmp_path):
    w = ShardWriter(tmp_path)
    w.add(make_sample("never-flushed"))
    del w  # dropped without close: nothing was reported durable
    assert leftovers(tmp_path) == ["shard-00000.safetensors.tmp"]
    assert not verify_dir(tmp_path)["ok"]
    w = ShardWriter(tmp_path)
    assert leftovers(tmp_path) == [] and not w.rids
    w.close()


# -- errors ------------------------------------------------------------------------------------


def test_unwritable_dir_raises_shard_error(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(ShardError) as ei:
        ShardWriter(f / "sub")
    assert str(f / "sub") in str(ei.value) and "Not a directory" in str(ei.value)
    with pytest.raises(ShardError, match="No such file or directory|Permission denied"):
        ShardWriter("/proc/hscapture-cannot-exist/x")


def _mount_tmpfs(path, opts):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {r.stderr.strip()}")


def test_unwritable_dir_read_only_mount_raises_shard_error(tmp_path):
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "ro,size=1M")
    try:
        with pytest.raises(ShardError, match="Read-only file system") as ei:
            ShardWriter(mnt)
        assert str(mnt) in str(ei.value)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def _check_full_disk_result(d, res, ok_rids, bad_rid, T, H):
    assert res["error"] is not None and bad_rid in res["error"]
    assert res["err_rid"] == bad_rid and res["closed"]
    assert set(res["durable"]) | set(res["flushed"]) == set(ok_rids)
    assert set(read_index(d)) == set(ok_rids)
    for r in ok_rids:
        assert_same(load_sample(d, r), make_sample(r, T=T, H=H))
    rep = verify_dir(d)
    assert rep["ok"], rep["problems"]
    assert leftovers(d) == []


_FILL_DISK = """
import json, os, resource, signal
from hscapture.shards import ShardWriter
from hscapture.errors import ShardError
{setup}
w = ShardWriter({d!r}, max_shard_bytes=1 << 30, header_reserve=16384)
res = {{"error": None, "flushed": [], "durable": [], "written": []}}
try:
    for i in range(1000):
        w.add(make_sample(f"s{{i}}", T={T}, H={H}))
        res["written"].append(f"s{{i}}")
        if i % 3 == 2:
            res["flushed"] += w.flush()
except ShardError as e:
    res["error"], res["err_rid"] = str(e), getattr(e, "rid", None)
res["closed"] = w.closed
res["durable"] = w.flush()
print(json.dumps(res))
"""


def test_full_disk_efbig_via_rlimit_fsize(tmp_path):
    T, H = 16, 256  # 16 KiB per sample
    setup = ("signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))")
    r = run_child(_FILL_DISK.format(setup=setup, d=str(tmp_path), T=T, H=H))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert "File too large" in res["error"] and "disk full" in res["error"]
    ok = res["written"]
    bad = f"s{len(ok)}"
    assert 5 < len(ok) < 20
    _check_full_disk_result(tmp_path, res, ok, bad, T, H)
    size = os.path.getsize(tmp_path / "shard-00000.safetensors")
    assert size <= 200_000  # the failed sample's partial bytes are gone


def test_full_disk_enospc_on_tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    _mount_tmpfs(mnt, "size=1M")
    try:
        T, H = 32, 512  # 64 KiB per sample
        r = run_child(_FILL_DISK.format(setup="", d=str(mnt), T=T, H=H))
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert "No space left on device" in res["error"]
        ok = res["written"]
        assert 5 < len(ok) < 16
        _check_full_disk_result(mnt, res, ok, f"s{len(ok)}", T, H)
        # the directory is usable again once there is room
        os.unlink(mnt / "shard-00000.safetensors")
        os.unlink(mnt / INDEX_NAME)
        with ShardWriter(mnt, header_reserve=16384) as w:
            w.add(make_sample("again"))
        assert verify_dir(mnt)["ok"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_add_after_close_raises(tmp_path):
    w = ShardWriter(tmp_path)
    w.close()
    with pytest.raises(ShardError, match="closed"):
        w.add(make_sample("a"))


# -- verify_dir ----------------------------------------------------------------------------------


def _two_shards(d):
    with ShardWriter(d, max_shard_bytes=1500) as w:
        for i in range(4):
            w.add(make_sample(f"v{i}", T=4, H=64))  # 1 KiB each → one per shard... two shards min
    assert verify_dir(d)["ok"]
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


def test_verify_dir_detects_truncated_shard(tmp_path):
    shards = _two_shards(tmp_path)
    p = tmp_path / shards[0]
    os.truncate(p, os.path.getsize(p) - 100)
    rep = verify_dir(tmp_path)
    assert not rep["ok"]
    assert any(shards[0] in pr and "safetensors" in pr for pr in rep["problems"])
    assert any("missing or unreadable" in pr for pr in rep["problems"])


def test_verify_dir_detects_corrupted_header(tmp_path):
    shards = _two_shards(tmp_path)
    p = tmp_path / shards[1]
    with open(p, "r+b") as f:
        f.seek(9)
        f.write(b"\xff\xfe garbage")
    rep = verify_dir(tmp_path)
    assert not rep["ok"] and any(shards[1] in pr for pr in rep["problems"])


def test_verify_dir_detects_duplicated_rid(tmp_path):
    _two_shards(tmp_path)
    with open(tmp_path / INDEX_NAME, "rb") as f:
        first = f.readline()
    with open(tmp_path / INDEX_NAME, "ab") as f:
        f.write(first)
    rep = verify_dir(tmp_path)
    assert not rep["ok"] and any("duplicated" in pr for pr in rep["problems"])


def test_verify_dir_detects_token_count_mismatch_and_unindexed_tensors(tmp_path):
    _two_shards(tmp_path)
    lines = (tmp_path / INDEX_NAME).read_text().splitlines()
    e = json.loads(lines[0])
    e["num_tokens"] += 1
    lines[0] = json.dumps(e)
    dropped = json.loads(lines.pop())["rid"]
    (tmp_path / INDEX_NAME).write_text("\n".join(lines) + "\n")
    rep = verify_dir(tmp_path)
    assert any("token_ids shape" in pr for pr in rep["problems"])
    assert any(dropped in pr and "not in index" in pr for pr in rep["problems"])


# -- property: arbitrary add/flush sequences round-trip ----------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.integers(0, 9), st.booleans()), min_size=1, max_size=12),
       limit=st.integers(200, 5000))
def test_any_add_flush_sequence_round_trips(tmp_path_factory, ops, limit):
    d = tmp_path_factory.mktemp("prop")
    samples, reported = [], []
    w = ShardWriter(d, max_shard_bytes=limit, fsync=False)
    for i, (T, fl) in enumerate(ops):
        s = make_sample(f"p{i}", T=T, H=16)
        samples.append(s)
        w.add(s)
        if fl:
            reported += w.flush()
    reported += w.close()
    assert sorted(reported) == sorted(s.rid for s in samples)
    for s in samples:
        assert_same(load_sample(d, s.rid), s)
    rep = verify_dir(d)
    assert rep["ok"], rep["problems"]
    assert rep["samples"] == len(samples)


def test_a_large_sample_written_by_several_threads_round_trips_bit_exact(tmp_path):
    # 2 layers x 2048 x 1024 bf16 = 8 MiB: split across two writer threads (4 MiB parts)
    big = make_sample("big", T=2048, H=1024, seed=7)
    small = make_sample("small", T=3, H=1024, seed=8)
    with ShardWriter(tmp_path, write_threads=3) as w:
        w.add(small)
        w.add(big)
        w.flush()
    for s in (small, big):
        got = load_sample(tmp_path, s.rid)
        for name, t in s.tensors.items():
            assert torch.equal(got[name], t), (s.rid, name)
        assert torch.equal(got["token_ids"], s.token_ids)
    assert verify_dir(tmp_path)["problems"] == []
