"""What an anonymous subscriber names as it closes: every number its producers took before
the close, read from the ring without copying data, from the producer's leftover file, or,
where neither shows it in time, as a ``lost`` range.

A sample a producer could not write into its full ring becomes a drop that waits in the
producer's backlog until the ring has room (:mod:`hscapture._leftover`). A subscriber that
pins the ring (borrowed samples it holds, a slow reader) and closes while the producer lives
stops reading before those drops reach the ring: until 2026-12-06 they were named to it
nowhere (a fault hunt: about 700 drops, 1 of 1 runs, ``scripts/hunts/fork-fulldisk-2026-12-06/
a3_zero_copy.py``; GUARANTEES gap 5). So the close first gives back what pins the ring (the
caller releases its borrowed samples), then reads, for at most :data:`SETTLE_S`, until every
number taken before the close (the segment header's ``taken``) is accounted for: a data row
read (its rid named undelivered), a drop or abort entry read (named as such), or reported.

Order matters where the ring and the file meet: the producer writes a backlog drop into the
ring and then rewrites the file without it. The file is read first and the ring after, so an
entry missing from the file was already in the ring for the read that follows.

Guarantees: every number below a live source's ``taken`` at the start is, on return, seen
(read now or before) or reported lost; nothing here copies sample data; a durable place reads
nothing (its resumer gets what it left) unless its subscription ends (``giving_up``: the
unsubscribe names what it gives up); retired sources are left to retirement.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ._registry import SourceRegistry, taken_numbers
from ._source import Source

__all__ = ["SETTLE_S", "name_what_was_taken"]

#: how long a closing subscriber waits for the numbers taken before its close to show up in
#: the ring or the leftover file: the backlog is written at the producer's next heartbeat
#: (0.1 s) once the ring has room, and the file follows a grown backlog within
#: ``_announcer.LEFTOVER_INTERVAL_S`` (0.5 s) plus a heartbeat
SETTLE_S = 1.0
#: the longest single wait for a notice between two reads of the rings
_WAIT_S = 0.02
#: how often the leftover file of a live producer is read while numbers are missing
_FILE_EVERY_S = 0.2


def name_what_was_taken(registry: SourceRegistry, sink: Any,
                        wait: Callable[[float], None], timeout: float = SETTLE_S,
                        giving_up: bool = False) -> list[str]:
    """Read every live, anonymous source's ring to the numbers its producer took before this
    call (``wait(seconds)`` blocks until a notice arrives or the time passes); returns the rids
    of the data rows read (not delivered: the caller names them). Drops and aborts go to
    ``sink`` as the pump sends them; numbers still unaccounted for when ``timeout`` passes,
    or once the producer is dead and its leftover file read, are reported lost.
    ``giving_up``: a durable subscription that ends (``unsubscribe()``): its places too
    (until 2026-12-06 an unsubscribe read only what its rings held, and the drops still in
    a live producer's backlog reached the ring after the place was gone: named by no one,
    fault hunt H21, GUARANTEES gap 16)."""
    now = time.monotonic()
    open_: dict[int, tuple[Source, int]] = {}
    for src in list(registry.sources.values()):
        if src.consumer is None or src.retired or (src.settlement.durable and not giving_up):
            continue
        open_[src.epoch] = (src, taken_numbers(src))
    rids: list[str] = []
    deadline = now + timeout
    file_at = now + _FILE_EVERY_S
    while open_:
        for epoch, (src, limit) in list(open_.items()):
            rids += src.skim(sink, giving_up)
            if not src.seqs.missing_below(limit):
                del open_[epoch]
        if not open_:
            break
        now = time.monotonic()
        read_files = now >= file_at
        if read_files:
            file_at = now + _FILE_EVERY_S
        for epoch, (src, limit) in list(open_.items()):
            final = now >= deadline or src.consumer is None or \
                not src.consumer.producer_alive()
            if not (final or read_files):
                continue
            registry.read_leftovers(src)
            rids += src.skim(sink, giving_up)   # (after the file: see the module docstring)
            missing = src.seqs.missing_below(limit)
            if not missing:
                del open_[epoch]
            elif final:
                for a, b in missing:
                    src.report_lost(a, b - a, src.lost_reason(
                        a, f"taken by producer {src.producer or '?'} before the subscriber "
                           f"closed, and neither in its ring nor in its leftover file within "
                           f"{timeout:g} s (a capture still in flight, or a drop it had not "
                           f"recorded)"))
                del open_[epoch]
        if open_:
            wait(_WAIT_S)
    return rids
