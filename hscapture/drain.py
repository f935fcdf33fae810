"""The drain: subscribe and write every complete sample into safetensors shards.

Ring space is released only for samples the shard writer reports durable, so a drain killed at
any point loses nothing it acknowledged; a restarted drain skips rids already in the index. The
same holds for failures: the records that name one are given back only once it is in the
directory's ``reports.jsonl`` (:mod:`hscapture._report_log`), and a drain reports the failures
a killed predecessor recorded there but never named.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ._report_log import ReportLog
from ._subscriptions import describe
from .errors import SampleTimeoutError, ShardError
from .record import ENDED
from .sample import Sample
from .shards import SampleRefusedError, ShardWriter
from .subscriber import Subscriber

log = logging.getLogger("hscapture")

__all__ = ["DrainResult", "drain", "resume_name", "unsubscribe"]


@dataclass
class DrainResult:
    """What a drain did: samples written, bytes, duplicates skipped (samples whose rid the
    directory already held: ``stats["skipped"]`` names them), and what it could not get."""

    samples: int = 0
    bytes: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    dropped: dict[str, str] = field(default_factory=dict)
    incomplete: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    lost: list[dict[str, Any]] = field(default_factory=list)
    #: numbers of a live producer not seen yet when the drain stopped (below the highest seen:
    #: a drop still in its backlog, an entry on its way): the durable place keeps them for
    #: the next drain into the directory, which reads them if they are recorded. Until
    #: 2026-12-06 they were in ``lost`` ("unresolved at stop"), which the next drain then
    #: contradicted by naming them (fault hunt F2)
    unresolved: list[dict[str, Any]] = field(default_factory=list)
    in_flight: dict[str, str] = field(default_factory=dict)
    conflicts: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    stopped_by: str = ""
    #: the directory's failure log, set when the drain ended without an error (its report
    #: is whole): :meth:`mark_reported` marks it
    _reports: ReportLog | None = field(default=None, repr=False, compare=False)

    def mark_reported(self) -> None:
        """Record in the directory's ``reports.jsonl`` that every failure above was named to
        the user, so the next drain into it does not name them again. :func:`drain` does
        this itself before it returns, unless ``report_by_caller=True``: then its caller
        calls this once the report has reached the user (a report lost before that, e.g. to
        a second Ctrl-C while it is printed, is named again by the next drain: rather twice
        than never). Does nothing for a drain that failed (its next run names them)."""
        if self._reports is None:
            return
        try:
            self._reports.mark_reported()
        except OSError as exc:
            log.warning("hscapture drain: cannot mark %s reported: %s", self._reports.path, exc)
        self._reports = None

    @property
    def complete(self) -> bool:
        """True when every sample the producers committed since the subscription began was
        written: nothing dropped, incomplete, rejected, lost, unresolved, in flight or
        refused."""
        return not (self.dropped or self.incomplete or self.rejected or self.lost
                    or self.unresolved or self.in_flight or self.conflicts)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class _Progress:
    """Adapter from the drain loop to :class:`hscapture.progress.Progress` (the renderer)."""

    def __init__(self, enabled: bool, stream: Any = None, total: int | None = None) -> None:
        from .progress import Progress

        self.bar = Progress(total, enabled, stream)

    def update(self, res: DrainResult, sub: Subscriber, start: float, force: bool = False) -> None:
        self.bar.update(res.samples, res.bytes, len(sub.dropped), len(sub.incomplete),
                        len(sub.rejected), res.duplicates)

    def done(self) -> None:
        self.bar.close()


def drain(
    endpoints: str | Sequence[str],
    out_dir: str,
    *,
    max_samples: int | None = None,
    idle_timeout_s: float | None = None,
    connect_timeout_s: float = 30.0,
    max_shard_bytes: int = 2 << 30,
    write_threads: int = 1,
    flush_bytes: int = 256 << 20,
    flush_interval_s: float = 1.0,
    metadata: dict[str, str] | None = None,
    progress: bool = True,
    stop_event: threading.Event | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    unsubscribe_at_end: bool = False,
    compression: str | None = None,
    compression_level: int | None = None,
    on_waiting: Callable[[], None] | None = None,
    report_by_caller: bool = False,
) -> DrainResult:
    """Drain samples into ``out_dir`` until ``max_samples``, idle timeout, or a stop request.

    SIGINT/SIGTERM (in the main thread) or ``stop_event`` stop it cleanly: the open shard is
    finished, never lost. Raises :class:`ShardError` for an unwritable directory or a full disk
    (after finishing every sample written before), :class:`SampleTimeoutError` when no producer
    shows up within ``connect_timeout_s``. ``compression`` / ``compression_level``: see
    :class:`~hscapture.shards.ShardWriter` (``None``, ``"zstd"``, ``"fp8"``). ``on_waiting()``
    runs once the stop handlers are in place, right before the wait for producers: whatever
    it tells the user ("Ctrl-C to stop") is true from then on. ``report_by_caller``: the
    failures the result names are marked reported only when the caller calls
    :meth:`DrainResult.mark_reported` (after it showed them), not before this returns.
    """
    created = not os.path.exists(out_dir)   # (a drain that wrote nothing leaves no empty dir)
    writer = ShardWriter(out_dir, max_shard_bytes=max_shard_bytes, metadata=metadata,
                         write_threads=write_threads, compression=compression,
                         compression_level=compression_level)
    dir_id = _dir_identity(out_dir)
    stop = stop_event or threading.Event()
    restore = _install_signal_handlers(stop)
    res = DrainResult()
    bar = _Progress(progress, total=max_samples)
    pending: dict[str, list[Sample]] = {}
    pending_bytes = 0
    # A durable subscription named after the output directory: a drain stopped (Ctrl-C, kill,
    # full disk) and restarted into the same directory resumes where the ring was released.
    # zero_copy: shards are written straight from the ring, which is released only once the
    # shard data is durable; rids already in the index are skipped in the subscriber.
    sub = Subscriber(endpoints, name=resume_name(out_dir), zero_copy=True,
                     skip_rid=lambda rid: writer.seen(rid) or rid in pending)
    # what `hscapture cleanup` says of a segment kept for this name: whose it is, and how
    # to end it (a drain-<hash> name alone told the user nothing)
    describe(sub.name, kind="drain", out_dir=os.path.abspath(out_dir),
             endpoints=list(sub.endpoints))
    start = time.monotonic()
    reports = ReportLog(out_dir)
    # a killed predecessor's failures are named in this report; every recorded one, read
    # again from the ring (an older record held it back), is not reported twice
    earlier, known, aborted = reports.read()
    sub.known_failures(known, aborted=aborted)
    recorded = 0                     # sub.failures()[:recorded] are in reports.jsonl

    def append_reports(failures: list[tuple[str, str, str, str | None]]) -> None:
        _check_dir(out_dir, dir_id)
        try:
            reports.append(failures)
        except OSError as exc:   # a full disk: typed, and nothing acknowledged
            raise ShardError(f"cannot record {len(failures)} failure(s) in {reports.path}: "
                             f"{exc.strerror or exc}; they stay in the ring for the next "
                             f"drain into {out_dir}") from exc

    def record_failures() -> None:
        """Append the failures read since the last call to reports.jsonl, then let the ring
        go of the records that named them."""
        nonlocal recorded
        new = sub.failures(recorded)
        if new:
            append_reports(new)
            recorded += len(new)
            sub.acknowledge_failures(recorded)

    def settle(rids: list[str]) -> None:
        nonlocal pending_bytes
        if rids:
            _check_dir(out_dir, dir_id)   # never release what went into a removed directory
        for rid in rids:
            for s in pending.pop(rid, ()):
                pending_bytes -= s.nbytes
                s.release()          # durable now: give the ring space back
        record_failures()

    primary: BaseException | None = None   # the error that stopped the drain, if any
    try:
        if on_waiting is not None:
            on_waiting()
        try:
            sub.wait_ready(timeout=connect_timeout_s, stop=stop.is_set)   # Ctrl-C: at once
        except SampleTimeoutError:
            if not stop.is_set():
                raise
        last_flush = last_sample = time.monotonic()
        while not stop.is_set() and (max_samples is None or res.samples < max_samples):
            sample = sub.poll(timeout=0.05)
            now = time.monotonic()
            if sample is None:
                if idle_timeout_s is not None and now - last_sample > idle_timeout_s:
                    res.stopped_by = "idle"
                    break
            else:
                last_sample = now
                try:
                    writer.add(sample)
                except SampleRefusedError as exc:   # this sample only; the drain goes on
                    why = f"the shard writer refused it: {exc}"
                    res.rejected[sample.rid] = why
                    append_reports([("rejected", sample.rid, why, None)])  # before release
                    sample.release()
                    continue
                if on_sample is not None:
                    on_sample(sample)
                pending.setdefault(sample.rid, []).append(sample)
                pending_bytes += sample.nbytes
                res.samples += 1
                res.bytes += sample.nbytes
            if pending and (pending_bytes >= flush_bytes or now - last_flush >= flush_interval_s
                            or sub.held_fraction() > 0.5):   # the ring needs the space back
                settle(writer.flush())
                last_flush = now
            elif now - last_flush >= flush_interval_s:
                record_failures()    # failures hold the ring too: recorded as often
                last_flush = now
            elif sub.failures(recorded):
                # and at once: a failure's records are held only so long (a quarter of the
                # ring, partial_hold_s), and a drain killed after that, before recording it,
                # left the next drain nothing to report
                record_failures()
            bar.update(res, sub, start)
        if not res.stopped_by:
            res.stopped_by = "signal" if stop.is_set() else "count"
        settle(writer.flush())
        # take in what arrived meanwhile for the report (drops, aborts), without new samples
        sub.pump(0.0)
    except BaseException as exc:
        primary = exc
        if isinstance(exc, ShardError):   # a write failed: because the directory is gone?
            try:
                _check_dir(out_dir, dir_id)
            except ShardError as gone:
                primary = gone
                raise gone from exc
        raise
    finally:
        try:
            _close_writer(writer, settle, primary)   # (settle records the failures)
        finally:
            res.seconds = time.monotonic() - start
            bar.update(res, sub, start, force=True)
            bar.done()
            st = sub.stats()
            res.dropped, res.incomplete = dict(sub.dropped), dict(sub.incomplete)
            res.rejected.update(sub.rejected)
            res.lost = st["lost"]
            res.unresolved = [dict(u, reason="not seen yet when the drain stopped: the next "
                                             "drain into this directory reads them if they "
                                             "are recorded") for u in st["unresolved"]]
            res.in_flight = dict(st["in_flight"])
            res.conflicts = dict(st["conflicts"])
            res.stats = st
            # samples whose rid the directory already held (a resumed ring record, or a new
            # capture of the rid: a client's retry after a server restart): the first copy
            # stays, the rest are named here (until 2026-12-05 this count was always 0)
            res.duplicates = len(st["skipped"])
            for kind, rid, reason in earlier:
                getattr(res, kind).setdefault(rid, f"{reason} (read by an earlier drain into "
                                                   f"this directory that was stopped before "
                                                   f"its report)")
            if earlier:
                res.stats["reported_from_earlier_drain"] = len(earlier)
            if primary is None:   # the report is returned whole (a failing drain's next run
                res._reports = reports   # names the failures again: rather twice than never)
                if not report_by_caller:
                    res.mark_reported()
            not_written = [s.rid for samples in pending.values() for s in samples]
            if not_written:   # never durable: left unreleased in the ring for the next run
                res.stats["not_written"] = not_written
            if unsubscribe_at_end:
                for rid in not_written + sub.unsubscribe():   # given up with the place
                    res.incomplete.setdefault(rid, "never written: the drain ended its "
                                                   "subscription (unsubscribe_at_end)")
            else:
                sub.close()
            restore()
            if created:               # failed, interrupted or idle before any sample
                try:
                    os.rmdir(out_dir)     # only if nothing was written into it
                except OSError:
                    pass
    return res


def _close_writer(writer: ShardWriter, settle: Callable[[list[str]], None],
                  primary: BaseException | None) -> None:
    """Finalize the open shard and release what became durable. When the drain is already
    failing (``primary``), a failure here follows from it (a removed directory cannot be
    finalized): the first error is the one reported, and nothing more is released."""
    try:
        settle(writer.close())
    except ShardError:
        if primary is None:
            raise


def unsubscribe(endpoints: str | Sequence[str], out_dir: str
                ) -> tuple[int, list[str], list[tuple[str, str, str]]]:
    """End the durable subscription of the drain into ``out_dir`` at ``endpoints``: its
    places in every ring made for them are given back (their producers stop keeping records
    for it; the name at other endpoints is left as it is). Returns how many rings it held a
    place in, the rids of the samples committed to it that were never written (given up
    with it: :meth:`Subscriber.unsubscribe`), and ``(kind, rid, reason)`` of every failure
    no drain's report has named yet: those in ``reports.jsonl`` after its last report, and
    those an earlier drain read and never recorded there (the name's pending file, which
    goes with the subscription: they are appended to ``reports.jsonl`` first; until
    2026-12-06 they went unnamed, fault hunt H19). The caller names them, then
    :meth:`ReportLog.mark_reported`."""
    reports = ReportLog(out_dir)
    _earlier, known, aborted = reports.read()
    sub = Subscriber(endpoints, name=resume_name(out_dir))
    unnamed: list[tuple[str, str, str, str | None]] = []

    def record(failures: list[tuple[str, str, str, str | None]]) -> None:
        if not failures:
            return
        if os.path.isdir(out_dir):
            reports.append(failures)
        else:                                  # (no directory to record them in)
            unnamed.extend(failures)

    try:
        sub.known_failures(known, aborted=aborted)
        n = len(sub._sources)
        sub.pump(0.0)      # the pending file is read (failures()): recorded before it goes
        record(sub.failures())
        recorded = len(sub.failures())
        given_up = sub.unsubscribe()           # (and what its rings still named)
        record(sub.failures()[recorded:])
    finally:
        sub.close()
    return n, given_up, reports.unreported() + [f[:3] for f in unnamed if f[0] != ENDED]


def _dir_identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _check_dir(path: str, ident: tuple[int, int]) -> None:
    try:
        now = _dir_identity(path)
    except OSError as exc:
        raise ShardError(f"output directory {path} is gone ({exc.strerror}): nothing written "
                         f"since the last durable flush was released; the samples stay in the "
                         f"ring for a drain restarted into a new {path}") from None
    if now != ident:
        raise ShardError(f"output directory {path} was replaced while the drain ran: nothing "
                         f"written since the last durable flush was released")


def resume_name(out_dir: str) -> str:
    """The ring resume name of a drain into ``out_dir``: a restarted drain into the same
    directory takes over its predecessor's unreleased records."""
    digest = hashlib.blake2b(os.path.abspath(out_dir).encode(), digest_size=12).hexdigest()
    return f"drain-{digest}"


def _install_signal_handlers(stop: threading.Event) -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():          # second Ctrl-C: stop harder
            raise KeyboardInterrupt
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, h in previous.items():
            signal.signal(sig, h)
    return restore

