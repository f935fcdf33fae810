"""What one producer holds of the operating system, taken together and given back in order.

:class:`ProducerResources` takes, in this order:

1. the endpoint's claim (:func:`~hscapture.endpoint.claim_endpoint`), before anything else, so
   two producers never share an endpoint;
2. the ring segment in ``/dev/shm``, after removing what a dead predecessor with the same id
   left (unless a durable subscriber still reads it);
3. the page-locking of the ring's mapping (``pin``), which the native CUDA copies need;
4. a ZeroMQ PUB socket bound to the endpoint.

Guarantees: a constructor that fails gives back everything it took before it raises.
:meth:`ProducerResources.release` gives everything back in reverse order.
:meth:`ProducerResources.abandon` is for a close that cannot finish in order: it removes the
names now (the socket file, the claim, the segment name) and leaves the mapping to the process's
exit, so that a copy still in flight never writes into unmapped memory. Both leave a segment in
place while a durable subscriber has not read it all (``hscapture cleanup`` removes it later).

The producer's logic (captures, sequence numbers, publishing) is :mod:`hscapture.producer`;
nothing here knows about entries.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import zmq

from .endpoint import claim_endpoint, release_endpoint
from .errors import EndpointError
from .pinning import register_host_memory
from ._subscriptions import record_segment, reserve_places
from .ring import leftover_unread, remove_leftover, segment_name

log = logging.getLogger("hscapture")

__all__ = ["ProducerResources", "last_attach"]

#: rings kept for a durable subscriber after an abandoned close: never destroyed (their
#: destructor would unlink the segment), so they are held until the process ends
_KEPT_FOR_DURABLE: list[Any] = []


class ProducerResources:
    """The endpoint claim, the ring (``ring``), its page-locking (``pinned``, or None) and
    the bound PUB socket (``sock``) of one producer. See the module docstring."""

    def __init__(self, endpoint: str, producer_id: str, *, capacity: int, max_consumers: int,
                 control_reserve: int, durable_expiry_s: float, pin: bool,
                 sndhwm: int) -> None:
        from . import _ring

        self.endpoint = endpoint
        self.claim: Any = None
        self.ring: Any = None
        self.pinned: Any = None
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        try:
            self.claim = claim_endpoint(endpoint)
            name = segment_name(producer_id)
            # A predecessor with this id that was killed (an engine's scheduler is, at
            # shutdown) left its segment: remove it now, unless a durable subscriber needs it.
            _remove_stale_predecessors(name)
            self.ring = _ring.Producer(name, capacity, int(max_consumers), 0,
                                       int(control_reserve))
            if durable_expiry_s:
                self.ring.durable_expiry_ns = int(durable_expiry_s * 1e9)
            # the durable subscriptions of this endpoint get their places before the first
            # capture: what this one commits is kept for them even if they attach late, or
            # never while it lives (its segment then stays for them, and only they adopt it)
            record_segment(endpoint, name)
            reserve_places(name, endpoint)
            if pin:
                self.pinned = register_host_memory(self.ring.map_address, self.ring.map_size)
            self.ctx = zmq.Context()
            self.sock = self.ctx.socket(zmq.PUB)
            self.sock.setsockopt(zmq.SNDHWM, sndhwm)
            self.sock.setsockopt(zmq.LINGER, 2000)
            try:
                self.sock.bind(endpoint)
            except zmq.ZMQError as exc:
                raise EndpointError(f"cannot bind {endpoint}: {exc}") from exc
        except BaseException:
            self.release(unlink=True)
            raise

    def release(self, unlink: bool | None) -> None:
        """Close the socket, unpin and unmap the ring, give the endpoint back (each once).
        ``unlink``: True removes the segment name; None removes it unless a durable subscriber
        still has unread entries in it (it then stays for that subscriber)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
        if self.pinned is not None:
            self.pinned.close()
            self.pinned = None
        if self.ring is not None:
            name = self.ring.name
            keep = unlink is None and durable_unread(name)
            if keep:
                log.info("hscapture: segment %s kept for a durable subscriber that has not "
                         "read it all", name)
            self.ring.close(not keep)
            self.ring = None
            if not keep:
                remove_leftover(name)   # (a leftover file lives as long as its segment)
        self._release_claim()

    def abandon(self) -> None:
        """Remove the names now (segment unless a durable subscriber needs it, socket file,
        claim) and leave the mapping, and everything that uses it, to the process's exit."""
        ring = self.ring
        if ring is not None:
            try:
                if durable_unread(ring.name):
                    _KEPT_FOR_DURABLE.append(ring)
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(ring))   # never given back
                else:
                    from . import _ring
                    _ring.unlink(ring.name)
                    remove_leftover(ring.name)
            except Exception as exc:
                log.warning("hscapture: could not remove segment %s: %s", ring.name, exc)
        try:
            self._release_claim()
        except Exception as exc:
            log.warning("hscapture: could not release endpoint %s: %s", self.endpoint, exc)

    def _release_claim(self) -> None:
        if self.claim is not None:
            release_endpoint(self.endpoint, self.claim)
            self.claim = None


def last_attach(name: str) -> int:
    """The highest ring position at which a live subscriber of segment ``name`` started
    reading (the head when none is attached): what lies before it was not read by at least
    one of them. (The lowest, until 2026-12-06: a durable place kept from the ring's start,
    resumed just after the first live subscriber attached at the head, made it 0, and the
    unheard entry named nothing to that subscriber; fault hunt x1.)"""
    from . import _ring

    info = _ring.segment_info(name)
    starts = [c["attached_at"] for c in info["consumers"] if c.get("alive")]
    return max(starts) if starts else info["head"]


def durable_unread(name: str) -> bool:
    """True if a durable subscription of segment ``name`` has not released everything, or
    has not read the drops of its leftover file (:func:`hscapture.ring.leftover_unread`)."""
    from . import _ring

    try:
        info = _ring.segment_info(name)
    except Exception:
        return False
    head = info["head"]
    return any(c.get("durable") and c.get("state") != 0 and c["released"] < head
               for c in info["consumers"]) or bool(leftover_unread(name, info))


def _remove_stale_predecessors(name: str) -> None:
    from .ring import cleanup_stale

    try:
        for action in cleanup_stale(name.rsplit("-", 1)[0] + "-"):
            log.info("hscapture: %s stale segment %s of a dead predecessor%s", action.action,
                     action.name, "" if action.action == "removed" else f" ({action.reason})")
    except Exception as exc:   # cleanup is best effort; never a reason not to capture
        log.warning("hscapture: could not clean up stale segments: %s", exc)
