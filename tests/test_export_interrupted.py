"""``hscapture export`` stopped by real signals mid-run, then rerun: SIGKILL once the first
sample file is in place, SIGINT (Ctrl-C) once another one is, then a run to the end. Every
final-named file is complete after each stop. Ctrl-C exits 130 and says a rerun resumes. The
last run keeps what is complete, writes the rest, and every sample reads back exactly through
the trainer's own loader.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from shard_support import make_sample, write_shards

from specforge.data.preprocessing import list_local_files
from specforge.runtime.data_plane.feature_store import load_feature_file
from speculators.train.data import ArrowDataset

N = 48
T, H = 512, 1024          # ~5 MB a sample file: the export runs long enough to be stopped in


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    samples = [make_sample(i, T=T + i, H=H) for i in range(N)]
    d = tmp_path_factory.mktemp("shards")
    write_shards(d, samples, max_shard_bytes=64 << 20)
    return d, samples


def _final_files(out: Path, fmt: str) -> list[Path]:
    if fmt == "specforge":
        return [Path(f) for f in list_local_files(str(out))] if out.exists() else []
    return sorted((out / "hidden_states").glob("hs_*.safetensors"))


def _index(f: Path, fmt: str) -> int:
    return int(f.name[len("data_"):-len(".ckpt")] if fmt == "specforge"
               else f.stem[len("hs_"):])


def _every_final_file_exact(out: Path, fmt: str, samples) -> int:
    files = _final_files(out, fmt)
    for f in files:
        s = samples[_index(f, fmt)]
        if fmt == "specforge":
            raw = load_feature_file(str(f))
            assert torch.equal(raw["hidden_state"][0], s.tensors["final_norm"]), f
            assert torch.equal(raw["aux_hidden_state"][0], torch.cat(
                [s.tensors[f"layer_{l}"] for l in (1, 3, 5)], dim=-1)), f
        else:
            got = load_file(str(f))
            assert torch.equal(got["token_ids"], s.token_ids.to(torch.int64)), f
            assert torch.equal(got["hidden_states"][:, 0], s.tensors["layer_1"]), f
    return len(files)


def _start(src: Path, out: Path, fmt: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hscapture", "export", "-f", fmt, str(src),
                             str(out), "--no-fsync", "-q", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when_files_pass(p: subprocess.Popen, out: Path, fmt: str, n: int,
                     timeout: float = 120.0) -> None:
    """Return once more than ``n`` final files are in place (polling the directory: the
    condition itself, not a guess at how long it takes), the export still running."""
    end = time.monotonic() + timeout
    while len(_final_files(out, fmt)) <= n:
        assert p.poll() is None, ("the export ended before it could be stopped",
                                  p.returncode, p.stderr.read())
        assert time.monotonic() < end, "no new sample file within the timeout"
        time.sleep(0.002)


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_an_export_killed_then_interrupted_resumes_and_every_sample_is_exact(
        shards, tmp_path, fmt):
    src, samples = shards
    out = tmp_path / "out"

    p = _start(src, out, fmt)
    _when_files_pass(p, out, fmt, 0)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    killed = _every_final_file_exact(out, fmt, samples)
    assert 0 < killed < N, killed

    p = _start(src, out, fmt)
    _when_files_pass(p, out, fmt, killed)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, (p.returncode, err)
    assert "interrupted" in err and "rerun to resume" in err, err
    interrupted = _every_final_file_exact(out, fmt, samples)
    assert killed < interrupted <= N

    p = _start(src, out, fmt)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert not [q for q in out.rglob("*") if q.name.endswith(".hscapture-tmp")]
    assert _every_final_file_exact(out, fmt, samples) == N
    if fmt == "speculators":
        ds = ArrowDataset(max_len=8192, datapath=str(out), on_missing="raise")
        assert len(ds) == N
        for i, s in enumerate(samples):
            item = ds[i]
            assert isinstance(item, dict), item     # a token-id mismatch comes back unavailable
            assert torch.equal(item["input_ids"], s.token_ids.to(torch.int64))
    else:
        assert len(list_local_files(str(out))) == N
    assert '"status": "complete"' in (out / "hscapture_export.json").read_text()
