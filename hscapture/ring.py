"""The shared-memory ring, seen from Python: segment naming, stale-segment cleanup, re-exports.

The ring itself is native (``hscapture._ring``, built from ``csrc/`` and ``bindings/``); its
API is specified in docs/ARCHITECTURE.md section 1. This module adds only what is easier in
Python. Producer/notice/subscriber logic lives elsewhere.
"""

from __future__ import annotations

import os
import re
import secrets
from typing import Literal, NamedTuple

from ._ring import (  # noqa: F401  (re-exports)
    CACHE_LINE,
    LAYOUT_VERSION,
    MAGIC,
    MAX_CONSUMERS,
    RECORD_ALIGN,
    RECORD_HEADER_SIZE,
    SLOT_ACTIVE,
    SLOT_EXPIRED,
    SLOT_FREE,
    SLOT_NAME_LEN,
    STATE_ABORTED,
    STATE_COMMITTED,
    STATE_PADDING,
    STATE_RESERVED,
    Consumer,
    Producer,
    Record,
    is_stale,
    record_total_len,
    segment_info,
    unlink,
)

__all__ = [
    "Producer",
    "Consumer",
    "Record",
    "is_stale",
    "unlink",
    "segment_info",
    "segment_name",
    "cleanup_stale",
    "CleanupAction",
    "durable_segments",
    "record_total_len",
    "SHM_DIR",
    "DEFAULT_PREFIX",
    "LEFTOVER_PREFIX",
    "leftover_path",
    "leftover_unread",
    "remove_leftover",
]

#: Where POSIX shared-memory objects appear on Linux.
SHM_DIR = "/dev/shm"
#: Every segment hscapture creates starts with this.
DEFAULT_PREFIX = "hscapture-"

#: The file beside a segment naming what its producer closed with and never got into the
#: ring (:mod:`hscapture._leftover` owns its format). Not ``hscapture-``: never taken for a
#: segment by a listing of those.
LEFTOVER_PREFIX = "hscapture.left-"

_ID_RE = re.compile(r"[^A-Za-z0-9_.]+")


def leftover_path(segment: str) -> str:
    """The leftover file of ``segment`` (a segment name, no directory)."""
    if not segment or "/" in segment or segment.startswith("."):
        raise ValueError(f"not a segment name: {segment!r}")
    return os.path.join(SHM_DIR, LEFTOVER_PREFIX + segment)


def remove_leftover(segment: str) -> None:
    """Remove ``segment``'s leftover file, if any: the segment's name is gone (every path
    that unlinks a segment calls this)."""
    try:
        os.unlink(leftover_path(segment))
    except (FileNotFoundError, ValueError):
        pass


def leftover_unread(name: str, info: dict | None = None) -> list[str]:
    """One description per ACTIVE slot of segment ``name`` that may not have read its
    leftover file yet, while it has one: a durable slot (only the subscriber itself ends
    it, once it has, when it finishes with the ring) or the slot of a live anonymous
    subscriber (it reads the file when it retires the incarnation, after the ``bye``, and
    then detaches). The segment and the file stay for it, whether or not it read everything
    in the ring. (Until 2026-12-05 only durable slots counted: a live anonymous subscriber
    found the file gone and reported those drops as a lost range, not by rid.)"""
    if not os.path.exists(leftover_path(name)):
        return []
    if info is None:
        info = segment_info(name)
    where = leftover_path(name)
    return [f"durable subscription '{s['name']}' (slot {s['slot']}) has not read the drops "
            f"in {where}" if s["durable"] else
            f"live subscriber pid {s.get('pid')} (slot {s['slot']}) has not read the drops "
            f"in {where}"
            for s in info["consumers"]
            if s["state"] == "active" and (s["durable"] or s.get("alive"))]


def _remove_orphan_leftovers(segment_prefix: str) -> None:
    """Remove our leftover files of segments named ``segment_prefix*`` that no longer
    exist (their segment was unlinked by a path that could not remove them)."""
    for name in _own_names(LEFTOVER_PREFIX + segment_prefix):
        if not os.path.exists(os.path.join(SHM_DIR, name[len(LEFTOVER_PREFIX):])):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                continue


def segment_name(producer_id: str | int, epoch: int | None = None) -> str:
    """A fresh segment name: ``hscapture-<uid>-<producer_id>-<random hex>``.

    ``producer_id`` is sanitised to ``[A-Za-z0-9_.]`` (other runs become ``_``). The random
    suffix is 8 bytes of ``secrets``, or the 16 hex digits of ``epoch`` if given, so a
    restarted producer never reuses its predecessor's name (segments are created O_EXCL).
    """
    pid = _ID_RE.sub("_", str(producer_id)).strip("_") or "p"
    suffix = f"{epoch & 0xFFFFFFFFFFFFFFFF:016x}" if epoch else secrets.token_hex(8)
    return f"{DEFAULT_PREFIX}{os.geteuid()}-{pid[:64]}-{suffix}"


