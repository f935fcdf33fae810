#!/usr/bin/env python3
"""Prompt throughput of a REAL SGLang server with capture on vs off, in adjacent pairs, same server.

Run as the client of ``.sgl/bin/serve.sh`` on the GPU host (see benchmarks/README.md):

    HSCAPTURE_ENDPOINT='ipc:///tmp/hscap-{dp_rank}.sock' HSCAPTURE_STATS_FILE=/tmp/hook.json \\
    HSCAPTURE_EXPERIMENT_FILE=/tmp/hook-mode \\
    bash .sgl/bin/serve.sh --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 \\
        --return-aux-hidden-state-layer-ids 0 1 2 --disable-radix-cache -- \\
        python3 benchmarks/bench_server.py --out $OUT/server.json

What is timed: the wall time from the first request sent to the last response received, for
one round: a fixed set of requests (``max_new_tokens=1``, greedy) sent with a fixed
concurrency; prompt tokens/s = prompt tokens / that time. "on" requests opt in (rid prefix
``hscap-``), "off" requests do not. Modes (all on the same server, same prompts every round):

- ``off``: nothing opts in (the baseline);
- ``on``: every request opts in and is captured;
- ``on:noop`` (default with ``HSCAPTURE_EXPERIMENT_FILE``): the requests opt in but the hook
  returns at once. This is the proxy for "plugin absent": comparing with a server without the
  plugin needs a restart (another process, another warm-up, other memory), which this bench
  cannot do on one server, so it does not pretend to (no ``--plugin-absent``).
  ``--experiments`` adds more hook modes (``nocapture``: everything but ``Producer.capture``;
  ``publisher``: capture, but only the producer's thread commits and announces, so the
  scheduler thread never pays for a commit or a notice, at the price of GIL hand-offs;
  ``grace=S``: capture with the producer's commit grace at S seconds instead of the hook's
  default, e.g. ``grace=0.005``, the value before the grace became longer than a step;
  ``nostage``: capture with one ring entry per forward (the hook's deferred captures off:
  ``HSCAPTURE_STAGE_INTERVAL_MS=0``), the default until the stage;
  ``nosnapstage``: deferred captures only where no snapshot is needed (forwards of SGLang's
  piecewise prefill graph are captured at once: bench_capture_call measured staging with a
  snapshot dearer than capturing at once, benchmarks/results/h200-2026-12-02e);
  ``devids``: capture with the token ids taken from the batch's device input_ids by a torch
  kernel, the default until the host ids, written by the CPU from each request's own array,
  measured better: benchmarks/results/h200-2026-12-02).

Statistics (benchmarks/_stats.py): after a discarded warm-up round of every mode, the number of
requests per round is calibrated on up to three more ``off`` rounds of the now warm server so
that an ``off`` round lasts about ``--round-s`` seconds (calibrating on the cold first round
made 1.5 s rounds last 0.2 s: one wave of requests, whose ramp and tail swamped the ratio; the
median round wall per mode is printed and recorded);
then ``--pairs`` blocks run, each block one adjacent pair (baseline, candidate) per candidate
mode, baseline-first and candidate-first alternating across blocks (ABBA), the candidates'
order rotating by one per block; before every round the bench waits for a fresh report of
the hook's stats file (up to ~1 s of tiny requests), so each round follows the same pause
(with pauses only at mode switches, the second candidate of a block beat the first in two
runs, whichever mode it was). Each pair gives
one ratio candidate/off from two rounds run back to back, so the server's slow drift (the
"off" rounds alone vary 10-20 % between rounds) largely cancels inside a pair. The goal
(``--goal``, default on/off >= 0.98) is judged on the LOWER END OF THE 95 % DISTRIBUTION-FREE
CONFIDENCE INTERVAL OF THE MEDIAN PAIRED RATIO (order statistics; its real coverage is
printed); the min-max of the ratios and a bootstrap interval are reported beside it, and the
stricter "whole spread" verdict too. With 20 pairs the interval runs from the 6th to the 15th
smallest ratio (95.9 %), about +-1.25 sigma/sqrt(20) x 1.96 ~ +-0.55 sigma: pairs whose ratios
scatter by 3 % resolve a 2 % difference, where the min-max of 5 long rounds never can. Time:
about pairs x candidates x 2 x (--round-s + ~1 s of settling) per mix.

``--load steady`` (:class:`SteadyLoad`) measures windows of ``--round-s`` seconds inside a
continuous load instead of rounds: a round ends with its last answer, so it carries the
ramp and the tail of one wave of requests, and in the short mix the "off" rounds alone varied
1.8x between adjacent rounds (H200, 1B, benchmarks/results/h200-2026-12-01f). Per
measurement: pause the load until nothing is in flight, switch the hook's mode, resume
under the new mode, wait until ``--concurrency`` of its requests were answered (the ramp),
then count the prompt tokens answered in the window. On the H200 (results h200-2026-12-01g),
``--concurrency 16`` (x 8 prompts): a measurement took ~5 s; the tiny server's pairs were tight
for one candidate (0.999-1.035) but not for ``noop`` (0.90-1.14); at 1B adjacent ``off``
windows varied 1.7x, probably because 16 in flight did not keep that faster server saturated
(untested); 64 made every pause drain for seconds.

``--alt N`` (with ``--load steady``, HSCAPTURE_FORWARD_LOG and HSCAPTURE_EXPERIMENT_FILE):
after the pairs, one window of ``--alt-s`` seconds in the hook mode ``alt=N`` (N prefill
passes captured, the next N skipped as ``off`` would, in turn), judged from the hook's forward
log by :func:`interleaved`: each captured block against the skipped blocks on both sides.
Windows of one mode cannot judge 2 % on the GPU host: with capture off alone the loop's turn
drifts 10-20 ms over seconds, and the scheduler-side ratios of 3 s windows swung 0.76-1.32
(benchmarks/results/h200-2026-12-03); blocks of 8 passes (~0.1 s at 1B) cancel that drift, and
60 s give ~350 ratios whose median's CI is +-0.3-0.5 %. Its requests opt in but only some are
captured (:func:`partial`): a sample that arrives must be exact, one that does not is no loss.
``--alt-log MS,...``: instead of that one window, ``--alt-repeat`` rounds of one window per
value, in turn, in the mode ``alt=N,log=MS`` (the hook's pass log interval MS ms, 0 = none):
the on/off ratio with and without the pass log, inside one server, their windows alternating.
``--alt-step BYTES,...`` the same for the deferred copies' per-step budget (the mode's
``step=BYTES``, instead of ``HSCAPTURE_COPY_STEP_BYTES``; ``0``: none): with ``--alt-log``, one
window per pair of values, in turn.

The client: ``--concurrency`` threads, each posting ``--batch`` prompts per HTTP request
(SGLang's batch ``/generate``). With one prompt per request the short mix measures the HTTP
front end (tokenizer manager and this Python client, ~800 requests/s) rather than the
scheduler: its "off" rounds varied 2x from round to round; with 8 per request they do not.

``--profile-dir DIR``: after each mix's pairs, one more ``off`` and one ``on`` round (with
``--load steady``: ``--profile-steps`` steps of the load in each mode, after its ramp) under
SGLang's own torch profiler (``POST /start_profile``), traces into ``DIR/<mix>-<mode>/``; the
hook is one ``hscapture.hook`` range in them. The hook's time per capturing forward, and the
part of it inside ``Producer.capture_rows``, is printed per mode at the end (HSCAPTURE_STATS_FILE).

A subscriber runs in another process for the whole run (zero-copy: it checks the token count
and a CRC of the token ids of every sample, releases it at once and copies no hidden state
out, so it keeps up). Before it stops it drains every ring up to the head the producer had
committed when the bench asked it to stop, and until every expected rid is delivered or
reported (deadline ``--drain-s``). The bench then counts: expected (the "on" rids), received,
reported (dropped / incomplete / rejected, by reason), missing = expected - received -
reported; missing > 0, a wrong sample or an unrequested one fails the run (exit 1), loudly.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.request
import zlib
from typing import Any, Iterable, Mapping, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _stats  # noqa: E402

MIXES = {"short": (200, 400), "long": (2500, 3500)}
def captures(mode: str) -> bool:
    """Whether a mode's requests are captured (so every one of their rids must be accounted
    for): ``on`` and every ``on:MODE`` of the hook (``publisher``, ``devids``, ``grace=S``,
    ``interval=S``, and any added later) but ``on:noop``, ``on:nocapture`` and the
    interleaved ``on:alt=N`` (:func:`partial`); not ``off``.
    (Listing the capturing modes instead once left ``on:interval=0``'s samples counted as
    unrequested, failing the run's account.)"""
    return mode == "on" or (mode.startswith("on:") and mode not in ("on:noop", "on:nocapture")
                            and not partial(mode))


def partial(mode: str) -> bool:
    """Whether a mode captures only some of its requests by design: ``on:alt=N`` (the hook
    captures N prefill passes, skips N, in turn). Its samples are optional: one that arrives
    must be exact, one that does not is no loss (:func:`verify`)."""
    return mode.startswith("on:alt=")


_CHILDREN: list[subprocess.Popen] = []


def post(url: str, payload: dict, timeout: float = 120.0, route: str = "generate") -> Any:
    req = urllib.request.Request(f"{url}/{route}", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if route == "generate" else body.decode(errors="replace")


def wait_for_trace(folder: str, timeout_s: float = 120.0) -> str | None:
    """The ``*.trace.json.gz`` SGLang's profiler writes into ``folder`` once its steps are
    done, when its size stopped changing (it is written by the scheduler); None at timeout."""
    deadline, last = time.monotonic() + timeout_s, (None, -1)
    while time.monotonic() < deadline:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".trace.json.gz")) \
            if os.path.isdir(folder) else []
        if names:
            path = os.path.join(folder, names[0])
            size = os.path.getsize(path)
            if last == (path, size) and size > 0:
                return path
            last = (path, size)
        time.sleep(0.5)      # polling a file another process writes: no event to wait on
    return None


