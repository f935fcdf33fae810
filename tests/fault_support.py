"""Helpers for the guarantee and fault tests: producer processes driven by a JSON spec, drain
processes run through the real CLI, and exact checks of what arrived against the source.

``python fault_support.py produce SPEC_JSON`` runs one :class:`hscapture.Producer` in its own
process. Each request's tensors are a pure function of its rid (``source``), so any process
can regenerate a sample and compare it bit for bit. The producer prints one JSON line per
event on stdout (``ready``, ``started``, ``progress``, ``done``); it can wait for a line on
stdin before capturing (``start_on_stdin``) and before closing (``close_on_stdin``), so a test
sequences processes on conditions, never on sleeps.

Spec keys (defaults in brackets): ``endpoint``, ``producer_id`` [``"fault"``], ``capacity``
[16 MiB], ``policy`` [``"drop"``], ``wait_timeout_s`` [0], ``control_reserve`` [None],
``wait_for_subscribers`` [0], ``consumers`` (wait for that many live consumers before
capturing) [0], ``hidden`` [32], ``layers`` [[0, 1]], ``dtype`` [``"bfloat16"``],
``requests``: ``[[rid, tokens, chunk], ...]``, ``interleave`` (requests in flight at once,
their chunks captured in random order across them) [1], ``rate`` (requests per second, 0 =
as fast as possible) [0], ``aborts``: rids aborted after their first chunk [[]], ``seed``
[0], ``start_on_stdin`` [False], ``close_on_stdin`` [False], ``pause_after`` (after that
many requests: flush, print ``paused``, wait for a line on stdin) [None], ``pause_every``
(the same after every that many requests, unless none is left) [0], ``hard_exit``
(``os._exit`` instead of ``close()``) [False], ``commit_grace_s`` [the producer's],
``kill_unflushed`` (after the last capture, print ``unflushed`` with each capture's result
and SIGKILL itself before any flush) [False].
"""

from __future__ import annotations

import json
import os
import random
import threading
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HIDDEN = 32
LAYERS = [0, 1]


# -- the source of truth ---------------------------------------------------------------------


def source(rid: str, tokens: int, hidden: int = HIDDEN, layers: int = len(LAYERS),
           dtype: str = "bfloat16") -> tuple[list[torch.Tensor], torch.Tensor]:
    """The tensors and token ids a fault-test producer captures for ``rid`` (deterministic)."""
    from hscapture.notice import rid_tag

    g = torch.Generator().manual_seed(rid_tag(rid) & (2**62 - 1))
    tensors = [torch.randn(tokens, hidden, generator=g).to(getattr(torch, dtype))
               for _ in range(layers)]
    ids = torch.randint(0, 50_000, (tokens,), generator=g, dtype=torch.int64)
    return tensors, ids


def check_exact(tensors: dict[str, torch.Tensor], token_ids: torch.Tensor, rid: str, tokens: int,
                hidden: int = HIDDEN, layers: Iterable[int] = LAYERS,
                dtype: str = "bfloat16") -> None:
    """Raise AssertionError unless ``tensors``/``token_ids`` are exactly ``rid``'s source."""
    layers = list(layers)
    want, ids = source(rid, tokens, hidden, len(layers), dtype)
    assert token_ids.shape == (tokens,), f"{rid}: token_ids shape {tuple(token_ids.shape)}"
    assert torch.equal(token_ids.to(torch.int64), ids), f"{rid}: token ids differ"
    for L, t in zip(layers, want):
        got = tensors[f"layer_{L}"]
        assert got.dtype == t.dtype and got.shape == t.shape, \
            f"{rid} layer {L}: {got.dtype} {tuple(got.shape)}, expected {t.dtype} {tuple(t.shape)}"
        assert torch.equal(got, t), f"{rid} layer {L}: bytes differ from the source"


