"""The C++ ring stress test under ThreadSanitizer, short version (the long run: scripts/tsan.sh).

Builds tests/cpp/ring_stress.cpp with -fsanitize=thread (into build/tsan-pytest, incremental)
and runs it: a producer thread, a durable subscription that detaches and resumes at random
points, and an anonymous consumer that re-registers, on one real segment. Fails on any
ThreadSanitizer report, lost/duplicated/reordered record or bad checksum.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tsan_toolchain_missing() -> str | None:
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            return f"{tool} not found on PATH (needed to build the C++ stress test)"
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "t.cpp"
        src.write_text("#include <thread>\nint main() { std::thread t([] {}); t.join(); }\n")
        res = subprocess.run(["g++", "-fsanitize=thread", "-pthread", str(src), "-o", str(Path(d) / "t")],
                             capture_output=True, text=True)
        if res.returncode != 0:
            return "g++ cannot link with -fsanitize=thread (libtsan missing?): " + res.stderr[-300:]
        run = subprocess.run([str(Path(d) / "t")], capture_output=True, text=True)
        if run.returncode != 0:
            return "a trivial ThreadSanitizer program fails here (ASLR/mmap layout?): " + run.stderr[-300:]
    return None


@pytest.mark.timeout(300)
def test_ring_stress_under_threadsanitizer_reports_no_race_and_no_lost_or_bad_record():
    reason = _tsan_toolchain_missing()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, HSCAPTURE_TSAN_BUILD_DIR=str(ROOT / "build" / "tsan-pytest"))
    res = subprocess.run(["bash", str(ROOT / "scripts" / "tsan.sh"), "2", "20000"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=280)
    out = res.stdout + res.stderr
    assert "WARNING: ThreadSanitizer" not in out, out[-6000:]
    assert res.returncode == 0, out[-6000:]
    assert res.stdout.count("ring_stress: OK") == 2, out[-6000:]
    assert "durable resumes 0 " not in res.stdout, "the durable consumer never detached/resumed"
