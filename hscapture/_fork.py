"""Which process a handle was made in. After ``fork`` the child holds copies of its parent's
producers, subscribers and shard readers, whose rings, sockets, slots, locks and files are
the parent's and still in use: a child's copy must give none of them back (until 2026-12-06
a forked child's normal exit finalized an inherited ``Subscriber`` and freed the parent's
ring slot; the producer then overwrote records the parent had not read).

:func:`generation` is bumped in every forked child (``os.register_at_fork``): a handle keeps
the generation it was made in and compares it with the current one, a list read (``getpid``
is a system call) cheap enough for a hot path.
"""

from __future__ import annotations

import os

__all__ = ["generation", "GENERATION"]

#: ``[n]``: how many forks lie between the first process and this one (read ``GENERATION[0]``
#: on a hot path, :func:`generation` elsewhere)
GENERATION = [0]
os.register_at_fork(after_in_child=lambda: GENERATION.__setitem__(0, GENERATION[0] + 1))


def generation() -> int:
    """The current process's fork generation: a handle made at another one is its parent's."""
    return GENERATION[0]
