"""The hook's benchmark modes (``benchmarks/bench_server.py``): a file names one mode, the hook
reads it at most every 100 ms, and each mode sets the producer's policies or what a pass does.

Nothing here runs unless ``HSCAPTURE_EXPERIMENT_FILE`` names such a file. The modes:

- ``""``: capture as configured;
- ``noop``: the hook returns at once (the plugin-absent proxy);
- ``nocapture``: everything but ``Producer.capture_rows``;
- ``publisher``: the producer's thread alone commits and announces;
- ``devids``: token ids taken from the batch's device ``input_ids`` by one torch kernel (the
  default before the host ids; benchmarks/results/h200-2026-12-02);
- ``grace=S``: the producer's commit grace is S seconds instead of the hook's;
- ``interval=S``: its publish interval is S seconds instead of the configured one;
- ``nostage``: one ring entry per forward (no deferred captures); ``nosnapstage``: deferred
  only when no snapshot is needed (graph outputs are captured at once);
- ``alt=N``: capture N prefill passes, skip the next N as ``off`` would, in turn: both sides
  of the on/off comparison inside one window (``bench_server --alt``); the forward log's
  ``phase`` says which side each pass was on (:meth:`BenchModes.side`).

The hook itself reads the mode names that change what a pass does (``noop``, ``nocapture``,
``devids``, ``nostage``, ``nosnapstage``); :meth:`BenchModes.apply` sets the producer's
policies for the rest.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import CaptureConfigError
from .config import step_bytes

__all__ = ["ALT_QUIET_S", "BenchModes"]

#: during ``alt=N``: the producer's commit grace and heartbeat interval, longer than any block,
#: so the publisher thread does not commit, announce or write the stage inside a skipped block
#: (in plain ``on`` mode the scheduler's thread does all three inline; they must land in the
#: capturing blocks, where ``on`` pays them). Heartbeats cost both modes alike.
ALT_QUIET_S = 1.0


class BenchModes:
    """The benchmark mode of one hook: :meth:`read` it at each pass, :meth:`apply` it to the
    producer, and under ``alt=N`` ask :meth:`side` which side a pass is on.

    ``commit_grace_s``: the hook's own commit grace, restored when a mode stops setting it.
    """

    def __init__(self, path: str, commit_grace_s: float) -> None:
        self.path = path
        #: the current mode's name (``""`` when the file is missing or empty)
        self.name = ""
        #: when the file was last looked at (``time.perf_counter_ns``); 0 makes the next
        #: :meth:`read` look again
        self.checked = 0
        self._stamp: tuple[int, int, int] | None = None
        self._commit_grace_s = commit_grace_s
        self._heartbeat_s: float | None = None    # the producer's own, to restore
        #: ``alt=N``: N (0: not in that mode)
        self.alt = 0
        self._alt_count = 0                       # prefill passes since the mode began
        #: this pass's side of ``alt=N`` (timing.ForwardLog's ``phase``: 0 outside the mode,
        #: 1 captured, 2 skipped); the hook resets it to 0 at each pass
        self.phase = 0
        #: ``alt=N,log=MS``: MS / 1000, the pass log's interval for this mode; None: the
        #: configured one
        self.log_s: float | None = None
        #: ``alt=N,step=BYTES``: the deferred copies' per-step budget for this mode; None:
        #: the configured one (``HSCAPTURE_COPY_STEP_BYTES``)
        self.step_bytes: int | None = None

    def read(self, now: int) -> str:
        """The mode in the file: its status is looked at once per 100 ms at most, its content
        read only when that changed (size, mtime or inode)."""
        if now - self.checked < 100_000_000:
            return self.name
        self.checked = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                with open(self.path) as f:
                    self.name = f.read().strip()
                self._stamp = stamp
        except OSError:
            self.name, self._stamp = "", None
        return self.name

    def apply(self, producer: Any, publish_interval_s: float) -> None:
        """Set the producer's policies for the current mode (each pass: a mode may change
        between any two); ``publish_interval_s``: the configured one, restored by any mode but
        ``interval=S``."""
        mode = self.name
        if self._heartbeat_s is None:
            self._heartbeat_s = producer.heartbeat_interval_s
        base, _, options = mode.partition(",")
        alt = _mode_int(base, "alt=")
        log_ms, self.step_bytes = -1.0, None
        for option in options.split(",") if alt and options else ():
            if option.startswith("log="):
                log_ms = _mode_seconds(option, "log=", -1.0)
            elif option.startswith("step="):
                self.step_bytes = _mode_bytes(option[len("step="):])
        self.log_s = log_ms / 1e3 if log_ms >= 0.0 else None
        if alt != self.alt:
            self.alt, self._alt_count = alt, 0
        producer.inline_publish = mode != "publisher"
        producer.commit_grace_s = ALT_QUIET_S if alt else _mode_seconds(
            mode, "grace=", self._commit_grace_s)
        producer.heartbeat_interval_s = ALT_QUIET_S if alt else self._heartbeat_s
        producer.publish_interval_s = _mode_seconds(mode, "interval=", publish_interval_s)

    def side(self, prefill: bool) -> bool:
        """Under ``alt=N``: whether this pass is skipped (sets :attr:`phase`; a prefill pass
        counts towards the block, any other pass takes its block's side). False otherwise."""
        if not self.alt:
            return False
        skip = bool((self._alt_count // self.alt) & 1)
        self._alt_count += prefill
        self.phase = 2 if skip else 1
        return skip


def _mode_seconds(mode: str, key: str, default: float) -> float:
    """The seconds a benchmark mode ``KEY=S`` asks for (``key`` is ``"KEY="``): S, or
    ``default`` for a malformed or negative S and for every other mode."""
    if mode.startswith(key):
        try:
            got = float(mode[len(key):])
        except ValueError:
            return default
        if got >= 0.0:
            return got
    return default


def _mode_bytes(text: str) -> int | None:
    """A byte count of a benchmark mode's option (``step=48M``; config's rule,
    :func:`~hscapture.sglang.config.step_bytes`), or None when malformed."""
    try:
        return step_bytes(text, "the benchmark mode's step=")
    except CaptureConfigError:
        return None


def _mode_int(mode: str, key: str) -> int:
    """The count a benchmark mode ``KEY=N`` asks for (``key`` is ``"KEY="``): N >= 1, else 0
    (a malformed N, and every other mode)."""
    if mode.startswith(key):
        try:
            return max(0, int(mode[len(key):]))
        except ValueError:
            return 0
    return 0
