"""Typed errors of hscapture.

Every failure a user handles differently has its own class; all derive from
:class:`HSCaptureError`. Messages say what was expected and what was found.

The native ring (``hscapture._ring``) raises these same classes: its exception
translator looks them up here by name, so the hierarchy is defined once.
"""

from __future__ import annotations

__all__ = [
    "HSCaptureError",
    "RingError",
    "SegmentExistsError",
    "SegmentNotFoundError",
    "SegmentPermissionError",
    "LayoutMismatchError",
    "EpochMismatchError",
    "OutOfSpaceError",
    "RecordTooLargeError",
    "RingFullError",
    "ConsumerSlotsExhaustedError",
    "SubscriptionNotFoundError",
    "SubscriptionInUseError",
    "NoticeError",
    "NoticeVersionError",
    "StaleEpochError",
    "InvalidRidError",
    "InvalidProducerIdError",
    "RecordFormatError",
    "SampleMismatchError",
    "SampleTimeoutError",
    "IncompleteSampleError",
    "SampleDroppedError",
    "ShardError",
    "SampleRefusedError",
    "DuplicateRidError",
    "EndpointError",
    "CaptureConfigError",
    "InvalidMetaError",
    "UnsupportedEngineError",
    "ExportError",
    "ExportWriteError",
    "MissingExtraError",
]


class HSCaptureError(Exception):
    """Base class of every error hscapture raises on purpose."""


# --- the ring ---------------------------------------------------------------


class RingError(HSCaptureError):
    """A shared-memory ring operation failed (generic; see subclasses)."""


class SegmentExistsError(RingError):
    """A segment with this name already exists (segments are created O_EXCL)."""


class SegmentNotFoundError(RingError):
    """No segment with this name exists."""


class SegmentPermissionError(RingError):
    """The segment is owned by another user or has a mode other than 0600."""


class LayoutMismatchError(RingError):
    """The segment's magic or layout version is not the one this build understands."""


class EpochMismatchError(RingError):
    """The segment belongs to another producer incarnation (epoch) than expected."""


class OutOfSpaceError(RingError):
    """Space for the segment could not be reserved (ENOSPC in /dev/shm)."""


class RecordTooLargeError(RingError):
    """A record can never fit: its total size exceeds the ring's capacity."""


class RingFullError(RingError):
    """The ring had no room (raised only where a caller asked to be told by exception)."""


class ConsumerSlotsExhaustedError(RingError):
    """No consumer slot is free: each is held by a live consumer or a durable subscription."""


class SubscriptionNotFoundError(RingError):
    """``resume_only=True`` and the segment has no slot under that resume name (none created)."""


class SubscriptionInUseError(RingError):
    """A live consumer already holds the durable subscription of that resume name."""


# --- notices ------------------------------------------------------------------


class NoticeError(HSCaptureError):
    """A notice is malformed: not msgpack, a missing or mistyped field, an impossible value."""


class NoticeVersionError(NoticeError):
    """A notice carries a protocol version this build does not speak."""


class StaleEpochError(NoticeError):
    """A notice or record of an old producer incarnation arrived after a newer one."""


class InvalidRidError(NoticeError):
    """A request id breaks the rid rules (docs/PROTOCOL.md "rid rules"; ``notice.check_rid``)."""


class InvalidProducerIdError(NoticeError):
    """A producer id is not 1..128 characters of ``[A-Za-z0-9_.-]``."""


class RecordFormatError(NoticeError):
    """A ring entry's payload breaks docs/PROTOCOL.md: framing, meta schema or block layout."""


# --- samples ------------------------------------------------------------------


class SampleMismatchError(HSCaptureError):
    """Notice, ring record and tensors disagree (rid, epoch, seq, length or token count)."""


class SampleTimeoutError(HSCaptureError, TimeoutError):
    """A requested sample did not complete within the timeout."""


class IncompleteSampleError(HSCaptureError):
    """A sample cannot be completed: positions are missing (cached prefix, abort, drop)."""


class SampleDroppedError(HSCaptureError):
    """The producer dropped (part of) this sample, e.g. because the ring was full."""


# --- output / wiring ------------------------------------------------------------


class ShardError(HSCaptureError):
    """Writing or reading a shard directory failed (unwritable, full disk, corrupt index)."""


class SampleRefusedError(ShardError):
    """This one sample cannot be written (bad rid, inconsistent tensors, duplicate); nothing
    of it was written and the writer is still usable. ``rid`` names it."""

    def __init__(self, message: str, rid: object = None) -> None:
        super().__init__(message)
        self.rid = rid


class DuplicateRidError(SampleRefusedError):
    """The rid is already in this shard directory (written before, or added twice)."""


class EndpointError(HSCaptureError):
    """A ZeroMQ endpoint is malformed, unreachable, or not a hscapture producer."""


class CaptureConfigError(HSCaptureError):
    """Capture was configured inconsistently (layers, dtype, shapes, environment)."""


class InvalidMetaError(HSCaptureError, ValueError):
    """Per-sample metadata (``hscapture_meta``) breaks the meta rule
    (``hscapture.sglang.config.check_meta``): not a small flat map of str to scalars."""


class UnsupportedEngineError(HSCaptureError):
    """The installed inference engine version is outside the supported range."""


class ExportError(HSCaptureError):
    """An export cannot be made (layers not captured, no loss mask, output holds another
    export) or failed while writing (:mod:`hscapture.export`)."""


class ExportWriteError(ExportError):
    """An export failed while writing (a full disk, an unwritable or vanished directory):
    every file already in place is complete, and a rerun resumes."""


class MissingExtraError(HSCaptureError, ImportError):
    """What was asked needs an optional package that is not installed.

    The message names the package and the extra that installs it
    (``pip install 'hscapture[EXTRA]'``). Nothing was written. The CLI exits 1: the
    environment lacks something, unlike a refusal (exit 2), where the input cannot produce
    what was asked.
    """
