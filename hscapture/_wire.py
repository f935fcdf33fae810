"""The ZeroMQ side of a subscriber: one SUB socket on every endpoint, notices decoded.

Notices only wake a subscriber up and are cross-checked against the ring by the layers above
(docs/PROTOCOL.md: the ring is the log), so this module knows nothing about rings or samples.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import zmq

from . import notice as nt
from ._ledger import Ledger
from .endpoint import check_endpoint
from .errors import NoticeError

__all__ = ["NoticeSocket"]


class NoticeSocket:
    """A SUB socket connected to ``endpoints`` (each checked), subscribed to everything.

    Guarantees: :meth:`receive` hands over only notices that ``notice.decode`` accepted
    (canonical, schema-checked, bounded); anything else is counted as ``malformed_notices``
    in the ledger and skipped, never raised. No notice is ever dropped by the socket itself
    (no receive high-water mark), and one call takes at most ``batch`` frames, so the ring is
    pumped between bursts.
    """

    def __init__(self, endpoints: Sequence[str], ledger: Ledger, *, batch: int = 256) -> None:
        for ep in endpoints:
            check_endpoint(ep)
        self.ledger = ledger
        self.batch = batch
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        for ep in endpoints:
            self.sock.connect(ep)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)

    def receive(self, timeout: float, handle: Callable[[dict[str, Any]], None]) -> None:
        """Wait up to ``timeout`` seconds for a notice, then ``handle`` each decoded one that
        is there (at most ``batch``), in arrival order."""
        # rounded up: a wait under 1 ms must not become a busy loop of 0 ms polls
        events = dict(self._poller.poll(math.ceil(timeout * 1000) if timeout > 0 else 0))
        if not events.get(self.sock):
            return
        for _ in range(self.batch):
            try:
                frame = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                msg = nt.decode(frame.buffer)
            except NoticeError as exc:
                self.ledger.error(f"rejected notice: {type(exc).__name__}: {exc}",
                                  "malformed_notices")
                continue
            handle(msg)

    def close(self) -> None:
        self.sock.close(0)
        self._ctx.term()
