"""The ZeroMQ side of a subscriber: one SUB socket on every endpoint, notices decoded.

Notices only wake a subscriber up and are cross-checked against the ring by the layers above
(docs/PROTOCOL.md: the ring is the log), so this module knows nothing about rings or samples.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Sequence

import zmq

from . import notice as nt
from ._ledger import Ledger
from .endpoint import check_endpoint
from .errors import NoticeError

__all__ = ["NoticeSocket", "KEEP_S"]

#: how often a socket nobody calls into is touched (seconds): see :meth:`NoticeSocket._keep`
KEEP_S = 0.05
#: how soon the socket retries an endpoint whose publisher is gone (ms). ZeroMQ's default,
#: 100, left an idle anonymous follower deaf to a restarted producer that captured and ended
#: within ~60-120 ms: its samples named nowhere (GUARANTEES gap 11(d); with 100 ms, 3 of 6
#: runs silent at a 60 ms life, 6 of 6 at 10 ms; with 10 ms, 0 of 6 at 10 ms, 1 of 10 at 5 ms:
#: scripts/hunts/reconnect-2026-12-08/). A retry is one connect() on ZeroMQ's I/O thread,
#: no GIL, only while the publisher is gone.
RECONNECT_MS = 10


class NoticeSocket:
    """A SUB socket connected to ``endpoints`` (each checked), subscribed to everything.

    Guarantees: :meth:`receive` hands over only notices that ``notice.decode`` accepted
    (canonical, schema-checked, bounded); anything else is counted as ``malformed_notices``
    in the ledger and skipped, never raised. No notice is ever dropped by the socket itself
    (no receive high-water mark), and one call takes at most ``batch`` frames, so the ring is
    pumped between bursts. The socket stays subscribed to every publisher that binds its
    endpoints while its owner makes no call (:meth:`_keep`).
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
        self.sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        for ep in endpoints:
            self.sock.connect(ep)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        # the socket is used by one thread at a time: the owner's (receive, close) or the
        # keeper's; the lock hands it over (and is the memory barrier ZeroMQ asks for when a
        # socket moves between threads)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name="hscapture-notice-keeper",
                                        daemon=True)
        self._keeper.start()

    def _keep(self) -> None:
        """Touch the socket every :data:`KEEP_S` while no call of its owner holds it.

        ZeroMQ attaches a (re)connected publisher to a SUB socket, and sends that publisher
        the socket's subscription, only when a thread calls into the socket; until then the
        publisher has no subscriber to send to and drops every notice. A subscriber idle
        between calls (a training step) therefore heard nothing of a producer that restarted
        meanwhile, and an incarnation that ended before its next call was neither delivered
        nor reported (fault hunt of 2026-12-06: 60 of 60 samples named nowhere, 5 of 5
        runs). ``getsockopt(EVENTS)`` processes the socket's pending commands, so the
        subscription goes out within ``KEEP_S`` of the reconnect; what the publisher sends
        from then on waits in the socket (no high-water mark) for the owner's next call."""
        while not self._closing.wait(KEEP_S):
            if self._lock.acquire(blocking=False):   # busy: the owner's call does it
                try:
                    if not self._closing.is_set():
                        self.sock.getsockopt(zmq.EVENTS)
                except zmq.ZMQError:   # closed under us: nothing left to keep
                    return
                finally:
                    self._lock.release()

    def locked(self) -> "_Locked":
        """The socket for a caller outside :meth:`receive` (tests that connect it to forged
        publishers or disconnect it): each method call holds the socket's lock."""
        return _Locked(self.sock, self._lock)

    def receive(self, timeout: float, handle: Callable[[dict[str, Any]], None]) -> None:
        """Wait up to ``timeout`` seconds for a notice, then ``handle`` each decoded one that
        is there (at most ``batch``), in arrival order."""
        with self._lock:   # held while notices are handled too: the keeper never waits
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
        self._closing.set()
        self._keeper.join()
        self.sock.close(0)
        self._ctx.term()


class _Locked:
    """A socket whose every method call holds ``lock`` (:meth:`NoticeSocket.locked`)."""

    def __init__(self, sock: Any, lock: threading.Lock) -> None:
        self._sock, self._lock = sock, lock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sock, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)
        return call
