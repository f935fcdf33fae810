"""Durable subscriptions that outlive a producer incarnation: the names registered for one
producer id, in a small file beside its segments.

A durable subscriber (``Subscriber(name=...)``) takes a place in the ring of every
incarnation it attaches to. A new incarnation (a restarted server) had no place for it until
the subscriber attached again, and what it committed before that (all of it, if it ended
first) was neither delivered nor reported (until 2026-12-05). So each name is also recorded
here, per producer id, and a new incarnation registers a place for every recorded name in its
fresh ring before its first capture (:func:`reserve_places`): the ring keeps its records for
that subscriber from the start, exactly as for one that attached and then went away (bounded
by the ring: a full ring drops, and the drops are named by rid when it returns).

A name stays recorded until ``Subscriber.unsubscribe()`` (:func:`forget_everywhere`); a new
incarnation skips (and forgets, with a warning) a name whose subscriber process is gone and
which no subscriber attached for longer than ``HSCAPTURE_DURABLE_KEEP_S`` (default 7 days), so
that a forgotten drain does not pin every future ring. A live subscriber is always kept.

The file: ``$HSCAPTURE_SUBS_DIR`` (default ``/dev/shm``) ``/hscapture.subs-<uid>-<producer id>``
(mode 0600; the key is the segment name without its random suffix), one line per name:
``name<TAB>pid<TAB>unix time of the last attach``, rewritten whole under an ``flock`` of
``<file>.lock``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import time
from pathlib import Path

from .ring import DEFAULT_PREFIX, SHM_DIR

log = logging.getLogger("hscapture")

__all__ = ["registry_path", "endpoint_registry_path", "entries", "remember",
           "forget_everywhere", "reserve_places", "KEEP_S"]

_FILE_PREFIX = "hscapture.subs-"
#: how long a name whose subscriber is gone keeps places in new incarnations (seconds)
KEEP_S = 7 * 24 * 3600.0
#: consumer slots a new incarnation leaves free for subscribers that attach (reserve_places
#: keeps places for at most max_consumers minus this many names)
FREE_SLOTS = 2


def _dir() -> Path:
    return Path(os.environ.get("HSCAPTURE_SUBS_DIR") or SHM_DIR)


def _keep_s() -> float:
    try:
        return float(os.environ.get("HSCAPTURE_DURABLE_KEEP_S") or KEEP_S)
    except ValueError:
        return KEEP_S


def registry_path(segment: str) -> Path:
    """The file of the producer id whose segment is ``segment`` (``hscapture-<uid>-<id>-<hex>``)."""
    base = segment.rsplit("-", 1)[0]
    if not base.startswith(DEFAULT_PREFIX):
        raise ValueError(f"not an hscapture segment name: {segment!r}")
    return _dir() / (_FILE_PREFIX + base[len(DEFAULT_PREFIX):])


def endpoint_registry_path(endpoint: str) -> Path:
    """The file of an endpoint: what a durable subscriber records before it ever attached
    (it knows the endpoint, not yet the producer id), read by every producer that binds it.
    ``ipc://PATH`` by its absolute path; ``tcp://HOST:PORT`` by its port (the producer binds
    ``0.0.0.0`` or ``*`` where the subscriber connects to an address)."""
    if endpoint.startswith("ipc://"):
        key = "ipc://" + os.path.abspath(endpoint[len("ipc://"):])
    elif endpoint.startswith("tcp://"):
        key = "tcp:" + endpoint.rsplit(":", 1)[-1]
    else:
        key = endpoint
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return _dir() / f"{_FILE_PREFIX}{os.geteuid()}-ep-{digest}"


def _parse(text: str) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0]:
            try:
                out[parts[0]] = (int(parts[1]), float(parts[2]))
            except ValueError:
                continue
    return out


def entries(segment: str) -> dict[str, tuple[int, float]]:
    """The names recorded for ``segment``'s producer id: name -> (pid, last attach time)."""
    try:
        return _parse(registry_path(segment).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _update(path: Path, change) -> None:   # change(dict) edits the entries in place
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            have = _parse(path.read_text())
        except FileNotFoundError:
            have = {}
        want = dict(have)
        change(want)
        if want == have:
            return
        if not want:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{n}\t{p}\t{t:.0f}\n" for n, (p, t) in want.items()))
        os.replace(tmp, path)
    finally:
        os.close(lock)


def remember(name: str, *, segment: str | None = None, endpoint: str | None = None) -> None:
    """Record ``name`` for the producer id of ``segment`` (a durable subscriber attached to
    it now), or for ``endpoint`` (one about to wait for producers there)."""
    def add(d: dict[str, tuple[int, float]]) -> None:
        d[name] = (os.getpid(), time.time())
    try:
        path = registry_path(segment) if segment is not None else \
            endpoint_registry_path(str(endpoint))
        _update(path, add)
    except (OSError, ValueError) as exc:   # best effort: the place in this ring exists anyway
        log.warning("hscapture subscriber: cannot record durable subscription %r for the "
                    "next incarnations of %s: %s", name, segment or endpoint, exc)


def forget_everywhere(name: str) -> None:
    """Remove ``name`` from every producer id's file of this user (``unsubscribe``)."""
    prefix = f"{_FILE_PREFIX}{os.geteuid()}-"
    try:
        names = os.listdir(_dir())
    except OSError:
        return
    for entry in names:
        if entry.startswith(prefix) and not entry.endswith(".lock") and ".tmp" not in entry:
            try:
                _update(_dir() / entry, lambda d: d.pop(name, None))
            except OSError as exc:
                log.warning("hscapture subscriber: cannot remove %r from %s: %s", name, entry,
                            exc)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reserve_places(segment: str, endpoint: str | None = None) -> list[str]:
    """A new incarnation, before its first capture: register a durable place in its own ring
    ``segment`` for every name recorded for its producer id (the place of a subscriber that
    attached and went away: it bounds the producer until that subscriber resumes it). Names
    whose subscriber is gone and did not attach for ``HSCAPTURE_DURABLE_KEEP_S`` are forgotten
    instead. Returns the names reserved; never raises (logged)."""
    from . import _ring

    try:
        paths = [registry_path(segment)]
        if endpoint is not None:
            paths.append(endpoint_registry_path(endpoint))
    except ValueError:
        return []
    now, keep = time.time(), _keep_s()
    recorded: dict[str, tuple[int, float]] = {}
    stale: list[str] = []
    try:
        for path in paths:
            try:
                got = _parse(path.read_text())
            except FileNotFoundError:
                continue
            old = [n for n, (pid, t) in got.items() if now - t > keep and not _alive(pid)]
            if old:
                _update(path, lambda d: [d.pop(n, None) for n in old])
            stale += [n for n in old if n not in recorded]
            for n, v in got.items():
                if n not in old and (n not in recorded or v[1] > recorded[n][1]):
                    recorded[n] = v
        stale = [n for n in dict.fromkeys(stale) if n not in recorded]
    except OSError as exc:
        log.warning("hscapture: cannot read the durable subscriptions of %s: %s", segment, exc)
        return []
    for n in stale:
        log.warning("hscapture: durable subscription %r did not attach for over %.1f days and "
                    "its subscriber is gone: %s keeps no place for it "
                    "(HSCAPTURE_DURABLE_KEEP_S)", n, keep / 86400, segment)
    # Never all the ring's consumer slots: places kept for names whose subscribers are away
    # left none for a new subscriber (a user whose drains went into many directories: each
    # a durable name; CI's test producer met 8 of them, 2026-12-05, and no drain could
    # attach). The newest names (by last attach) keep theirs; the others are told.
    try:
        slots = int(_ring.segment_info(segment)["max_consumers"])
    except Exception:
        slots = 8
    room = max(0, slots - FREE_SLOTS)
    order = sorted(recorded, key=lambda n: (_alive(recorded[n][0]), recorded[n][1]),
                   reverse=True)
    if len(order) > room:
        log.warning("hscapture: %s has %d consumer slots and keeps %d free for new "
                    "subscribers: no place here for the durable subscription(s) %s (the least "
                    "recently attached; a place is taken when one attaches again; "
                    "`hscapture drain --unsubscribe` ends one for good)", segment, slots,
                    FREE_SLOTS, ", ".join(order[room:]))
    done = []
    for name in order[:room]:
        try:
            c = _ring.Consumer(segment, 0, name)
            c.close()                      # keeps the durable place, as a subscriber's close
            done.append(name)
        except Exception as exc:   # no free slot, an odd name: the others still go on
            log.warning("hscapture: cannot keep a place for durable subscription %r in %s: "
                        "%s", name, segment, exc)
    if done:
        log.info("hscapture: %s keeps its records for the durable subscription(s) %s from its "
                 "first capture", segment, ", ".join(done))
    away = [n for n in done if not _alive(recorded[n][0])]
    if away:
        log.warning("hscapture: %s keeps a place for durable subscription(s) whose subscriber "
                    "is not running: %s. Until it returns, its records stay, and a full ring "
                    "drops (named by rid); `hscapture drain --unsubscribe -e ENDPOINT -o DIR` "
                    "(Subscriber.unsubscribe()) ends one for good", segment, ", ".join(away))
    return done