def ids_crc(ids: Sequence[int]) -> int:
    """CRC-32 of the token ids as little-endian int32 (what the subscriber computes)."""
    import numpy as np
    return zlib.crc32(np.asarray(ids, dtype="<i4").tobytes())


def run_round(url: str, prompts: list[list[int]], rids: list[str], concurrency: int,
              batch: int = 1) -> tuple[float, list[Any]]:
    """Send every prompt (``batch`` prompts per HTTP request: SGLang's batch form of
    ``/generate``, one list of ``input_ids`` and one of ``rid``), ``concurrency`` HTTP
    requests in flight; return (wall seconds, output ids per prompt)."""
    outs: list = [None] * len(prompts)
    groups = [list(range(i, min(i + batch, len(prompts)))) for i in range(0, len(prompts), batch)]

    def one(g: list[int]) -> None:
        sampling = {"max_new_tokens": 1, "temperature": 0.0}
        if batch == 1:
            outs[g[0]] = post(url, {"input_ids": prompts[g[0]], "rid": rids[g[0]],
                                    "sampling_params": sampling}).get("output_ids")
            return
        got = post(url, {"input_ids": [prompts[i] for i in g], "rid": [rids[i] for i in g],
                         "sampling_params": sampling})
        for i, r in zip(g, got):
            outs[i] = r.get("output_ids")

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, groups))
    return time.perf_counter() - t0, outs


class SteadyLoad:
    """``--load steady``: ``concurrency`` HTTP requests in flight (``batch`` prompts each,
    cycling through ``prompts``), each tagged with the mode current when it was sent;
    throughput is measured over windows of time inside that steady load, not over rounds.

    Why: a round ends with its last response, so it carries the ramp-up and the tail of one
    wave of requests; in the short mix the "off" rounds alone ran at 133k-236k prompt
    tokens/s from one round to the next (H200, 1B, benchmarks/results/h200-2026-12-01f).

    One measurement (:meth:`pause`, switch the hook's mode, :meth:`resume`, :meth:`window`):
    ``pause`` stops sending and returns once nothing is in flight (so a hook-mode switch
    never catches a request of another mode: an "on" request served by a ``noop`` hook would
    be missing, an ``on:noop`` one served by a capturing hook unrequested); ``resume`` sends
    under the new mode and returns once ``concurrency`` of its requests were answered (about
    one turnover of the requests in flight: the ramp from the drained server is over);
    ``window`` counts the prompt tokens of that mode's requests answered during the window.
    ``on_sent(mode, rids, prompts)`` is called once per request before it is sent (the
    bench's account of what must be delivered); an HTTP error stops the load and is raised
    by the next call; :meth:`stop` waits for every request in flight."""

    def __init__(self, url: str, prompts: list[list[int]], concurrency: int, batch: int,
                 rid_of: Any, on_sent: Any = None) -> None:
        import threading

        self._url, self._prompts, self._batch = url, prompts, max(1, int(batch))
        self._rid_of, self._on_sent = rid_of, on_sent
        self._cond = threading.Condition()
        self._mode: str | None = None            # None: paused, nothing is sent
        self._next = 0
        self._inflight = 0
        self._done: list[tuple[float, str, int]] = []   # (perf_counter at answer, mode, tokens)
        self._error: BaseException | None = None
        self._stopping = False
        self.concurrency = max(1, int(concurrency))
        self._threads = [threading.Thread(target=self._worker, name=f"load-{i}", daemon=True)
                         for i in range(self.concurrency)]
        for t in self._threads:
            t.start()

    def pause(self, timeout_s: float = 300.0) -> float:
        """Send nothing more; return the seconds until no request was in flight."""
        t0 = time.perf_counter()
        with self._cond:
            self._mode = None
            if not self._cond.wait_for(lambda: self._error is not None or not self._inflight,
                                       timeout_s):
                raise TimeoutError(f"steady load: {self._inflight} requests still in flight "
                                   f"after {timeout_s:g} s")
            self._raise()
        return time.perf_counter() - t0

    def resume(self, mode: str, timeout_s: float = 300.0) -> float:
        """Send under ``mode``; return the seconds until ``concurrency`` of its requests were
        answered (the ramp-up, excluded from the next window)."""
        t0 = time.perf_counter()
        with self._cond:
            if self._inflight:
                raise RuntimeError("steady load: resume() without pause()")
            first = len(self._done)
            self._mode = mode
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._error is not None or
                                       len(self._done) - first >= self.concurrency, timeout_s):
                raise TimeoutError(f"steady load: fewer than {self.concurrency} {mode!r} "
                                   f"requests answered within {timeout_s:g} s")
            self._raise()
        return time.perf_counter() - t0

    def window(self, seconds: float) -> dict[str, Any]:
        """Measure for ``seconds`` (a timed wait on the load's condition: the measuring
        interval, nothing waits on it for correctness): :func:`window_rate` of the current
        mode over the window."""
        with self._cond:
            mode, t_a, first = self._mode, time.perf_counter(), len(self._done)
            if mode is None:
                raise RuntimeError("steady load: window() while paused")
            self._cond.wait_for(lambda: self._error is not None, max(0.0, seconds))
            t_b = time.perf_counter()
            self._raise()
            done = self._done[first:]
        return window_rate(done, mode, t_a, t_b)

    def stop(self, timeout_s: float = 300.0) -> None:
        """Send nothing more; wait for every request in flight (raises if one failed)."""
        with self._cond:
            self._stopping = True
            self._mode = None
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout_s)
        with self._cond:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"steady load: a request failed: {self._error!r}") from self._error

    def _worker(self) -> None:
        n = len(self._prompts)
        sampling = {"max_new_tokens": 1, "temperature": 0.0}
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._error is not None or
                                    self._mode is not None)
                if self._stopping or self._error is not None:
                    return
                mode, k = self._mode, self._next
                self._next += 1
                group = [self._prompts[(k * self._batch + j) % n] for j in range(self._batch)]
                rids = self._rid_of(mode, k, len(group))
                self._inflight += 1
                if self._on_sent is not None:
                    self._on_sent(mode, rids, group)
            try:
                if self._batch == 1:
                    post(self._url, {"input_ids": group[0], "rid": rids[0],
                                     "sampling_params": sampling})
                else:
                    post(self._url, {"input_ids": group, "rid": rids,
                                     "sampling_params": sampling})
            except BaseException as exc:    # noqa: BLE001 - recorded, raised by the caller
                with self._cond:
                    self._inflight -= 1
                    self._error = self._error or exc
                    self._cond.notify_all()
                return
            t = time.perf_counter()
            with self._cond:
                self._inflight -= 1
                self._done.append((t, mode, sum(map(len, group))))
                self._cond.notify_all()


