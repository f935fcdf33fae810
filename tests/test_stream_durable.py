"""A durable live stream (``hscapture.stream(name=...)``) whose trainer process dies: a real
trainer process takes K samples, pauses until the producer has captured everything (so the
feed is sure to prefetch), and SIGKILLs itself at the first sample after that with samples
taken out of the subscriber but not handed out. A second trainer process of the same name then gets
every sample the first did not hand out (the prefetched ones included), exact. No sample is
handed out twice, none is lost, and nothing is reported, while a real producer process keeps
capturing (``full_policy="wait"``) the whole time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_support import ProducerProc, _env, requests  # noqa: E402

HERE = Path(__file__).resolve().parent

TRAINER = r"""
import json, os, signal, sys
sys.path.insert(0, sys.argv[1])
import hscapture
from fault_support import check_exact
endpoint, sizes_file, log, kill_after, idle = sys.argv[2:7]
sizes = json.load(open(sizes_file))
kill_after = int(kill_after)
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
feed = hscapture.stream(endpoint, name="trainer", idle_timeout_s=float(idle), prefetch=8)
n = 0
for s in feed:
    check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
    os.write(fd, (s.rid + "\n").encode())     # unbuffered: in the kernel before the kill
    n += 1
    if n == kill_after:
        # the test answers once the producer has captured every request: from then on each
        # next() tops the buffer up from notices already sent
        print("paused", flush=True)
        sys.stdin.readline()
    elif kill_after and n > kill_after and feed.buffered > 0:
        os.kill(os.getpid(), signal.SIGKILL)  # a crash: no close, no acknowledgement
print(json.dumps(feed.report()))
"""


def _trainer(endpoint: str, sizes: Path, log: Path, kill_after: int,
             idle: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TRAINER, str(HERE), endpoint, str(sizes),
                             str(log), str(kill_after), str(idle)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def test_a_durable_stream_resumes_after_its_trainer_is_killed_with_nothing_lost_or_twice(
        endpoint, tmp_path):
    reqs = requests(400, seed=41, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps({r: t for r, t, _ in reqs}))
    p = ProducerProc({"endpoint": endpoint, "requests": reqs, "producer_id": "sd",
                      "consumers": 1, "interleave": 6, "capacity": 16 << 20,
                      "policy": "wait", "wait_timeout_s": 60.0, "close_on_stdin": True},
                     tmp_path)
    try:
        p.wait_event("ready")
        first = _trainer(endpoint, sizes, tmp_path / "first.log", kill_after=150, idle=30)
        assert first.stdout.readline().strip() == "paused", first.communicate(timeout=60)
        assert p.wait_event("captured", timeout=60)["dropped"] == []
        first.stdin.write("go\n")
        first.stdin.flush()
        out, err = first.communicate(timeout=180)
        assert first.returncode == -9, (first.returncode, out, err[-3000:])
        handed_first = (tmp_path / "first.log").read_text().split()
        assert 150 < len(handed_first) < len(reqs), len(handed_first)
        # the second trainer of the same name: everything the first did not hand out
        second = _trainer(endpoint, sizes, tmp_path / "second.log", kill_after=0, idle=3)
        out, err = second.communicate(timeout=180)
        assert second.returncode == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        handed_second = (tmp_path / "second.log").read_text().split()
        assert not set(handed_first) & set(handed_second), "a sample was handed out twice"
        assert len(handed_second) == len(set(handed_second)) == report["delivered"]
        assert set(handed_first) | set(handed_second) == {r for r, _, _ in reqs}
        for key in ("dropped", "incomplete", "rejected", "lost", "unresolved", "in_flight",
                    "undelivered"):
            assert not report[key], (key, report[key])
    finally:
        p.send()
        p.stop()
