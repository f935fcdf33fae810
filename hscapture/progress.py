"""Progress of a drain (or any sample-counting loop), rendered for a person.

On a terminal: a tqdm bar with samples/s, GB and GB/s, drops/incomplete/rejected, and the
percentage and ETA when the total is known. Not on a terminal (logs, CI, ``| tee``): one plain
line every ``interval_s`` seconds (10 by default), so logs stay readable.

This module renders only; it never decides when to stop. ``tqdm`` is imported on first use.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

__all__ = ["Progress", "format_size", "format_duration", "active_bar_write"]

_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))

#: The bar currently drawn on a terminal, if any (log lines are written around it).
_ACTIVE: list[Any] = []


def format_size(nbytes: int | float) -> str:
    """``1536`` → ``"1.5 KiB"``; binary units, the ones ``--shard-size 2G`` means."""
    n = float(nbytes)
    for unit, scale in _BINARY:
        if abs(n) >= scale:
            return f"{n / scale:.{1 if abs(n) / scale < 100 else 0}f} {unit}"
    return f"{int(n)} B"


def format_duration(seconds: float) -> str:
    """``75.2`` → ``"1:15"``, ``3725`` → ``"1:02:05"``."""
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def active_bar_write(text: str, stream: TextIO | None = None) -> None:
    """Write a line to ``stream`` (stderr) without tearing a live progress bar."""
    stream = stream or sys.stderr
    if _ACTIVE:
        from tqdm import tqdm

        tqdm.write(text, file=stream)
    else:
        stream.write(text + "\n")
        stream.flush()


class Progress:
    """Render drain progress: ``update(...)`` as often as you like, ``close()`` once.

    ``total``: the expected number of samples (``-n``), or None when unknown (no % or ETA).
    ``enabled=False`` renders nothing. ``tty`` overrides terminal detection (``stream.isatty()``).
    Guarantees: at most one plain line per ``interval_s`` off a terminal (the first one after
    ``interval_s``, not at once), and nothing written after :meth:`close`.
    """

    def __init__(self, total: int | None = None, enabled: bool = True,
                 stream: TextIO | None = None, *, interval_s: float = 10.0,
                 tty: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.clock = clock
        self.tty = bool(enabled and (tty if tty is not None else _isatty(self.stream)))
        self.start = clock()
        self._last_line = self.start
        self._closed = False
        self._bar: Any = None
        self._state = (0, 0, 0, 0, 0, 0)
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=" samples", file=self.stream, dynamic_ncols=True,
                             mininterval=0.2, smoothing=0.1, leave=True,
                             # (tqdm puts ", " before a postfix: inside the brackets)
                             bar_format=("{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                         "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")
                             if total else "{n_fmt} samples [{elapsed}, {rate_fmt}{postfix}]")
            _ACTIVE.append(self._bar)

    def update(self, samples: int, bytes: int, dropped: int = 0, incomplete: int = 0,
               rejected: int = 0, duplicates: int = 0) -> None:
        """Report the running totals so far (absolute counts, not increments)."""
        if not self.enabled or self._closed:
            return
        self._state = (samples, bytes, dropped, incomplete, rejected, duplicates)
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(samples - self._bar.n)
            return
        now = self.clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The plain status line for the current totals."""
        samples, nbytes = self._state[:2]
        dt = max((now if now is not None else self.clock()) - self.start, 1e-9)
        rate = samples / dt
        head = f"{samples} samples"
        if self.total:
            head = f"{samples}/{self.total} samples ({100.0 * samples / self.total:.1f}%)"
        text = f"hscapture: {head}, {rate:.1f}/s, {self._postfix(dt)}"
        if self.total and rate > 0 and samples < self.total:
            text += f", ETA {format_duration((self.total - samples) / rate)}"
        return text

    def _postfix(self, dt: float | None = None) -> str:
        samples, nbytes, dropped, incomplete, rejected, duplicates = self._state
        dt = dt if dt is not None else max(self.clock() - self.start, 1e-9)
        text = f"{nbytes / 1e9:.2f} GB, {nbytes / dt / 1e9:.2f} GB/s, dropped {dropped}"
        if incomplete:
            text += f", incomplete {incomplete}"
        if rejected:
            text += f", rejected {rejected}"
        if duplicates:
            text += f", duplicates {duplicates}"
        return text

    def close(self) -> None:
        """Finish the bar (left on screen with the final totals). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.close()
            _ACTIVE.remove(self._bar)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