def requests(n: int, *, prefix: str = "r", seed: int = 0, tokens: tuple[int, ...] = (1, 3, 8, 20),
             chunks: tuple[int, ...] = (1, 4, 64)) -> list[list[Any]]:
    """``n`` requests ``[rid, tokens, chunk]`` with random sizes and chunking."""
    rng = random.Random(seed)
    return [[f"{prefix}-{i}", rng.choice(tokens), rng.choice(chunks)] for i in range(n)]


# -- endpoints and processes -----------------------------------------------------------------


def new_endpoint(name: str = "p") -> tuple[str, Path]:
    """A fresh ``ipc://`` endpoint in a new 0700 directory; returns (endpoint, directory)."""
    d = Path("/tmp") / f"hsc-fault-{uuid.uuid4().hex[:10]}"
    d.mkdir(mode=0o700)
    return f"ipc://{d}/{name}.sock", d


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class ProducerProc:
    """A producer process (``produce(spec)``; ``role="follow"``: a follower, ``follow(spec)``)
    and its JSON event stream."""

    def __init__(self, spec: dict[str, Any], cwd: str | os.PathLike, role: str = "produce"
                 ) -> None:
        self.spec = spec
        spec_file = Path(cwd) / f"spec-{uuid.uuid4().hex[:8]}.json"   # argv has a size limit
        spec_file.write_text(json.dumps(spec))
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "fault_support.py"), role, "@" + str(spec_file)],
            cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=_env())
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def poll_event(self, name: str) -> dict[str, Any] | None:
        """The event named ``name`` if it has arrived (never waits)."""
        with self._cond:
            return next((e for e in self.events if e["event"] == name), None)

    def count_events(self, name: str) -> int:
        """How many events named ``name`` have arrived (never waits)."""
        with self._cond:
            return sum(e["event"] == name for e in self.events)

    def wait_event(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The first event named ``name``, waiting up to ``timeout`` seconds for it."""
        with self._cond:
            found = self._cond.wait_for(
                lambda: self._eof or any(e["event"] == name for e in self.events), timeout)
            event = next((e for e in self.events if e["event"] == name), None)
        if event is not None:
            return event
        self.proc.poll()
        err = ""
        if self._eof:
            self.proc.wait(timeout=10)
            err = self.proc.stderr.read()
        raise AssertionError(f"producer: no {name!r} event within {timeout}s "
                             f"(exit {self.proc.returncode}); stderr: {err[-3000:]}")

    def send(self, line: str = "go") -> None:
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass   # it exited already; the caller's next wait_event says how

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        return rc

    def stop(self) -> None:
        """Make sure the process is gone (test teardown)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except Exception:
                pass


def start_drain(endpoints: list[str] | str, out_dir: str | os.PathLike, *extra: str,
                cwd: str | os.PathLike | None = None) -> subprocess.Popen:
    """``hscapture drain --json -q`` as a real process (its own process group)."""
    eps = [endpoints] if isinstance(endpoints, str) else endpoints
    args = [sys.executable, "-m", "hscapture", "drain", "--json", "-q", "-o", str(out_dir)]
    for ep in eps:
        args += ["-e", ep]
    return subprocess.Popen(args + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=cwd)


def drain_report(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, dict[str, Any], str]:
    """Wait for a drain process; (exit code, its --json report or {}, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    try:
        report = json.loads(out) if out.strip() else {}
    except json.JSONDecodeError:
        report = {"_unparsed": out}
    return proc.returncode, report, err


def wait_until(cond: Callable[[], Any], timeout: float, what: str, step: float = 0.02) -> Any:
    """Poll ``cond`` until it returns something truthy; AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def index_rids(out_dir: str | os.PathLike) -> list[str]:
    """Every rid in ``out_dir``'s index.jsonl, in order, duplicates kept (so a test sees them)."""
    path = Path(out_dir) / "index.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line)["rid"])
            except (json.JSONDecodeError, KeyError):
                pass   # a torn tail line: the writer repairs it on the next open
    return out


def durable_rids(out_dir: str | os.PathLike) -> list[str]:
    """rids made durable in ``out_dir`` so far: the index plus the open shards' journals
    (what a drain has flushed), duplicates kept."""
    out = index_rids(out_dir)
    for j in sorted(Path(out_dir).glob("*.journal")):
        try:
            text = j.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if d.get("kind") == "sample":
                out.append(d["rid"])
    return out


def verify_shards(out_dir: str | os.PathLike, sizes: dict[str, int], hidden: int = HIDDEN,
                  layers: Iterable[int] = LAYERS) -> int:
    """Check every sample in ``out_dir`` bit for bit against its source; returns the count."""
    from hscapture.reader import ShardSet

    reader = ShardSet(str(out_dir))
    n = 0
    for rid in reader.rids:
        s = reader.get(rid)
        check_exact({f"layer_{L}": s.layer(L) for L in layers}, s.token_ids, rid, sizes[rid],
                    hidden, layers)
        n += 1
    return n


def reported_rids(report: dict[str, Any]) -> set[str]:
    """rids a drain report names as not written (dropped / incomplete / rejected)."""
    out: set[str] = set()
    for key in ("dropped", "incomplete", "rejected", "in_flight"):
        out.update(report.get(key) or {})
    return out


def cleanup_segments(prefix: str) -> None:
    """Remove this test's shared-memory segments (stale ones, by their producer-id prefix)."""
    for f in Path("/dev/shm").glob(f"*{prefix}*"):
        try:
            f.unlink()
        except OSError:
            pass


# -- the producer process --------------------------------------------------------------------


def _emit(event: str, **kw: Any) -> None:
    print(json.dumps({"event": event, **kw}), flush=True)


def produce(spec: dict[str, Any]) -> None:
    """Capture ``spec['requests']`` (see the module docstring); print events."""
    from hscapture import Producer

    hidden = spec.get("hidden", HIDDEN)
    layers = spec.get("layers", LAYERS)
    dtype = spec.get("dtype", "bfloat16")
    p = Producer(spec["endpoint"], producer_id=spec.get("producer_id", "fault"),
                 capacity=spec.get("capacity", 16 << 20), full_policy=spec.get("policy", "drop"),
                 wait_timeout_s=spec.get("wait_timeout_s", 0.0),
                 control_reserve=spec.get("control_reserve"),
                 wait_for_subscribers=spec.get("wait_for_subscribers", 0),
                 wait_for_subscribers_s=spec.get("wait_for_subscribers_s", 30.0),
                 heartbeat_interval_s=spec.get("heartbeat_interval_s", 0.05),
                 max_consumers=spec.get("max_consumers", 8),
                 publish_interval_s=spec.get("publish_interval_s", 0.0),
                 **({"commit_grace_s": spec["commit_grace_s"]} if "commit_grace_s" in spec
                    else {}))
    _emit("ready", epoch=p.epoch, segment=p.segment, pid=os.getpid())
    if spec.get("consumers"):
        if not p.wait_for_consumers(spec["consumers"], timeout_s=60):
            _emit("no_consumer")
            return
    if spec.get("start_on_stdin"):
        sys.stdin.readline()
    rng = random.Random(spec.get("seed", 0))
    aborts = set(spec.get("aborts", ()))
    todo = [list(r) for r in spec["requests"]]
    interleave = max(1, int(spec.get("interleave", 1)))
    rate = float(spec.get("rate", 0))
    progress_every = int(spec.get("progress_every", 0))
    active: list[dict[str, Any]] = []
    dropped: set[str] = set()
    started = time.monotonic()
    done_requests = 0
    _emit("started")
    while todo or active:
        while todo and len(active) < interleave:
            rid, tokens, chunk = todo.pop(0)
            tensors, ids = source(rid, tokens, hidden, len(layers), dtype)
            active.append({"rid": rid, "tokens": tokens, "tensors": tensors, "ids": ids,
                           "starts": list(range(0, tokens, chunk)), "chunk": chunk, "n": 0})
        r = active[rng.randrange(len(active))]
        s = r["starts"].pop(0)
        e = min(r["tokens"], s + r["chunk"])
        ok = p.capture(r["rid"], [t[s:e] for t in r["tensors"]], layers=layers, token_start=s,
                       is_last_chunk=e == r["tokens"], token_ids=r["ids"][s:e])
        if not ok:
            dropped.add(r["rid"])
        r["n"] += 1
        finished = not r["starts"]
        if r["rid"] in aborts and not finished:
            p.abort(r["rid"], "test abort")
            finished = True
        if finished:
            active.remove(r)
            done_requests += 1
            if progress_every and done_requests % progress_every == 0:
                _emit("progress", requests=done_requests)
            every = int(spec.get("pause_every", 0))
            if done_requests == spec.get("pause_after") or (
                    every and done_requests % every == 0 and (todo or active)):
                p.flush()
                _emit("paused", requests=done_requests)
                sys.stdin.readline()          # the test says when to go on
                started = time.monotonic() - done_requests / rate if rate else started
            if rate:
                ahead = started + done_requests / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)   # pacing the load, not synchronization
    if spec.get("kill_unflushed"):
        _emit("unflushed", dropped=sorted(dropped))
        os.kill(os.getpid(), signal.SIGKILL)
    p.flush()
    stats = {k: v for k, v in p.stats().items() if isinstance(v, int)}
    _emit("captured", dropped=sorted(dropped), stats=stats)
    if spec.get("close_on_stdin"):
        sys.stdin.readline()
    if spec.get("hard_exit"):
        _emit("done", stats=stats)
        os._exit(0)
    p.close()
    _emit("done", stats=stats)


