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
    # at a low priority (nice 10): this test's poll, waking, runs before the export's
    # next file whatever else loads the machine. At the same priority a loaded run's export
    # wrote every file left while the poll waited for a core, and the Ctrl-C reached a
    # finished export (exit 0: a run of the suite beside a busy process, 2 of 2 formats)
    return subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "hscapture", "export",
                             "-f", fmt, str(src), str(out), "--no-fsync", "-q", "--workers",
                             "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when_files_pass(p: subprocess.Popen, out: Path, fmt: str, n: int,
                     timeout: float = 120.0) -> int:
    """Once more than ``n`` final files are in place (polling the directory: the condition
    itself, not a guess at how long it takes), stop the export (SIGSTOP) and return how
    many there are, fewer than all: the export is still running, with files left to write,
    when the caller's signal reaches it (it continues with ``_resume``)."""
    end = time.monotonic() + timeout
    while True:
        if len(final_files(out, fmt)) > n:
            p.send_signal(signal.SIGSTOP)
            have = len(final_files(out, fmt))
            assert p.poll() is None and have < N, (
                "the export wrote every file before it could be stopped", have, p.returncode)
            return have
        assert p.poll() is None, ("the export ended before it could be stopped",
                                  p.returncode, p.stderr.read())
        assert time.monotonic() < end, "no new sample file within the timeout"
        time.sleep(0.002)


def _signal_stopped(p: subprocess.Popen, sig: int) -> None:
    """``sig`` to a stopped export, then let it go on (a SIGKILL needs no SIGCONT)."""
    p.send_signal(sig)
    p.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_an_export_killed_then_interrupted_resumes_and_every_sample_is_exact(
        shards, tmp_path, fmt):
    src, samples = shards
    out = tmp_path / "out"

    p = _start(src, out, fmt)
    _when_files_pass(p, out, fmt, 0)
    _signal_stopped(p, signal.SIGKILL)
    p.communicate(timeout=60)
    killed = every_final_file_exact(out, fmt, samples)
    assert 0 < killed < N, killed

    p = _start(src, out, fmt)
    _when_files_pass(p, out, fmt, killed)
    _signal_stopped(p, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, (p.returncode, err)
    assert "interrupted" in err and "rerun to resume" in err, err
    interrupted = every_final_file_exact(out, fmt, samples)
    assert killed < interrupted <= N

    p = _start(src, out, fmt)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    export_exact(out, fmt, samples)