class CleanupAction(NamedTuple):
    """What :func:`cleanup_stale` did with one stale segment, and why."""

    name: str
    action: Literal["removed", "kept"]
    reason: str


def _own_segments(prefix: str) -> list[str]:
    """Segment names in /dev/shm starting with ``prefix`` and owned by the current user,
    sorted."""
    return _own_names(prefix)


def _own_names(prefix: str) -> list[str]:
    """Names in /dev/shm starting with ``prefix`` and owned by the current user, sorted."""
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    uid = os.geteuid()
    names = []
    for name in sorted(entries):
        if not name.startswith(prefix):
            continue
        try:
            st = os.stat(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            continue
        if st.st_uid == uid:
            names.append(name)
    return names


def _unread_durable(info: dict) -> list[str]:
    """One description per ACTIVE durable slot that has not released everything committed."""
    head = info["head"]
    return [
        f"durable subscription '{s['name']}' (slot {s['slot']}) has {head - s['released']} unread bytes "
        f"(released {s['released']} < head {head})"
        for s in info["consumers"]
        if s["state"] == "active" and s["durable"] and s["released"] < head
    ]


def cleanup_stale(prefix: str = DEFAULT_PREFIX, *, force: bool = False) -> list[CleanupAction]:
    """Unlink the segments in /dev/shm named ``prefix*``, owned by us, with no live producer,
    unless a durable subscription still has unread data in one.

    A segment is stale when no process holds its producer OFD lock (the kernel drops it when
    the producer dies, even by SIGKILL). A stale segment in which an ACTIVE durable slot has
    ``released < head`` (committed records its subscriber has not read) is KEPT, so that
    subscriber can still resume and drain it; ``force=True`` removes it anyway, except while a
    live process still reads it (an ACTIVE slot whose process is alive) and the producer left
    a leftover file beside it: that subscriber reads the file when it retires the
    incarnation, then detaches and removes both. Removed under it, the file went too, and
    the drops it names were reported by number, not by rid (fault hunt F2, 2026-12-05: a test
    session's clean-up run beside another one). A
    stale segment this build cannot read (another layout version) is removed. Consumers still
    attached keep their mapping; only the name goes away.

    Returns one :class:`CleanupAction` ``(name, action, reason)`` per stale segment, sorted by
    name, ``action`` being ``"removed"`` or ``"kept"``; segments with a live producer (or that
    vanished meanwhile) are not listed.
    """
    out: list[CleanupAction] = []
    for name in _own_segments(prefix):
        try:
            if not is_stale(name):
                continue
        except Exception:  # vanished meanwhile, or not ours to judge: leave it alone
            continue
        reason = "no live producer"
        try:
            info = segment_info(name)
            unread = _unread_durable(info) + leftover_unread(name, info)
            readers = [f"live process {c['pid']} (slot {c['slot']}) reads it and has not "
                       f"read the drops in {leftover_path(name)}"
                       for c in info["consumers"] if c["state"] == "active" and c["alive"]
                       ] if os.path.exists(leftover_path(name)) else []
        except Exception as e:  # noqa: BLE001 - unreadable (another layout): nothing to resume
            unread = readers = []
            reason += f" (header unreadable: {e})"
        if readers:
            out.append(CleanupAction(name, "kept", "; ".join(readers) + ": it removes the "
                                     "segment and the file once it has read them"))
            continue
        if unread and not force:
            out.append(CleanupAction(name, "kept", "; ".join(unread) + ": pass force=True to remove it anyway"))
            continue
        if unread:
            reason += "; forced despite: " + "; ".join(unread)
        try:
            unlink(name)
        except Exception:  # vanished meanwhile
            continue
        remove_leftover(name)
        out.append(CleanupAction(name, "removed", reason))
    _remove_orphan_leftovers(prefix)
    return out


def durable_segments(resume_name: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Names (sorted) of this user's segments ``prefix*`` holding a slot registered under
    ``resume_name`` in any state but FREE (active, detached, or expired), live producer or not.

    Read-only: uses :func:`segment_info`, which maps only the header and slots and never
    creates, locks or changes a slot. Segments that cannot be read (vanished, another layout
    version, not a ring) are skipped.
    """
    if not resume_name:
        raise ValueError("durable_segments: expected a non-empty resume_name")
    found = []
    for name in _own_segments(prefix):
        try:
            info = segment_info(name)
        except Exception:  # noqa: BLE001 - vanished / not a ring of this layout
            continue
        if any(s["durable"] and s["state"] != "free" and s["name"] == resume_name for s in info["consumers"]):
            found.append(name)
    return found