def follow(spec: dict[str, Any]) -> None:
    """An anonymous subscriber of ``spec['endpoint']`` in a process of its own, so that a
    test can stop it whole (SIGSTOP: its socket's I/O thread too, so what a producer sends it
    stays in that producer's queue). It reads until it has every rid of ``spec['first']``
    and has retired that incarnation, then prints ``followed``; it prints ``heard`` once a
    message of a new incarnation waits in its socket (it reads none: a trainer in a long
    step), then waits for a line on stdin, the key (``producer@epoch``) of an incarnation.
    It then reads until that incarnation was live in its ``stats()`` and is retired, and
    prints ``report``: the rids it got, those reported (``dropped``, ``incomplete``,
    ``rejected``) and its ``lost`` ranges."""
    import logging

    from hscapture import Subscriber

    logging.getLogger("hscapture").setLevel(logging.ERROR)   # (stderr is read at the end)
    sub = Subscriber(spec["endpoint"], producer_timeout_s=spec.get("producer_timeout_s", 1.0))
    got: set[str] = set()
    _emit("ready")
    first = set(spec["first"])
    deadline = time.monotonic() + 60
    while not first <= got or sub.stats()["producers"]:
        s = sub.poll(0.02)
        if s is not None:
            got.add(s.rid)
        if time.monotonic() > deadline:
            _emit("error", what="the first incarnation was not read and retired in 60 s")
            return
    _emit("followed")
    while not sub._sock.poll(50):   # (polls the socket for a message; reads none)
        pass
    _emit("heard")
    key = sys.stdin.readline().strip()
    seen = False
    deadline = time.monotonic() + 60
    while True:
        s = sub.poll(0.02)
        if s is not None:
            got.add(s.rid)
        live = key in sub.stats()["producers"]
        seen = seen or live
        if seen and not live:
            break
        if time.monotonic() > deadline:
            _emit("error", what=f"{key} was not heard and retired in 60 s", seen=seen)
            return
    st = sub.stats()
    _emit("report", got=sorted(got), dropped=sorted(st["dropped"]),
          incomplete=sorted(st["incomplete"]), rejected=sorted(st["rejected"]),
          lost=[dict(x) for x in st["lost"]])
    sub.close()


if __name__ == "__main__":
    arg = sys.argv[2]
    spec_arg = json.loads(Path(arg[1:]).read_text() if arg.startswith("@") else arg)
    if sys.argv[1] == "produce":
        produce(spec_arg)
    elif sys.argv[1] == "follow":
        follow(spec_arg)
