"""Shared helpers for the capture tests, and a producer process they start for real.

``python capture_support.py produce SPEC_JSON`` runs a Producer in its own process: several
threads capture interleaved requests whose tensors are a pure function of the rid, so the
test process can regenerate the source tensors and compare bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def source(rid: str, tokens: int, hidden: int, layers: int, dtype: str = "bfloat16"):
    """The tensors and token ids a test producer captures for ``rid`` (deterministic)."""
    from hscapture.notice import rid_tag

    g = torch.Generator().manual_seed(rid_tag(rid) & (2**62 - 1))
    tensors = [torch.randn(tokens, hidden, generator=g).to(getattr(torch, dtype))
               for _ in range(layers)]
    ids = torch.randint(0, 50_000, (tokens,), generator=g, dtype=torch.int64)
    return tensors, ids


def assert_sample_exact(sample, rid: str, tokens: int, hidden: int, layers: list[int],
                        dtype: str = "bfloat16") -> None:
    tensors, ids = source(rid, tokens, hidden, len(layers), dtype)
    assert sample.rid == rid
    assert sample.num_tokens == tokens
    assert torch.equal(sample.token_ids.to(torch.int64), ids)
    for L, t in zip(layers, tensors):
        got = sample.tensors[f"layer_{L}"]
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got, t), f"{rid} layer {L} differs"


def start_producer(spec: dict, cwd: str | os.PathLike) -> subprocess.Popen:
    """Start ``produce(spec)`` in a new Python process (cwd outside the source tree)."""
    return subprocess.Popen([sys.executable, str(HERE / "capture_support.py"), "produce",
                             json.dumps(spec)], cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def produce(spec: dict) -> None:
    """Capture ``spec['requests']`` ([rid, tokens, chunk]) from ``spec['threads']`` threads.

    Prints one JSON line per event to stdout: ``ready`` (epoch), ``dropped`` rids, ``done``.
    ``spec['hold']``: after ``dropped``, wait until stdin is closed (or a line arrives) before
    closing the producer, so a test decides when the producer's end reaches the subscriber.
    """
    from hscapture import Producer

    hidden, layers = spec["hidden"], spec["layers"]
    p = Producer(spec["endpoint"], producer_id=spec.get("producer_id", "test"),
                 capacity=spec.get("capacity", 64 << 20), full_policy=spec.get("policy", "wait"),
                 wait_timeout_s=spec.get("wait_timeout_s", 20.0), sndhwm=spec.get("sndhwm", 1_000_000))
    print(json.dumps({"event": "ready", "epoch": p.epoch, "segment": p.segment}), flush=True)
    if not p.wait_for_consumers(spec.get("consumers", 1), timeout_s=30):
        print(json.dumps({"event": "no_consumer"}), flush=True)
        return
    if spec.get("unrequested"):
        # a warm-up pass and an unrequested row through the model adapter: no sample may result
        from hscapture.adapters.transformers import HiddenStateCapture
        from hscapture.demo import tiny_llama

        model = tiny_llama(layers=2, hidden=64)
        cap = HiddenStateCapture(model, p, [0])
        with torch.no_grad():
            model(torch.randint(0, 4096, (1, 12)))              # warm-up: outside request()
            ids = torch.randint(0, 4096, (1, 12))
            with cap.request([None], ids):                     # unrequested row
                model(ids)
        cap.close()
    requests = list(spec["requests"])
    dropped: list[str] = []
    lock = threading.Lock()

    def worker(mine: list) -> None:
        rng = random.Random(hash(tuple(r[0] for r in mine)))
        for rid, tokens, chunk in mine:
            tensors, ids = source(rid, tokens, hidden, len(layers), spec.get("dtype", "bfloat16"))
            starts = list(range(0, tokens, chunk))
            if spec.get("shuffle_chunks"):
                rng.shuffle(starts)
            for s in starts:
                e = min(tokens, s + chunk)
                ok = p.capture(rid, [t[s:e] for t in tensors], layers=layers, token_start=s,
                               is_last_chunk=e == tokens, token_ids=ids[s:e])
                if not ok:
                    with lock:
                        dropped.append(rid)
            time.sleep(rng.random() * spec.get("jitter_s", 0.0))

    n = spec.get("threads", 1)
    threads = [threading.Thread(target=worker, args=(requests[i::n],)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.flush()
    print(json.dumps({"event": "dropped", "rids": sorted(set(dropped))}), flush=True)
    if spec.get("hold"):
        sys.stdin.readline()     # stays up (ring attached) until the test closes our stdin
    if spec.get("linger_s"):
        time.sleep(spec["linger_s"])
    if spec.get("hard_exit"):
        print(json.dumps({"event": "done", "stats": {}}), flush=True)
        os._exit(0)
    stats = {k: v for k, v in p.stats().items() if isinstance(v, int)}
    p.close()
    print(json.dumps({"event": "done", "stats": stats}), flush=True)


def read_events(proc: subprocess.Popen, until: str, timeout: float = 60.0) -> dict:
    """Read the producer's JSON lines up to the first event named ``until``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"producer exited ({proc.poll()}) before {until!r}")
        event = json.loads(line)
        if event["event"] == until:
            return event
    raise TimeoutError(f"no {until!r} event within {timeout}s")


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(json.loads(sys.argv[2]))
