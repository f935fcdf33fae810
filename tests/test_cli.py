"""The ``hscapture`` command line beyond drain (drain is covered in test_capture.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import torch

from hscapture.sample import Sample
from hscapture.shards import ShardWriter


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hscapture", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _sample(rid: str) -> Sample:
    t = torch.randn(4, 8).to(torch.bfloat16)
    return Sample(rid=rid, producer_id="p", epoch=1, num_tokens=4,
                  token_ids=torch.arange(4, dtype=torch.int32), tensors={"layer_1": t},
                  layers=[1], layer_kinds=["residual"], dtype="bfloat16", hidden=8)


def test_inspect_passes_a_good_directory_and_fails_a_damaged_one(tmp_path):
    out = tmp_path / "shards"
    with ShardWriter(out) as w:
        for i in range(3):
            w.add(_sample(f"r{i}"))
    good = _run("inspect", str(out), cwd=tmp_path)
    assert good.returncode == 0 and "samples: 3" in good.stdout and "OK" in good.stdout
    shard = next(out.glob("*.safetensors"))
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 10)
    bad = _run("inspect", str(out), cwd=tmp_path)
    assert bad.returncode == 1 and "PROBLEM" in bad.stdout and "Traceback" not in bad.stderr


def test_cleanup_removes_the_segment_of_a_dead_producer_only(tmp_path):
    prefix = f"hscapture-clitest-{uuid.uuid4().hex[:8]}-"
    code = ("import sys, time; from hscapture import _ring; "
            "p = _ring.Producer(sys.argv[1], 4096, 2); print('up', flush=True); time.sleep(60)")
    dead = subprocess.Popen([sys.executable, "-c", code, prefix + "dead"], stdout=subprocess.PIPE,
                            text=True)
    live = subprocess.Popen([sys.executable, "-c", code, prefix + "live"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert dead.stdout.readline().strip() == "up" and live.stdout.readline().strip() == "up"
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        res = _run("cleanup", "--prefix", prefix, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert f"removed stale segment {prefix}dead" in res.stdout
        assert os.path.exists(f"/dev/shm/{prefix}live")
        assert not os.path.exists(f"/dev/shm/{prefix}dead")
    finally:
        live.kill()
        live.wait()
        for name in ("dead", "live"):
            if os.path.exists(f"/dev/shm/{prefix}{name}"):
                os.unlink(f"/dev/shm/{prefix}{name}")


def test_the_demo_command_captures_and_verifies_a_real_model(tmp_path):
    res = _run("demo", "--out", str(tmp_path / "demo"), "--requests", "6", "--chunk-size", "32",
               cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[demo] OK" in res.stdout
