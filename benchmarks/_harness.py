"""What the benchmarks share besides arithmetic: child processes that talk JSON lines, a
consumer process that keeps a ring empty, and THE capture entry point.

Every benchmark captures through :func:`capture_forward` and nothing else: one
``Producer.capture_batch`` per forward pass (one ring entry, protocol v2), or with
``HSC_BENCH_CAPTURE_API=capture`` one ``Producer.capture`` per row, so every benchmark
measures the same entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.append(ROOT)   # an installed hscapture wins over the uncompiled checkout


# -- the capture entry point ------------------------------------------------------------------

@dataclass
class Row:
    """One request's chunk in a forward pass: ``tensors[i]`` is layer ``layers[i]``, ``[T, H]``."""

    rid: str
    tensors: Sequence[Any]
    token_ids: Any
    token_start: int = 0
    is_last_chunk: bool = True
    extra: Mapping[str, Any] | None = None
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors)


#: Which producer entry point :func:`capture_forward` uses: "batch" (default; one
#: ``Producer.capture_batch`` per forward pass = one ring entry) or "capture" (one
#: ``Producer.capture`` per row = one ring entry per row, the protocol-v1 way, for comparison).
CAPTURE_APIS = ("batch", "capture")
CAPTURE_API = os.environ.get("HSC_BENCH_CAPTURE_API", "batch")
if CAPTURE_API not in CAPTURE_APIS:
    raise RuntimeError(f"HSC_BENCH_CAPTURE_API: expected one of {CAPTURE_APIS}, found "
                       f"{CAPTURE_API!r}")

#: How :func:`capture_forward` found the forward's source blocks, per call (a benchmark may
#: print it): "single" (one row: its own tensors), "shared" (every row is a row-slice of the
#: same per-layer tensors: those are the blocks, no copy), "packed" (rows concatenated per
#: layer first: one extra copy per forward, inside the timed region).
BLOCK_SOURCES: dict[str, int] = {"single": 0, "shared": 0, "packed": 0}


def capture_forward(producer: Any, rows: Sequence[Row], *, layers: Sequence[int],
                    layer_kinds: Sequence[str] | None = None, snapshot: bool = False
                    ) -> list[bool]:
    """Capture one forward pass's ``rows`` into ``producer``; one bool per row (True = into
    the ring, False = dropped and announced).

    "batch" (default): ONE ``Producer.capture_batch`` call, built the way the SGLang hook
    builds it — producer ``Row`` objects pointing at token rows of shared source blocks (one block
    per layer, default layer map). ``capture_batch`` decides for the whole entry, so every row
    gets its result (an entry too large for the ring is split by the producer; if a part of it
    was dropped all rows read False: committed bytes are then under-, never over-counted).
    "capture": one ``Producer.capture`` per row.
    """
    if not rows:
        return []
    if CAPTURE_API == "capture":
        return [producer.capture(r.rid, r.tensors, layers=layers, layer_kinds=layer_kinds,
                                 token_start=r.token_start, is_last_chunk=r.is_last_chunk,
                                 token_ids=r.token_ids, snapshot=snapshot, extra=r.extra)
                for r in rows]
    from hscapture.producer import Row as BatchRow

    blocks, token_ids, starts = _forward_blocks(rows)
    batch = [BatchRow(r.rid, start, int(r.tensors[0].shape[0]), r.token_start,
                      r.is_last_chunk, 0, r.extra)
             for r, start in zip(rows, starts)]
    ok = producer.capture_batch(batch, blocks, layers=layers, layer_kinds=layer_kinds,
                                token_ids=token_ids, snapshot=snapshot)
    return [bool(ok)] * len(rows)


