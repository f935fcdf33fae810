"""Whether a live process holds a file's advisory lock (``flock``), without taking it."""

from __future__ import annotations

import fcntl
import os

__all__ = ["lock_held"]


def lock_held(path: str | os.PathLike) -> bool:
    """True while another open file description holds an exclusive ``flock`` on ``path``
    (a live writer or producer; the kernel drops it when that process dies); False when the
    file is missing, unreadable or unlocked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