# -- pure bookkeeping (tested in tests/test_bench_stats.py) --------------------------------

def pair_ratios(rounds: Sequence[Mapping[str, Any]], candidate: str, baseline: str = "off",
                key: str = "tok_per_s") -> list[float]:
    """One ratio ``candidate/baseline`` of ``key`` (default ``tok_per_s``, the client's
    prompt tokens/s) per pair: rounds carry ``pair`` (an id shared by the two rounds of a
    pair), ``mode`` and ``key``; pairs of other candidates are ignored. Raises ValueError for
    a pair that lacks either side."""
    by_pair: dict[Any, dict[str, float]] = {}
    for r in rounds:
        by_pair.setdefault(r["pair"], {})[r["mode"]] = float(r[key])
    out = []
    for pid, sides in by_pair.items():
        if candidate not in sides:
            continue
        if baseline not in sides or len(sides) != 2:
            raise ValueError(f"pair {pid!r}: expected one {baseline!r} and one {candidate!r} "
                             f"round, found {sorted(sides)}")
        out.append(sides[candidate] / sides[baseline])
    return out


def window_rate(done: Iterable[tuple[float, str, int]], mode: str | None, t_a: float,
                t_b: float) -> dict[str, Any]:
    """One steady-load window: of the answered requests ``(time, mode, prompt tokens)``,
    those of ``mode`` answered in ``[t_a, t_b]``; prompt tokens per second over the window's
    length. Raises ValueError for an empty or reversed window."""
    if not t_b > t_a:
        raise ValueError(f"window_rate: expected t_b > t_a, found [{t_a}, {t_b}]")
    n = tokens = 0
    for t, m, k in done:
        if m == mode and t_a <= t <= t_b:
            n += 1
            tokens += k
    return {"tok_per_s": tokens / (t_b - t_a), "wall_s": t_b - t_a, "requests": n,
            "tokens": tokens, "t_a": t_a, "t_b": t_b}


def scheduler_window(forwards: Any, t_a: float, t_b: float, full_tokens: int
                     ) -> dict[str, Any]:
    """What the scheduler itself did in one window ``[t_a, t_b]`` (``time.perf_counter``
    seconds: the clock of the hook's forward log, hscapture.sglang.timing.ForwardLog):

    - ``sched_tok_per_s``: the tokens of the prefill passes whose hook ran in the window,
      but the last, over the time from the first's hook to the last's: the loop's own
      throughput, which the HTTP front end's and this client's timing do not touch (an
      answer's arrival at the client does);
    - ``full_tok_per_s``: the median over FULL prefill passes (``tokens >= full_tokens``:
      the chunked-prefill budget filled) of tokens / the loop turn that followed (the next
      hook's entry minus this one's): the per-token cost at one fixed batch size, which a
      varying batch composition does not touch either;
    - ``forwards``, ``full_forwards``, ``hook_us_mean`` (the hook's wall time per pass),
      ``rows`` (captured rows), ``tokens_per_forward``.

    Raises ValueError when fewer than 3 prefill passes or no full one fell in the window."""
    import numpy as np

    f = forwards[(forwards["t_ns"] >= t_a * 1e9) & (forwards["t_ns"] <= t_b * 1e9)]
    f = f[np.argsort(f["t_ns"], kind="stable")]
    turns = np.diff(f["t_ns"])            # the loop turn after each pass but the last
    head = f[:-1]
    ext = head["extend"] == 1
    if ext.sum() < 2:
        raise ValueError(f"scheduler_window: {int(ext.sum())} prefill passes in "
                         f"[{t_a:.3f}, {t_b:.3f}] s; expected at least 2 (is the forward log "
                         f"flushed, and on this host's clock?)")
    span = f["t_ns"][-1] - f["t_ns"][0]
    full = ext & (head["tokens"] >= full_tokens) & (turns > 0)
    if not full.any():
        raise ValueError(f"scheduler_window: no prefill pass of >= {full_tokens} tokens in "
                         f"[{t_a:.3f}, {t_b:.3f}] s")
    per_token = head["tokens"][full] / turns[full] * 1e9
    return {"sched_tok_per_s": float(head["tokens"][ext].sum() / span * 1e9),
            "full_tok_per_s": float(np.median(per_token)),
            "forwards": int(len(f)), "full_forwards": int(full.sum()),
            "hook_us_mean": float(f["hook_ns"].mean() / 1e3), "rows": int(f["rows"].sum()),
            "tokens_per_forward": float(head["tokens"][ext].mean())}


def _verdict(s: Mapping[str, Any], goal: float) -> str:
    """One line of a :func:`_stats.pair_summary`: median, CI, min-max, and the goal's verdict
    where it was judged."""
    line = (f"median {s['median']:.4f}, {s['ci_coverage']:.1%} CI of the median "
            f"[{s['ci'][0]:.4f}, {s['ci'][1]:.4f}] (n={s['n']} pairs), min-max "
            f"[{s['min']:.3f}, {s['max']:.3f}]")
    if "met" in s:
        line += (f"; goal >= {goal:g} judged on {s['judged_on']}: "
                 f"{'MET' if s['met'] else 'MISSED'} (whole spread: "
                 f"{'met' if s['met_whole_spread'] else 'missed'})")
    return line


def full_batch_tokens(forwards: Any) -> int:
    """The tokens of the largest prefill pass in a forward log: under a saturating load,
    the chunked-prefill budget, the size :func:`scheduler_window` calls full."""
    ext = forwards["tokens"][forwards["extend"] == 1]
    if not len(ext):
        raise ValueError("full_batch_tokens: the forward log holds no prefill pass")
    return int(ext.max())