def _forward_blocks(rows: Sequence[Row]) -> tuple[list[Any], Any, list[int]]:
    """``(blocks, token_ids, src_start per row)`` for one ``capture_batch`` call."""
    if len(rows) == 1:
        BLOCK_SOURCES["single"] += 1
        return list(rows[0].tensors), rows[0].token_ids, [0]
    n_layers = len(rows[0].tensors)
    shared = [_row_slices([r.tensors[i] for r in rows]) for i in range(n_layers)]
    if all(x is not None for x in shared) and all(x[1] == shared[0][1] for x in shared):
        starts = shared[0][1]
        ids = _row_slices([_as_tensor(r.token_ids) for r in rows], dims=1)
        if ids is not None and ids[1] == starts:
            token_ids = ids[0]
        else:   # the ids are separate arrays: lay them out at the rows' source positions
            token_ids = _ids_at(rows, starts, int(shared[0][0].shape[0]))
        if token_ids is not None:
            BLOCK_SOURCES["shared"] += 1
            return [x[0] for x in shared], token_ids, starts
    import torch

    BLOCK_SOURCES["packed"] += 1
    blocks = [torch.cat([r.tensors[i] for r in rows]) for i in range(n_layers)]
    token_ids = torch.cat([_as_tensor(r.token_ids).reshape(-1).to("cpu") for r in rows])
    starts, at = [], 0
    for r in rows:
        starts.append(at)
        at += int(r.tensors[0].shape[0])
    return blocks, token_ids, starts


def _as_tensor(x: Any) -> Any:
    import numpy as np
    import torch

    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))


