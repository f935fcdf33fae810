"""The shared-memory ring, seen from Python: segment naming, stale-segment cleanup, re-exports.

The ring itself is native (``hscapture._ring``, built from ``csrc/`` and ``bindings/``); its
API is specified in docs/ARCHITECTURE.md section 1. This module adds only what is easier in
Python. Producer/notice/subscriber logic lives elsewhere.
"""

from __future__ import annotations

import os
import re
import secrets

from ._ring import (  # noqa: F401  (re-exports)
    CACHE_LINE,
    LAYOUT_VERSION,
    MAGIC,
    MAX_CONSUMERS,
    RECORD_ALIGN,
    RECORD_HEADER_SIZE,
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
    "record_total_len",
    "SHM_DIR",
    "DEFAULT_PREFIX",
]

#: Where POSIX shared-memory objects appear on Linux.
SHM_DIR = "/dev/shm"
#: Every segment hscapture creates starts with this.
DEFAULT_PREFIX = "hscapture-"

_ID_RE = re.compile(r"[^A-Za-z0-9_.]+")


def segment_name(producer_id: str | int, epoch: int | None = None) -> str:
    """A fresh segment name: ``hscapture-<uid>-<producer_id>-<random hex>``.

    ``producer_id`` is sanitised to ``[A-Za-z0-9_.]`` (other runs become ``_``). The random
    suffix is 8 bytes of ``secrets``, or the 16 hex digits of ``epoch`` if given, so a
    restarted producer never reuses its predecessor's name (segments are created O_EXCL).
    """
    pid = _ID_RE.sub("_", str(producer_id)).strip("_") or "p"
    suffix = f"{epoch & 0xFFFFFFFFFFFFFFFF:016x}" if epoch else secrets.token_hex(8)
    return f"{DEFAULT_PREFIX}{os.geteuid()}-{pid[:64]}-{suffix}"


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Unlink the segments in /dev/shm named ``prefix*``, owned by us, with no live producer.

    A segment is stale when no process holds its producer OFD lock (the kernel drops it when
    the producer dies, even by SIGKILL). Consumers still attached keep their mapping; only the
    name goes away. Returns the names unlinked, sorted.
    """
    removed: list[str] = []
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    uid = os.geteuid()
    for name in sorted(entries):
        if not name.startswith(prefix):
            continue
        try:
            st = os.stat(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            continue
        if st.st_uid != uid:
            continue
        try:
            if is_stale(name):
                unlink(name)
                removed.append(name)
        except Exception:  # vanished meanwhile, or not ours to judge: leave it alone
            continue
    return removed