def interleaved(forwards: Any, t_a: float, t_b: float) -> dict[str, Any]:
    """Capture on vs off inside ONE window of the hook's ``alt=N`` mode (N prefill passes
    captured, the next N skipped, in turn; the forward log's ``phase`` is 1 or 2), from the
    passes whose hook ran in ``[t_a, t_b]`` (``time.perf_counter`` seconds).

    The passes fall into blocks (runs of one phase); the first and last block, which the
    window cuts, are left out. Each captured block is compared with the two skipped blocks
    around it, so a drift of the host's speed that is linear over three blocks cancels:
    ``ratio = cost(skipped neighbours) / cost(captured block)``, the throughput of capture
    on over capture off, one per captured block. A block's cost is per prefill token:

    - ``ratios`` (the overlap scheduler, SGLang's default): a pass costs its hook's own time
      plus the REST of the next loop turn (that turn minus the next hook's time). Under the
      overlap scheduler SGLang processes a batch's result in the turn after it launched the
      next batch, so what a capture adds there (a result copy queued behind the capture's
      copies, say) is charged to the pass that caused it; the hook's own time, stage writes
      included, to the pass it ran in.
    - ``ratios_unshifted``: a pass costs its own loop turn (the next hook's entry minus its
      own): right without the overlap scheduler, where a batch's result is processed in the
      same turn; under it, the captured block keeps N-1 of its N lagged effects and each
      skipped neighbour gets one, so the difference holds about (N-2)/N of them.

    Also ``blocks``, ``passes_per_block`` (median), the median turn (us) of captured and
    skipped prefill passes, ``hook_us_mean`` per pass on each side, ``rest_us_mean``: per
    pass on each side, the rest of its turn (its hook's exit to the next hook's entry), and
    ``outside_us_median``: per captured block, its passes' mean rest minus that of the
    skipped blocks on both sides (as the ratios are paired, so a drift cancels), the median.
    What a capture costs outside the forward hook's clock shows there (SGLang's own result
    lag too, (N-2)/N of it; on 2026-12-04 it showed the sweep hook processing the pass log
    at every scheduling step). Raises ValueError
    when the window holds fewer than 3 captured blocks with skipped ones on both sides."""
    import numpy as np

    f = forwards[(forwards["t_ns"] >= t_a * 1e9) & (forwards["t_ns"] <= t_b * 1e9)]
    f = f[np.argsort(f["t_ns"], kind="stable")]
    f = f[f["phase"] > 0]
    turns = np.diff(f["t_ns"]).astype(np.float64)
    hook = f["hook_ns"].astype(np.float64)
    # each pass but the last two: its own turn, and its hook + the next turn's rest
    own = turns[:-1]
    shifted = hook[:-2] + (turns[1:] - hook[1:-1])
    head = f[:-2]
    if len(head) < 2:
        raise ValueError(f"interleaved: {len(f)} passes of alt=N in [{t_a:.3f}, {t_b:.3f}] s")
    edges = np.concatenate(([0], np.flatnonzero(np.diff(head["phase"])) + 1, [len(head)]))
    rest = own - hook[:-2]           # a pass's turn outside its hook: exit to next entry
    blocks = []
    for a, b in zip(edges[:-1], edges[1:]):
        ext = head["extend"][a:b] == 1
        blocks.append((int(head["phase"][a]), int(head["tokens"][a:b][ext].sum()),
                       float(shifted[a:b].sum()), float(own[a:b].sum()), b - a,
                       float(rest[a:b].mean())))
    blocks = blocks[1:-1]
    ratios: list[float] = []
    unshifted: list[float] = []
    outside: list[float] = []
    for i in range(1, len(blocks) - 1):
        (p0, k0, s0, o0, _, r0), (p1, k1, s1, o1, _, r1), (p2, k2, s2, o2, _, r2) = \
            blocks[i - 1:i + 2]
        if p1 == 1 and p0 == 2 and p2 == 2 and k0 and k1 and k2:
            ratios.append(((s0 + s2) / (k0 + k2)) / (s1 / k1))
            unshifted.append(((o0 + o2) / (k0 + k2)) / (o1 / k1))
            outside.append(r1 - (r0 + r2) / 2)
    if len(ratios) < 3:
        raise ValueError(f"interleaved: {len(ratios)} captured blocks with skipped ones on "
                         f"both sides in [{t_a:.3f}, {t_b:.3f}] s; expected at least 3")
    ext = head["extend"] == 1
    on, off = ext & (head["phase"] == 1), ext & (head["phase"] == 2)
    return {"ratios": ratios, "ratios_unshifted": unshifted, "blocks": len(blocks),
            "passes_per_block": float(np.median([b[4] for b in blocks])),
            "turn_us_median": {"captured": float(np.median(own[on]) / 1e3),
                               "skipped": float(np.median(own[off]) / 1e3)},
            "hook_us_mean": {"captured": float(hook[:-2][on].mean() / 1e3),
                             "skipped": float(hook[:-2][off].mean() / 1e3)},
            "rest_us_mean": {"captured": float(rest[on].mean() / 1e3),
                             "skipped": float(rest[off].mean() / 1e3)},
            "outside_us_median": float(np.median(outside) / 1e3),
            "rows": int(head["rows"].sum())}


def reason_of(text: str) -> str:
    """A report's reason without the rid-specific tail (for counting by reason)."""
    for sep in (": missing", "; missing", " (", ", missing"):
        text = text.split(sep)[0]
    return text[:120]


def verify(expected: Mapping[str, tuple[int, int]], got: Mapping[str, Mapping[str, Any]],
           reports: Mapping[str, Mapping[str, str]], lost_events: int = 0,
           optional: Mapping[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The delivery account of a run.

    ``optional``: rid -> (token count, crc) of requests a :func:`partial` mode may or may not
    capture; one received must be exact (else it is ``wrong``), and is never unrequested.

    ``expected``: rid -> (token count, crc) of every opted-in, captured request; ``got``:
    rid -> {"n", "crc"} of every sample the subscriber received; ``reports``: kind
    (dropped / incomplete / rejected) -> {rid: reason}. Returns expected, received (of the
    expected), wrong (received with another count or crc), reported (expected rids not
    received but reported, by kind and reason), missing = expected - received - reported
    (rids, must be 0), unrequested (received, never expected), lost_events (sequence numbers
    reported lost without a rid) and ``ok``."""
    optional = optional or {}
    received = [r for r in expected if r in got]
    wrong = [r for r in received if (got[r]["n"], got[r]["crc"]) != tuple(expected[r])]
    got_optional = [r for r in optional if r in got and r not in expected]
    wrong += [r for r in got_optional if (got[r]["n"], got[r]["crc"]) != tuple(optional[r])]
    reported: dict[str, dict[str, int]] = {}
    told: set[str] = set()
    for kind, by_rid in reports.items():
        for rid, why in by_rid.items():
            if rid in expected and rid not in got:
                told.add(rid)
                k = reported.setdefault(kind, {})
                k[reason_of(why)] = k.get(reason_of(why), 0) + 1
    missing = [r for r in expected if r not in got and r not in told]
    unrequested = [r for r in got if r not in expected and r not in optional]
    return {"expected": len(expected), "received": len(received), "n_wrong": len(wrong),
            "optional": len(optional), "optional_received": len(got_optional),
            "wrong": wrong[:20], "reported": reported, "n_reported": len(told),
            "missing": len(missing), "missing_rids": missing[:20],
            "n_unrequested": len(unrequested), "unrequested": unrequested[:20],
            "lost_events": lost_events,
            "ok": not wrong and not missing and not unrequested}


# -- the subscriber process ------------------------------------------------------------------

def subscriber_main(endpoint: str, out: str, stop_file: str, drain_s: str = "120") -> None:
    """Check every sample cheaply (count + CRC of the ids, zero-copy, released at once) into a
    JSONL; when ``stop_file`` appears (it holds the JSON list of expected rids), drain every
    ring up to the head committed at that moment and until every expected rid is delivered or
    reported (or ``drain_s`` passed), then write the subscriber's reports and stop."""
    import numpy as np
    from hscapture import Subscriber

    def take(s: Any, f: Any) -> None:
        with s:   # a borrowed view (zero-copy) of the ring: released when the block ends
            ids = np.ascontiguousarray(s.token_ids.numpy(), dtype="<i4")
            f.write(json.dumps({"rid": s.rid, "n": s.num_tokens,
                                "crc": zlib.crc32(ids.tobytes())}) + "\n")
            got.add(s.rid)

    got: set[str] = set()
    with Subscriber(endpoint, zero_copy=True) as sub, open(out, "w") as f:
        sub.wait_ready(timeout=120)
        open(f"{stop_file}.ready", "w").close()
        while not os.path.exists(stop_file):
            s = sub.poll(timeout=0.2)
            if s is not None:
                take(s, f)
        expected: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:    # the stop file is written atomically (rename)
            try:
                with open(stop_file) as sf:
                    expected = json.load(sf)
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        # the producer's committed head now: everything below it must be read before we stop
        heads = {e: src.consumer.head for e, src in sub._sources.items()
                 if src.consumer is not None}
        t0 = time.monotonic()
        deadline = t0 + float(drain_s)
        why = f"deadline of {drain_s} s passed"
        while time.monotonic() < deadline:
            s = sub.poll(timeout=0.05)
            if s is not None:
                take(s, f)
                continue
            caught_up = all(src.consumer is None or src.consumer.position >= heads.get(e, 0)
                            for e, src in sub._sources.items())
            st = sub.stats()
            told = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])
            if caught_up and not st["ready"] and all(r in got or r in told for r in expected):
                why = "caught up with the producer's head; every expected rid accounted for"
                break
        st = sub.stats()
        f.write(json.dumps({"stats": {k: v for k, v in st.items() if k not in ("errors",)},
                            "drain": {"seconds": round(time.monotonic() - t0, 3),
                                      "heads": {f"{e:016x}": h for e, h in heads.items()},
                                      "ended": why}}, default=str) + "\n")


