"""The shared-memory ring, seen from Python: segment naming, stale-segment cleanup (and the
ended record it leaves), re-exports.

The ring itself is native (``hscapture._ring``, built from ``csrc/`` and ``bindings/``); its
API is specified in docs/ARCHITECTURE.md section 1. This module adds only what is easier in
Python. Producer/notice/subscriber logic lives elsewhere.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from typing import Literal, NamedTuple

import msgpack

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
from .errors import RecordFormatError

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
    "ENDED_PREFIX",
    "ended_path",
    "encode_ended",
    "decode_ended",
    "read_ended",
]

#: Where POSIX shared-memory objects appear on Linux.
SHM_DIR = "/dev/shm"
#: Every segment hscapture creates starts with this.
DEFAULT_PREFIX = "hscapture-"

#: The file beside a segment naming what its producer closed with and never got into the
#: ring (:mod:`hscapture._leftover` owns its format). Not ``hscapture-``: never taken for a
#: segment by a listing of those.
LEFTOVER_PREFIX = "hscapture.left-"

#: The ended record a removed segment of a dead producer leaves (:func:`write_ended`).
ENDED_PREFIX = "hscapture.ended-"
ENDED_VERSION = 1
#: how long an ended record stays (``HSCAPTURE_ENDED_KEEP_S`` overrides; 1 hour): a
#: subscriber that learns of the incarnation later than that gets no bound from it
ENDED_KEEP_S = 3600.0
_ENDED_KEYS = frozenset({"v", "epoch", "taken"})
_U64 = (1 << 64) - 1

_ID_RE = re.compile(r"[^A-Za-z0-9_.]+")


def _beside(prefix: str, segment: str) -> str:
    """``/dev/shm/<prefix><segment>``: a small file beside ``segment`` (a segment name, no
    directory; anything else is a ValueError, so no name can lead out of SHM_DIR)."""
    if not segment or "/" in segment or segment.startswith("."):
        raise ValueError(f"not a segment name: {segment!r}")
    return os.path.join(SHM_DIR, prefix + segment)


def leftover_path(segment: str) -> str:
    """The leftover file of ``segment`` (a segment name, no directory)."""
    return _beside(LEFTOVER_PREFIX, segment)


def ended_path(segment: str) -> str:
    """The ended record of ``segment`` (a segment name, no directory)."""
    return _beside(ENDED_PREFIX, segment)


def encode_ended(epoch: int, taken: int) -> bytes:
    """An ended record's bytes (docs/PROTOCOL.md "The ended record"; golden-bytes tested:
    tests/test_ended_record.py): one msgpack map ``{"v": 1, "epoch": E, "taken": N}``."""
    return msgpack.packb({"v": ENDED_VERSION, "epoch": epoch, "taken": taken},
                         use_bin_type=True)


def decode_private_map(blob: bytes, *, what: str, keys: frozenset[str], version: int,
                       numbers: tuple[str, ...], epoch: int, whose: str, max_bytes: int,
                       **limits: int) -> dict:
    """The map of one of the small private files beside a segment (the leftover file, the
    ended record), checked for what they share: at most ``max_bytes``, one msgpack map of
    exactly ``keys`` (``limits``: msgpack's ``max_*_len``), ``v`` == ``version``, each of
    ``numbers`` an integer 0..2**64-1, ``epoch`` the expected one (``whose``: where that
    epoch comes from, for the message). Raises :class:`RecordFormatError` naming ``what``,
    what was expected and what was found, for any other bytes."""
    if len(blob) > max_bytes:
        raise RecordFormatError(f"{what}: expected at most {max_bytes} bytes, found {len(blob)}")
    try:
        top = msgpack.unpackb(blob, raw=False, strict_map_key=True, **limits)
    except Exception as exc:
        raise RecordFormatError(f"{what}: not msgpack ({type(exc).__name__}: {exc})") \
            from None
    if not isinstance(top, dict) or set(top) != keys:
        raise RecordFormatError(f"{what}: expected a map with keys {sorted(keys)}, "
                                f"found {sorted(top) if isinstance(top, dict) else type(top).__name__}")
    if top["v"] != version:
        raise RecordFormatError(f"{what}: expected version {version}, found {top['v']!r}")
    for key in numbers:
        if type(top[key]) is not int or not 0 <= top[key] <= _U64:
            raise RecordFormatError(f"{what}: {key}: expected an integer 0..2**64-1, "
                                    f"found {top[key]!r}")
    if top["epoch"] != epoch:
        raise RecordFormatError(f"{what}: epoch: expected {epoch:#x} ({whose}), "
                                f"found {top['epoch']:#x}")
    return top


def decode_ended(blob: bytes, *, epoch: int) -> int:
    """The ``taken`` of an ended record written for incarnation ``epoch``. Raises
    :class:`RecordFormatError` (what was expected, what was found) for any other bytes."""
    return decode_private_map(blob, what="ended record", keys=_ENDED_KEYS,
                              version=ENDED_VERSION, numbers=("epoch", "taken"), epoch=epoch,
                              whose="the incarnation's", max_bytes=256,
                              max_map_len=8)["taken"]


def read_ended(segment: str, *, epoch: int) -> int | None:
    """The ``taken`` of ``segment``'s ended record (:func:`decode_ended`); None when there is
    none. Raises :class:`RecordFormatError` for a file that is not one, OSError if
    unreadable."""
    try:
        with open(ended_path(segment), "rb") as f:
            blob = f.read(257)
    except FileNotFoundError:
        return None
    return decode_ended(blob, epoch=epoch)


def write_ended(segment: str, epoch: int, taken: int) -> None:
    """Leave ``segment``'s ended record (mode 0600, written to a temporary name and renamed
    into place), before :func:`cleanup_stale` removes the segment of a dead producer.

    Why: a subscriber that knows the incarnation only from its notices (it had not attached
    to the ring when the producer died: busy elsewhere, or attaching late) finds the ring
    gone once another subscriber's detach or a cleanup removed it, and the last notices of a
    SIGKILLed producer die in its socket: their numbers lay above every bound that
    subscriber had (heartbeats, notices, the leftover file), and those samples were named
    to it nowhere (fault hunt of 2026-12-05, ``scripts/hunts/restart-2026-12-05/
    s2_sigkill_late.py``: 1-9 samples in 1 of 6 runs). ``taken`` (the header's: every
    number below it was taken) bounds what it reports lost; the record stays for
    :data:`ENDED_KEEP_S`."""
    write_private_file(ended_path(segment), encode_ended(epoch, taken))


def write_private_file(path: str, blob: bytes) -> None:
    """``blob`` as the whole of ``path`` (mode 0600), replacing what is there at once: written
    to a temporary name beside it (``.<name>.<pid>.tmp``) and renamed into place, so that a
    reader finds the old file or the new one, never a part (the leftover file, the ended
    record)."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def ended_keep_s() -> float:
    """How long an ended record stays (:data:`ENDED_KEEP_S`, or ``HSCAPTURE_ENDED_KEEP_S``)."""
    try:
        return float(os.environ.get("HSCAPTURE_ENDED_KEEP_S") or ENDED_KEEP_S)
    except ValueError:
        return ENDED_KEEP_S


def _remove_old_ended(segment_prefix: str) -> None:
    """Remove our ended records of segments named ``segment_prefix*`` older than
    :func:`ended_keep_s` (by their modification time)."""
    oldest = time.time() - ended_keep_s()
    for name in _own_names(ENDED_PREFIX + segment_prefix):
        path = os.path.join(SHM_DIR, name)
        try:
            if os.stat(path).st_mtime < oldest:
                os.unlink(path)
        except OSError:
            continue


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
        info = None
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
        if info is not None:
            try:
                write_ended(name, int(info["epoch"]), int(info["taken"]))
            except OSError:   # (a full /dev/shm): the segment goes all the same
                pass
        try:
            unlink(name)
        except Exception:  # vanished meanwhile
            continue
        remove_leftover(name)
        out.append(CleanupAction(name, "removed", reason))
    _remove_orphan_leftovers(prefix)
    _remove_old_ended(prefix)
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
