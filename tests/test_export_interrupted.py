"""``hscapture export`` stopped by real signals mid-run, then rerun: SIGKILL once the first
sample file is in place, SIGINT (Ctrl-C) once another one is, then a run to the end. Every
final-named file is complete after each stop. Ctrl-C exits 130 and says a rerun resumes. The
last run keeps what is complete, writes the rest, and every sample reads back exactly through
the trainer's own loader.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from export_support import big_shards, every_final_file_exact, export_exact, final_files

N = 48                    # ~5 MB a sample file: the export runs long enough to be stopped in


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    return d, big_shards(d, N)


def _start(src: Path, out: Path, fmt: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hscapture", "export", "-f", fmt, str(src),
                             str(out), "--no-fsync", "-q", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when_files_pass(p: subprocess.Popen, out: Path, fmt: str, n: int,
                     timeout: float = 120.0) -> None:
    """Return once more than ``n`` final files are in place (polling the directory: the
    condition itself, not a guess at how long it takes), the export still running."""
    end = time.monotonic() + timeout
    while len(final_files(out, fmt)) <= n:
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
    killed = every_final_file_exact(out, fmt, samples)
    assert 0 < killed < N, killed

    p = _start(src, out, fmt)
    _when_files_pass(p, out, fmt, killed)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, (p.returncode, err)
    assert "interrupted" in err and "rerun to resume" in err, err
    interrupted = every_final_file_exact(out, fmt, samples)
    assert killed < interrupted <= N

    p = _start(src, out, fmt)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    export_exact(out, fmt, samples)