# -- the bench -----------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("SGLANG_URL", "http://127.0.0.1:30000"))
    ap.add_argument("--endpoint", default=None,
                    help="subscriber endpoint (default: HSCAPTURE_ENDPOINT, dp 0)")
    ap.add_argument("--mix", default="short,long")
    ap.add_argument("--pairs", "--reps", dest="pairs", type=int, default=20,
                    help="blocks of adjacent pairs (one pair per candidate mode per block)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", default="short=256,long=64",
                    help="requests per round and mix before calibration (the warm-up round)")
    ap.add_argument("--batch", default="short=8,long=1",
                    help="prompts per HTTP request, per mix (SGLang's batch /generate); with "
                         "1 the short mix measures the HTTP front end, not the scheduler")
    ap.add_argument("--load", choices=("rounds", "steady"), default="rounds",
                    help="rounds: a fixed set of requests per measurement, timed first sent to "
                         "last answered; steady: a continuous load, measured over windows of "
                         "--round-s seconds (SteadyLoad)")
    ap.add_argument("--round-s", type=float, default=1.0,
                    help="target seconds per 'off' round: the warm-up calibrates the number of "
                         "requests to it (0: use --requests as given)")
    ap.add_argument("--experiments", default="noop",
                    help="hook modes to add as candidates 'on:MODE' (need "
                         "HSCAPTURE_EXPERIMENT_FILE); noop = the plugin-absent proxy")
    ap.add_argument("--alt", type=int, default=0,
                    help="with --load steady, after the pairs: one window of --alt-s seconds "
                         "in the hook mode alt=N (N prefill passes captured, N skipped, in "
                         "turn), judged from the forward log (interleaved(); needs "
                         "HSCAPTURE_FORWARD_LOG and HSCAPTURE_EXPERIMENT_FILE)")
    ap.add_argument("--alt-s", type=float, default=60.0, help="seconds of the --alt window")
    ap.add_argument("--alt-log", default="",
                    help="comma-separated pass log intervals (ms; 0 = none): with --alt, one "
                         "window per value in the mode alt=N,log=MS, in turn, --alt-repeat "
                         "times, each of --alt-s seconds")
    ap.add_argument("--alt-step", default="",
                    help="comma-separated per-step budgets of the deferred copies (bytes, "
                         "K/M/G; 0 = none): with --alt, one window per value (per --alt-log "
                         "value and value) in the mode alt=N[,log=MS],step=BYTES, in turn")
    ap.add_argument("--alt-repeat", type=int, default=1,
                    help="rounds of the --alt-log / --alt-step windows")
    ap.add_argument("--goal", type=float, default=0.98, help="goal: on/off >= this")
    ap.add_argument("--drain-s", type=float, default=120.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn from [3, vocab)")
    ap.add_argument("--profile-dir", default=None,
                    help="after each mix's pairs, one 'off' and one 'on' round more under "
                         "SGLang's torch profiler (POST /start_profile, CPU+GPU, no stacks), "
                         "traces into DIR/<mix>-<mode>/ (benchmarks/server_trace.py reads them)")
    ap.add_argument("--profile-steps", type=int, default=40,
                    help="forward steps each profiled round records")
    ap.add_argument("--profile-stack", action="store_true",
                    help="record Python stacks too (with_stack: every Python call becomes an "
                         "event, so the scheduler runs several times slower under it; for "
                         "where the time goes INSIDE the hook, not for how long it takes)")
    args = ap.parse_args()

    endpoint = args.endpoint or os.environ.get("HSCAPTURE_ENDPOINT", "").replace("{dp_rank}", "0")
    exp_file = os.environ.get("HSCAPTURE_EXPERIMENT_FILE", "")
    stats_file = os.environ.get("HSCAPTURE_STATS_FILE", "")
    forward_log = os.environ.get("HSCAPTURE_FORWARD_LOG", "")
    if args.alt and not (args.load == "steady" and forward_log and exp_file):
        ap.error("--alt needs --load steady, HSCAPTURE_FORWARD_LOG and HSCAPTURE_EXPERIMENT_FILE")
    if args.alt_log and not (args.alt and all(
            v.isdigit() for v in args.alt_log.split(","))):
        ap.error(f"--alt-log: expected comma-separated whole milliseconds with --alt, found "
                 f"{args.alt_log!r}")
    if args.alt_step and not (args.alt and all(
            re.fullmatch(r"\d+[KMG]?", v) for v in args.alt_step.split(","))):
        ap.error(f"--alt-step: expected comma-separated byte counts (0, 65536, 48M) with "
                 f"--alt, found {args.alt_step!r}")
    nreq = dict(kv.split("=") for kv in args.requests.split(","))
    batch = {**{m: "1" for m in MIXES}, **dict(kv.split("=") for kv in args.batch.split(","))}
    rng = random.Random(args.seed)
    workdir = os.path.dirname(os.path.abspath(args.out))
    samples_file = os.path.join(workdir, "server-samples.jsonl")
    stop_file = os.path.join(workdir, "server-stop")
    for stale in (stop_file, f"{stop_file}.ready"):
        if os.path.exists(stale):
            os.unlink(stale)
    notes: list[str] = []
    experiments = [e for e in args.experiments.split(",") if e]
    if experiments and not exp_file:
        notes.append(f"hook modes {experiments} skipped: HSCAPTURE_EXPERIMENT_FILE is not set")
        print(f"[bench_server] {notes[-1]}", flush=True)
        experiments = []
    modes = ["off", "on"] + [f"on:{e}" for e in experiments]
    sub = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--subscribe", endpoint,
                            samples_file, stop_file, str(args.drain_s)])
    _CHILDREN.append(sub)

    def hook_stats() -> dict:
        try:
            with open(stats_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    current_mode = [None]

    def set_mode(mode: str) -> None:
        """Switch the hook's mode if it differs, then wait until the hook has written its
        stats file, naming that mode, AFTER this call began (the file is written at most
        once a second, on the scheduler's thread; tiny plain requests keep the server
        stepping until then). Every round starts this way, mode switch or not, so every
        round follows the same kind of pause (with a pause only before mode switches, the
        rounds after one ran differently from the rounds after none: a position effect)."""
        if not exp_file:
            return
        if current_mode[0] != mode:
            with open(exp_file, "w") as f:
                f.write(mode)
        since = time.time_ns()
        deadline = time.monotonic() + 30
        while True:
            try:
                fresh = os.stat(stats_file).st_mtime_ns > since
            except OSError:
                fresh = False
            if fresh and hook_stats().get("mode", "") == mode:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the hook did not report mode {mode!r} within 30 s "
                                 f"(stats file {stats_file!r})")
            post(args.url, {"input_ids": [5, 6, 7], "rid": f"plain-mode-{time.monotonic_ns()}",
                            "sampling_params": {"max_new_tokens": 1}})
        current_mode[0] = mode

    expected: dict[str, tuple[int, int]] = {}
    optional: dict[str, tuple[int, int]] = {}    # the partial (alt=N) modes' rids
    mixes: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while not os.path.exists(f"{stop_file}.ready"):   # the subscriber attached to the ring
        if time.monotonic() > deadline or sub.poll() is not None:
            raise SystemExit("the subscriber did not attach within 120 s")
        time.sleep(0.05)

    def one_round(mix: str, mode: str, tag: str, prompts: list[list[int]]) -> dict[str, Any]:
        set_mode(mode.partition(":")[2])
        rids = [f"{'hscap' if mode.startswith('on') else 'plain'}-{mix}-{mode.replace(':', '-')}"
                f"-{tag}-{i}" for i in range(len(prompts))]
        before = hook_stats().get("timing", {})
        t_a = time.perf_counter()
        dt, outs = run_round(args.url, prompts, rids, args.concurrency, int(batch[mix]))
        t_b = time.perf_counter()
        after = hook_stats().get("timing", {})
        if captures(mode):
            for r, p in zip(rids, prompts):
                expected[r] = (len(p), ids_crc(p))
        tokens = sum(map(len, prompts))
        return {"mode": mode, "tok_per_s": tokens / dt, "wall_s": dt, "outputs": outs,
                "t_a": t_a, "t_b": t_b,
                "hook": {"calls": after.get("calls", 0) - before.get("calls", 0),
                         "hook_ms": after.get("total_ms", 0) - before.get("total_ms", 0),
                         "p50_us": after.get("p50_us"), "p90_us": after.get("p90_us")}}

    def scheduler_side(mix: str, rounds: list[dict[str, Any]], res: dict[str, Any]) -> bool:
        """With a forward log (HSCAPTURE_FORWARD_LOG): each round's :func:`scheduler_window`
        merged into it (``sched_tok_per_s``, ``full_tok_per_s``, ...), once a fresh stats
        report says the log holds every pass so far. False (noted) without a log or when a
        round has no full pass."""
        if not forward_log:
            return False
        set_mode(current_mode[0] or "")       # a fresh report: the hook flushed its log
        from hscapture.sglang.timing import read_forward_log

        forwards = read_forward_log(forward_log)
        try:
            full = full_batch_tokens(forwards)
            for r in rounds:
                r.update(scheduler_window(forwards, r["t_a"], r["t_b"], full))
        except ValueError as exc:
            notes.append(f"{mix}: no scheduler-side figures: {exc}")
            print(f"[bench_server] {notes[-1]}", flush=True)
            return False
        res["full_batch_tokens"] = full
        res["forward_log_records"] = int(len(forwards))
        return True

    def alt_side(mix: str, windows: list[dict[str, Any]], res: dict[str, Any],
                 setting: str = "") -> None:
        """The ``--alt`` windows of one setting (``setting``: its mode options, e.g.
        ``log=50`` or ``log=50,step=48M``; "" for plain ``alt=N``) judged from the forward log (:func:`interleaved`, the windows'
        ratios pooled) into ``res["interleaved"]`` (``res["interleaved, log=MS"]``) and
        ``res["pairs"]["on/off [interleaved]"]`` (the goal's verdict; ``[interleaved,
        log=MS]``) and ``["on/off [interleaved, unshifted]"]`` (``[interleaved, log=MS,
        unshifted]``), printed."""
        set_mode(current_mode[0] or "")       # a fresh report: the hook flushed its log
        from hscapture.sglang.timing import read_forward_log

        label = "interleaved" + (f", {setting}" if setting else "")
        forwards = read_forward_log(forward_log)
        gots = []
        for window in windows:
            try:
                gots.append(interleaved(forwards, window["t_a"], window["t_b"]))
            except ValueError as exc:
                notes.append(f"{mix}: no {label} figures for a window: {exc}")
                print(f"[bench_server] {notes[-1]}", flush=True)
        if not gots:
            return
        got = gots[0] if len(gots) == 1 else {
            "ratios": [x for g in gots for x in g["ratios"]],
            "ratios_unshifted": [x for g in gots for x in g["ratios_unshifted"]],
            "blocks": sum(g["blocks"] for g in gots),
            "passes_per_block": _stats.median([g["passes_per_block"] for g in gots]),
            "turn_us_median": {side: _stats.median([g["turn_us_median"][side] for g in gots])
                               for side in ("captured", "skipped")},
            "hook_us_mean": {side: _stats.median([g["hook_us_mean"][side] for g in gots])
                             for side in ("captured", "skipped")},
            "rest_us_mean": {side: _stats.median([g["rest_us_mean"][side] for g in gots])
                             for side in ("captured", "skipped")},
            "outside_us_median": _stats.median([g["outside_us_median"] for g in gots]),
            "rows": sum(g["rows"] for g in gots), "per_window": [
                {k: v for k, v in g.items() if not k.startswith("ratios")} for g in gots]}
        res[label] = {"n": args.alt, "seconds": args.alt_s, "windows": windows,
                      **{k: v for k, v in got.items() if not k.startswith("ratios")}}
        for name, key, goal in ((label, "ratios", args.goal),
                                (f"{label}, unshifted", "ratios_unshifted", None)):
            res["pairs"][f"on/off [{name}]"] = s = _stats.pair_summary(
                got[key], goal, ">=", seed=args.seed)
            print(f"[bench_server] {mix}: on/off ({name}, alt={args.alt}, "
                  f"{got['blocks']} blocks of {got['passes_per_block']:g} passes) "
                  f"{_verdict(s, args.goal)}", flush=True)
        print(f"[bench_server] {mix}: {label} alt={args.alt} median turn captured / skipped "
              f"{got['turn_us_median']['captured']:.0f} / {got['turn_us_median']['skipped']:.0f}"
              f" us, hook per pass {got['hook_us_mean']['captured']:.0f} / "
              f"{got['hook_us_mean']['skipped']:.0f} us, rest of the turn outside the hook "
              f"{got['rest_us_mean']['captured']:.0f} / {got['rest_us_mean']['skipped']:.0f} "
              f"us (captured block - its neighbours, median {got['outside_us_median']:+.0f} us)",
              flush=True)

    #: what each paired ratio is of: the client's window, then the scheduler's own clock
    measures = {"tok_per_s": "client", "sched_tok_per_s": "scheduler",
                "full_tok_per_s": "scheduler, full passes"}

    def summarize(mix: str, rounds: list[dict[str, Any]], res: dict[str, Any]) -> None:
        """Per candidate and measure: the paired ratios' summary into ``res["pairs"]``
        (``cand/off`` for the client's tokens/s, ``cand/off [measure]`` for the others),
        printed."""
        sched = scheduler_side(mix, rounds, res)
        for cand in modes[1:]:
            for key, what in measures.items():
                if key == "tok_per_s" or sched:
                    name = f"{cand}/off" if key == "tok_per_s" else f"{cand}/off [{key}]"
                    res["pairs"][name] = s = _stats.pair_summary(
                        pair_ratios(rounds, cand, key=key),
                        args.goal if cand == "on" else None, ">=", seed=args.seed)
                    print(f"[bench_server] {mix}: {cand}/off ({what}) {_verdict(s, args.goal)}",
                          flush=True)

    def start_profile(folder: str, name: str) -> None:
        """SGLang's own torch profiler over the next ``--profile-steps`` forward steps."""
        post(args.url, {"output_dir": folder, "num_steps": args.profile_steps,
                        "activities": ["CPU", "GPU"], "with_stack": args.profile_stack,
                        "record_shapes": False, "profile_id": name}, route="start_profile")

    def steady_mix(mix: str, prompts: list[list[int]]) -> dict[str, Any]:
        """The pairs of one mix under a continuous load (``--load steady``): per measurement
        pause the load, switch the hook's mode, resume, wait out the ramp, measure a window
        of ``--round-s`` seconds. One warm-up measurement per mode first, discarded."""
        def rid_of(mode: str, k: int, n: int) -> list[str]:
            return [f"{'hscap' if mode.startswith('on') else 'plain'}-{mix}-"
                    f"{mode.replace(':', '-')}-s{k}-{i}" for i in range(n)]

        def on_sent(mode: str, rids: list[str], group: list[list[int]]) -> None:
            if captures(mode) or partial(mode):
                into = expected if captures(mode) else optional
                for r, p in zip(rids, group):
                    into[r] = (len(p), ids_crc(p))

        load = SteadyLoad(args.url, prompts, args.concurrency, int(batch[mix]), rid_of, on_sent)
        profiles: dict[str, Any] = {}

        def measure_window(mode: str, seconds: float) -> dict[str, Any]:
            drained = load.pause()
            set_mode(mode.partition(":")[2])
            ramp = load.resume(mode)
            r = load.window(seconds)
            r.update(mode=mode, drain_s=drained, ramp_s=ramp)
            return r

        def measure(mode: str) -> dict[str, Any]:
            return measure_window(mode, args.round_s)

        rounds: list[dict[str, Any]] = []
        alt_windows: dict[str, list[dict[str, Any]]] = {}    # setting ("log=MS,...") -> windows
        try:
            for m in modes:
                measure(m)
            print(f"[bench_server] {mix}: steady load, {args.concurrency} x {batch[mix]} "
                  f"prompts in flight, windows of {args.round_s:g} s; {args.pairs} blocks of "
                  f"pairs {modes[1:]} vs off", flush=True)
            for block, first, second in (_stats.abba_order(modes, args.pairs)
                                         if args.pairs > 0 else []):
                cand = second if first == "off" else first
                for mode in (first, second):
                    r = measure(mode)
                    r.update(block=block, pair=f"b{block}-{cand}")
                    rounds.append(r)
                ratio = pair_ratios(rounds[-2:], cand)[0]
                print(f"[bench_server] {mix} block {block:3d} {first:>8s} then {second:<8s} "
                      f"{cand}/off {ratio:.3f} ({rounds[-2]['requests']} / "
                      f"{rounds[-1]['requests']} requests answered)", flush=True)
            if args.alt:
                # one window per setting (its options: log=MS, step=BYTES), in turn
                settings = [",".join(o for o in (f"log={log}" if log else "",
                                                  f"step={step}" if step else "") if o)
                            for log in (args.alt_log.split(",") if args.alt_log else [""])
                            for step in (args.alt_step.split(",") if args.alt_step else [""])]
                several = bool(args.alt_log or args.alt_step)
                for _ in range(args.alt_repeat if several else 1):
                    for setting in settings:
                        name = f"alt={args.alt}" + (f",{setting}" if setting else "")
                        w = measure_window(f"on:{name}", args.alt_s)
                        alt_windows.setdefault(setting, []).append(w)
                        print(f"[bench_server] {mix}: {args.alt_s:g} s in mode {name} "
                              f"({w['requests']} requests answered)", flush=True)
            if args.profile_dir:
                # inside the same load: switch, wait out the ramp, then record the steps
                for mode in ("off", "on"):
                    folder = os.path.join(os.path.abspath(args.profile_dir), f"{mix}-{mode}")
                    load.pause()
                    set_mode("")
                    load.resume(mode)
                    start_profile(folder, f"{mix}-{mode}")
                    profiles[mode] = {"trace": wait_for_trace(folder)}
                    print(f"[bench_server] {mix}: profiled {mode} under the steady load, "
                          f"trace {profiles[mode]['trace']}", flush=True)
        finally:
            load.stop()
        res: dict[str, Any] = {"load": "steady", "prompt_pool": len(prompts),
                               "rounds": rounds, "pairs": {},
                               "median_window_tok_per_s": {
                                   m: _stats.median([r["tok_per_s"] for r in rounds
                                                     if r["mode"] == m]) for m in modes
                                   if rounds}}     # (--pairs 0: the --alt windows alone)
        if profiles:
            res["profiles"] = profiles
        if rounds:
            summarize(mix, rounds, res)
        for setting, windows in alt_windows.items():
            alt_side(mix, windows, res, setting)
        return res

    for mix in args.mix.split(","):
        lo, hi = MIXES[mix]

        def more(k: int) -> list[list[int]]:
            return [[rng.randrange(3, args.vocab) for _ in range(rng.randint(lo, hi))]
                    for _ in range(k)]

        prompts = more(int(nreq[mix]))
        if args.load == "steady":
            mixes[mix] = steady_mix(mix, prompts)
            continue
        # warm-up, discarded (the first round compiles and allocates)
        warm = {m: one_round(mix, m, "warmup", prompts) for m in modes}
        if args.round_s > 0:
            # calibrated on rounds of a WARM server: one cold round can take 10x as long
            # and would shrink every round to a fraction of --round-s (it did: 0.2 s rounds
            # for --round-s 1.5, where the ramp-up and the tail of the round dominate)
            for attempt in range(3):
                wall = one_round(mix, "off", f"calib{attempt}", prompts)["wall_s"]
                if 0.75 * args.round_s <= wall <= 1.33 * args.round_s:
                    break
                n = max(args.concurrency, int(len(prompts) * args.round_s / wall))
                prompts = prompts[:n] if n <= len(prompts) else prompts + more(n - len(prompts))
        tokens = sum(map(len, prompts))
        print(f"[bench_server] {mix}: {len(prompts)} requests ({tokens} prompt tokens) per "
              f"round, ~{args.round_s:g} s; {args.pairs} blocks of pairs {modes[1:]} vs off",
              flush=True)
        rounds: list[dict[str, Any]] = []
        for block, first, second in _stats.abba_order(modes, args.pairs):
            cand = second if first == "off" else first
            for mode in (first, second):
                r = one_round(mix, mode, f"b{block}", prompts)
                r.update(block=block, pair=f"b{block}-{cand}")
                del r["outputs"]
                rounds.append(r)
            ratio = pair_ratios(rounds[-2:], cand)[0]
            print(f"[bench_server] {mix} block {block:3d} {first:>8s} then {second:<8s} "
                  f"{cand}/off {ratio:.3f}", flush=True)
        res: dict[str, Any] = {"prompt_tokens": tokens, "requests": len(prompts),
                               "rounds": rounds, "pairs": {},
                               # warm-up rounds: their batches differ, so greedy ids may
                               # differ on near-tied logits (tests/server compares with
                               # equal batches)
                               "same_output_ids_warmup": warm["on"]["outputs"] ==
                               warm["off"]["outputs"],
                               "median_wall_s": {m: _stats.median([r["wall_s"] for r in rounds
                                                                   if r["mode"] == m])
                                                 for m in modes}}
        print(f"[bench_server] {mix}: median round wall (s) "
              f"{ {m: round(v, 3) for m, v in res['median_wall_s'].items()} }", flush=True)
        summarize(mix, rounds, res)
        if args.profile_dir:
            res["profiles"] = {}
            for mode in ("off", "on"):
                folder = os.path.join(os.path.abspath(args.profile_dir), f"{mix}-{mode}")
                set_mode("")
                start_profile(folder, f"{mix}-{mode}")
                r = one_round(mix, mode, "profile", prompts)
                trace = wait_for_trace(folder)
                res["profiles"][mode] = {"trace": trace, "wall_s": r["wall_s"],
                                         "tok_per_s": r["tok_per_s"]}
                print(f"[bench_server] {mix}: profiled {mode} round {r['wall_s']:.3f} s, "
                      f"trace {trace}", flush=True)
        mixes[mix] = res

    set_mode("")
    # ask the subscriber to drain and stop: the stop file names the rids it must account for
    tmp = f"{stop_file}.tmp"
    with open(tmp, "w") as f:
        json.dump(sorted(expected), f)
    os.replace(tmp, stop_file)
    try:
        sub.wait(timeout=args.drain_s + 60)
    except subprocess.TimeoutExpired:
        print("[bench_server] FAIL: the subscriber did not finish its drain", flush=True)
    got, tail = {}, {}
    with open(samples_file) as f:
        for line in f:
            rec = json.loads(line)
            if "stats" in rec:
                tail = rec
            else:
                got[rec["rid"]] = rec
    st = tail.get("stats", {})
    lost = sum(x.get("count", 0) for x in st.get("lost", []) if isinstance(x, dict))
    ver = verify(expected, got, {k: st.get(k, {}) for k in ("dropped", "incomplete",
                                                             "rejected")}, lost, optional)
    ver["subscriber"] = st
    ver["drain"] = tail.get("drain")
    print(f"[bench_server] samples: expected {ver['expected']}, received {ver['received']}, "
          f"reported {ver['n_reported']} {ver['reported']}, MISSING {ver['missing']}, "
          f"optional (alt=N) {ver['optional_received']} of {ver['optional']} received, wrong "
          f"{ver['n_wrong']}, unrequested {ver['n_unrequested']}, lost events (no rid) "
          f"{lost}; drain: {ver['drain']}", flush=True)
    if not ver["ok"]:
        print(f"[bench_server] FAIL: delivery account does not close: missing "
              f"{ver['missing_rids']}, wrong {ver['wrong']}, unrequested {ver['unrequested']}",
              flush=True)
    for mode, t in (hook_stats().get("timing", {}).get("by_mode") or {}).items():
        print(f"[bench_server] hook time per capturing forward, mode {mode or 'on'!r}: p50 "
              f"{t['hook']['p50_us']:.0f} us, p90 {t['hook']['p90_us']:.0f} (n={t['hook']['n']}); "
              f"inside Producer.capture_rows p50 {t['producer']['p50_us']:.0f} us, p90 "
              f"{t['producer']['p90_us']:.0f}; {t.get('producer_calls', '?')} producer calls "
              f"for {t.get('capturing_calls', '?')} capturing passes", flush=True)
    for key, c in sorted((hook_stats().get("turn_costs") or {}).items()):
        # HSCAPTURE_TURN_COSTS=1: per mode and alt=N side (1 captured, 2 skipped), what the
        # scheduler's process spent outside the hook's own clock per turn
        mode, _, side = key.partition("|")
        print(f"[bench_server] turn costs, mode {mode or 'on'!r} side {side}: {c['turns']} "
              f"turns; GC {c['gc_us_per_turn']:.1f} us a turn (of it gen 2 "
              f"{c['gc_gen2_us_per_turn']:.1f}; runs by generation {c['gc_runs']}); "
              f"publisher thread CPU {c['publisher_us_per_turn']:.1f} us a turn", flush=True)
    counters = hook_stats().get("counters") or {}
    if counters.get("sweep_calls"):
        # the sweep hook (SGLang's chunked-abort step) runs outside the forward hook's clock
        print(f"[bench_server] sweep hook, all modes: {counters['sweep_calls']} runs, mean "
              f"{counters['sweep_ns'] / counters['sweep_calls'] / 1e3:.0f} us", flush=True)
    goals = [{"name": f"server/{mix}/on_vs_off"
                      + ("" if name == "on/off" else "/" + name[len("on/off ["):-1]),
              **{k: v for k, v in s.items() if k != "values"}}
             for mix, r in mixes.items() for name, s in r["pairs"].items()
             if name.startswith("on/off")]
    _stats.write_record(
        args.out, benchmark="bench_server",
        timed_regions={"round": _stats.timed_region(
            ["every request of the round sent (concurrency --concurrency) until the last "
             "response received: tokenizer-less HTTP, scheduling, prefill, the hook, the copy "
             "into the ring, 1 sampled token"],
            ["the subscriber's work (another process)",
             "the settling before each round (hook mode switch, a fresh stats report)",
             "warm-up rounds"], "time.perf_counter")} if args.load == "rounds" else
        {"window": _stats.timed_region(
            ["--round-s seconds of a continuous load of --concurrency requests in flight, all "
             "of one mode; prompt tokens of the requests answered inside the window: "
             "tokenizer-less HTTP, scheduling, prefill, the hook, the copy into the ring, 1 "
             "sampled token"],
            ["the subscriber's work (another process)",
             "per measurement: the drain of the previous mode's requests, the hook mode "
             "switch and a fresh stats report, the ramp until --concurrency requests of the "
             "new mode were answered", "one warm-up measurement per mode"],
            "time.perf_counter")},
        results={"mixes": mixes, "verification": ver, "hook_final": hook_stats(),
                 "modes": modes, "goal_judged_on": "lower end of the 95 % distribution-free "
                 "confidence interval of the median paired ratio on/off"},
        config=vars(args), goals=goals,
        notes=notes + ["plugin absent is not measured (needs a server restart); on:noop (the "
                       "hook returns at once) is its proxy",
                       "each round's 'hook' calls/ms are differences of a stats file the "
                       "hook writes at most once a second, so they lag by up to 1 s; the "
                       "per-mode percentiles in results.hook_final.timing.by_mode are exact"])
    return 0 if ver["ok"] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--subscribe":
        subscriber_main(*sys.argv[2:6])
        sys.exit(0)
    try:
        sys.exit(main())
    finally:
        for child in _CHILDREN:
            if child.poll() is None:
                child.terminate()
        # the server back to production mode whatever happened: a run that died inside an
        # alt=N window once left the next step (tests/server) capturing every other block
        if os.environ.get("HSCAPTURE_EXPERIMENT_FILE"):
            with open(os.environ["HSCAPTURE_EXPERIMENT_FILE"], "w"):
                pass
