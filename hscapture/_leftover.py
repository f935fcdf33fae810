"""What a producer closed with and never got into its ring: the leftover file beside a segment.

A drop or abort entry (or the unheard entry naming the captures before the first
subscriber) waits in the producer's backlog while the ring has no room for it (a durable
subscriber that went away keeps the ring full). At close, what is still there could
only go out in the ``bye`` notice, as a count: a live subscriber reported the numbers as a
lost range, but a durable subscriber that was away when the producer closed, and resumes its
kept segment later, never heard that notice, and those samples were neither delivered nor
reported (until 2026-12-05). So the producer writes them here, beside the segment, exactly
as the ring entries it could not write: at close, and while capturing whenever the backlog
changed (at most every ``_announcer.LEFTOVER_INTERVAL_S``, removed once the backlog is empty),
so that a producer killed with a backlog leaves them too; whoever retires the incarnation (a live
subscriber after the ``bye``, a resumer once the ring is read) reads them back through
:func:`hscapture.record.read_entry` and names every row by rid. The file goes when the
segment's name goes (:func:`hscapture.ring.remove_leftover`; :func:`hscapture.ring.
cleanup_stale` also removes files whose segment is gone).

The file: :func:`hscapture.ring.leftover_path` (``/dev/shm/hscapture.left-<segment>``, mode
0600, written to a temporary name and renamed into place), one msgpack map (docs/PROTOCOL.md
"The leftover file"):

- ``v``: 1;
- ``epoch``: the incarnation's epoch (u64);
- ``next_seq``: every sequence number below it was taken: in the ring, in ``entries``, or
  counted in ``unrecorded``;
- ``unrecorded``: rows whose drop could be neither written nor kept (named nowhere);
- ``entries``: the control entries' payloads (bytes each, as :func:`hscapture.record.
  control_payload` frames them), oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import msgpack

from . import record as rec
from .errors import RecordFormatError
from .ring import decode_private_map, leftover_path, write_private_file

__all__ = ["Leftover", "encode", "decode", "write", "read", "MAX_BYTES"]

VERSION = 1
#: the largest file read (the producer's backlog is bounded: 65,536 rows)
MAX_BYTES = 64 << 20
_KEYS = frozenset({"v", "epoch", "next_seq", "unrecorded", "entries"})


@dataclass(frozen=True)
class Leftover:
    """A decoded leftover file: ``entries`` validated by :func:`hscapture.record.read_entry`."""

    epoch: int
    next_seq: int
    unrecorded: int
    entries: tuple[rec.Entry, ...]


def encode(epoch: int, next_seq: int, unrecorded: int, payloads: Sequence[bytes]) -> bytes:
    """The file's bytes (golden-bytes tested: tests/test_leftover.py)."""
    return msgpack.packb({"v": VERSION, "epoch": epoch, "next_seq": next_seq,
                          "unrecorded": unrecorded, "entries": [bytes(p) for p in payloads]},
                         use_bin_type=True)


def decode(blob: bytes, *, epoch: int, producer: str | None = None) -> Leftover:
    """Parse and validate a leftover file written for incarnation ``epoch`` (and, when
    given, producer id ``producer``). Raises :class:`RecordFormatError` for anything wrong
    (what was expected and what was found), and nothing else, for any bytes."""
    top = decode_private_map(blob, what="leftover file", keys=_KEYS, version=VERSION,
                             numbers=("epoch", "next_seq", "unrecorded"), epoch=epoch,
                             whose="the segment's", max_bytes=MAX_BYTES,
                             max_bin_len=MAX_BYTES, max_array_len=1 << 20, max_map_len=16)
    raw = top["entries"]
    if not isinstance(raw, list) or any(type(p) is not bytes for p in raw):
        raise RecordFormatError("leftover file: entries: expected a list of byte strings")
    entries = []
    for i, payload in enumerate(raw):
        try:
            entry = rec.read_entry(payload, payload_len=len(payload), epoch=epoch,
                                   producer=producer)
        except RecordFormatError as exc:
            raise RecordFormatError(f"leftover file: entry {i}: {exc}") from None
        if entry.kind not in ("drop", "abort", "unheard"):
            raise RecordFormatError(f"leftover file: entry {i}: expected a drop, abort or "
                                    f"unheard entry, found {entry.kind!r}")
        # (an unheard entry takes no number: its seq is the next one when it was made)
        if entry.seq + (entry.n if entry.kind == "unheard" else max(entry.n, 1)) > \
                top["next_seq"]:
            raise RecordFormatError(f"leftover file: entry {i}: sequence numbers "
                                    f"{entry.seq}.. reach past next_seq {top['next_seq']}")
        entries.append(entry)
    return Leftover(top["epoch"], top["next_seq"], top["unrecorded"], tuple(entries))


def write(segment: str, epoch: int, next_seq: int, unrecorded: int,
          payloads: Sequence[bytes]) -> Path:
    """Write ``segment``'s leftover file (replacing one there); returns its path."""
    path = Path(leftover_path(segment))
    write_private_file(str(path), encode(epoch, next_seq, unrecorded, payloads))
    return path


def read(segment: str, *, epoch: int, producer: str | None = None) -> Leftover | None:
    """``segment``'s leftover file, decoded (:func:`decode`); None when there is none.
    Raises :class:`RecordFormatError` for a file that is not one, OSError if unreadable."""
    try:
        with open(leftover_path(segment), "rb") as f:
            blob = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    return decode(blob, epoch=epoch, producer=producer)