def _row_slices(ts: Sequence[Any], dims: int = 2) -> tuple[Any, list[int]] | None:
    """If every tensor of ``ts`` is a slice of whole rows of ONE contiguous base tensor:
    ``(base, first row of each)``; else None."""
    first = ts[0]
    base = first._base if first._base is not None else first
    if base.dim() != dims or not base.is_contiguous():
        return None
    row = base.stride(0)
    starts = []
    for t in ts:
        own = t._base if t._base is not None else t
        if own is not base or t.dim() != dims or t.shape[1:] != base.shape[1:] or \
                (t.shape[0] > 1 and t.stride() != base.stride()):
            return None
        d = t.storage_offset() - base.storage_offset()
        if d % row:
            return None
        starts.append(d // row)
    return base, starts


def _ids_at(rows: Sequence[Row], starts: list[int], length: int) -> Any:
    """Token ids ``[length]`` holding each row's ids at its source rows; None if two rows put
    different ids at one position."""
    import torch

    out = torch.zeros(length, dtype=torch.int32)
    seen = torch.zeros(length, dtype=torch.bool)
    for r, s in zip(rows, starts):
        ids = _as_tensor(r.token_ids).reshape(-1).to("cpu", torch.int32)
        e = s + int(ids.numel())
        if bool((seen[s:e] & (out[s:e] != ids)).any()):
            return None
        out[s:e] = ids
        seen[s:e] = True
    return out


def committed_rows(ok: Sequence[bool], stats_before: Mapping[str, Any],
                   stats_after: Mapping[str, Any]) -> int:
    """Rows that are committed in the ring, after ``Producer.flush()``: accepted rows minus
    those dropped later (a failed copy or commit turns an accepted row into a drop)."""
    accepted = sum(bool(x) for x in ok)
    refused = len(ok) - accepted
    dropped = int(stats_after.get("dropped", 0)) - int(stats_before.get("dropped", 0))
    return accepted - max(0, dropped - refused)


# -- child processes --------------------------------------------------------------------------

def emit(**event: Any) -> None:
    """One JSON event line on stdout (the child's side of :func:`read_event`)."""
    print(json.dumps(event), flush=True)


def spawn(script: str, role: str, spec: Mapping[str, Any], *,
          env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """``python script role JSON`` with pipes: every benchmark child starts the same way."""
    return subprocess.Popen([sys.executable, os.path.abspath(script), role, json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env=None if env is None else {**os.environ, **env})


def read_event(proc: subprocess.Popen, want: str, timeout: float = 600.0) -> dict[str, Any]:
    """Read JSON lines from a child until event ``want``; other lines are echoed. Raises
    RuntimeError when the child reports an error or exits first, TimeoutError after
    ``timeout`` seconds (checked between lines)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child {proc.args[2] if len(proc.args) > 2 else proc.args} "
                               f"exited with {proc.wait()} before event {want!r}")
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            print(f"  [child] {line.rstrip()}", flush=True)
            continue
        if not isinstance(ev, dict):
            print(f"  [child] {line.rstrip()}", flush=True)
            continue
        if ev.get("event") == "error":
            raise RuntimeError(f"child failed: {ev.get('message')}")
        if ev.get("event") == want:
            return ev
    raise TimeoutError(f"no {want!r} event within {timeout:g}s")


def stop_child(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """Close the child's stdin (children exit on EOF) and wait; kill it after ``timeout``."""
    try:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()
    except OSError:
        pass
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def child_main(roles: Mapping[str, Any]) -> bool:
    """If argv is ``script _role JSON``, run that role and return True (the caller exits)."""
    if len(sys.argv) > 2 and sys.argv[1].startswith("_"):
        role, spec = sys.argv[1], json.loads(sys.argv[2])
        try:
            roles[role](spec)
        except Exception as exc:
            emit(event="error", message=f"{role}: {type(exc).__name__}: {exc}")
            raise
        return True
    return False


def child_consume(spec: Mapping[str, Any]) -> None:
    """A subscriber that takes every sample and releases it at once (keeps the ring empty);
    exits when stdin closes, reporting what it received and what it was told was lost."""
    from hscapture import Subscriber

    stop = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        stop.set()
    threading.Thread(target=watch, daemon=True).start()
    n = nbytes = 0
    with Subscriber(spec["endpoint"]) as sub:
        emit(event="ready")
        while not stop.is_set():
            s = sub.poll(timeout=0.05)
            if s is not None:
                n += 1
                nbytes += s.nbytes
                s.release()
        sub.pump(0.2)
        st = sub.stats()
        emit(event="done", samples=n, bytes=nbytes,
             **{k: (len(st[k]) if isinstance(st.get(k), (dict, list)) else st.get(k))
                for k in ("dropped", "incomplete", "rejected", "lost_notices") if k in st})


def unique_producer(tag: str) -> tuple[str, str]:
    """``(endpoint, producer_id)`` no other run uses."""
    import random

    from hscapture.endpoint import default_endpoint

    pid = f"bench-{tag}-{os.getpid()}-{random.randrange(1 << 30):x}"
    return default_endpoint(pid), pid


# -- model shapes -------------------------------------------------------------------------------

#: Llama shapes the GPU benchmarks use (random weights; only the shape matters here).
#: "1b": Llama-3.2-1B; "8b": Llama-3.1-8B; "tiny": a CPU dry run that checks the code path.
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "1b": dict(hidden=2048, num_layers=16, intermediate=8192, heads=32, kv_heads=8,
               vocab=128256),
    "8b": dict(hidden=4096, num_layers=32, intermediate=14336, heads=32, kv_heads=8,
               vocab=128256),
    "tiny": dict(hidden=256, num_layers=4, intermediate=512, heads=8, kv_heads=4, vocab=4096),
}


def aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's aux layers for a model of ``num_layers``: 2, L/2, L-3 (distinct, sorted)."""
    return sorted({min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3)})


def parse_mixes(text: str) -> list[tuple[int, int, int]]:
    """``"1x4096,8x64-4096"`` -> ``[(1, 4096, 4096), (8, 64, 4096)]``: (requests, min tokens,
    max tokens) per batch mix."""
    out = []
    for part in text.split(","):
        b, _, t = part.strip().partition("x")
        lo, _, hi = t.partition("-")
        out.append((int(b), int(lo), int(hi or lo)))
    return out
