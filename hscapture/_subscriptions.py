"""Durable subscriptions that outlive a producer incarnation, scoped to endpoints: the names
registered at an endpoint, and the rings made for it, in two small files per endpoint.

A durable subscriber (``Subscriber(name=...)``) takes a place in the ring of every
incarnation it attaches to. A new incarnation (a restarted server) had no place for it until
the subscriber attached again, and what it committed before that (all of it, if it ended
first) was neither delivered nor reported (until 2026-12-05). So each name is also recorded
here, per endpoint, and a new incarnation that binds the endpoint registers a place for every
recorded name in its fresh ring before its first capture (:func:`reserve_places`): the ring
keeps its records for that subscriber from the start, exactly as for one that attached and
then went away (bounded by the ring: a full ring drops, and the drops are named by rid when
it returns).

An endpoint is what a durable name belongs to: the same name at two endpoints is two
subscriptions (two servers' trainers both called ``trainer-1``). Each producer therefore also
records the segment it made for its endpoint (:func:`record_segment`), and a subscriber adopts
the ring of an ended producer only if one of its own endpoints made it
(:func:`segments_of`). Until 2026-12-05 names were kept per producer id and rings adopted by
name alone: two servers with the default producer id kept places for each other's trainers,
and the first trainer to return took both rings' samples (the other's lost without a word).

A name stays recorded until ``Subscriber.unsubscribe()`` (:func:`forget`, at that
subscriber's endpoints); a new incarnation skips (and forgets, with a warning) a name whose
subscriber process is gone and which no subscriber attached for longer than
``HSCAPTURE_DURABLE_KEEP_S`` (default 7 days), so that a forgotten drain does not pin every
future ring. A live subscriber is always kept.

The files, mode 0600, each rewritten whole under an ``flock`` of ``<file>.lock``, keyed by
the endpoint (:func:`endpoint_key`), both in ``/dev/shm`` beside the segments whatever
``HSCAPTURE_SUBS_DIR`` says (the files a server and its trainers share):
``hscapture.subs-<uid>-ep-<key>``, one line per name: ``name<TAB>pid<TAB>unix time of the
last attach``; ``hscapture.rings-<uid>-ep-<key>``, one segment name per line (a segment that
no longer exists is dropped at the next write). Per durable name (PROTOCOL.md), in
``$HSCAPTURE_SUBS_DIR`` (default ``/dev/shm``; only the trainer's side reads them):
``hscapture.who-``, what it is; ``hscapture.acked-``, the failures its
subscribers acknowledged (:func:`record_acknowledged`) and the samples they acknowledged out
of queue order (:func:`record_acknowledged_ahead`); ``hscapture.pending-``, those read
and not acknowledged when the bounds on the ring gave their records back
(:func:`record_pending`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Collection, Iterable

from .errors import CaptureConfigError, InvalidRidError
from .notice import check_rid
from .record import ENDED, ended_by_abort, parse_event
from .ring import DEFAULT_PREFIX, SHM_DIR, SLOT_NAME_LEN
from .shard_index import append_lines

log = logging.getLogger("hscapture")

__all__ = ["check_name", "MAX_NAME_BYTES", "NAME_RULE", "endpoint_key",
           "endpoint_registry_path", "segments_path", "entries", "remember",
           "forget", "record_segment", "segments_of", "reserve_places", "describe", "who",
           "acknowledged", "record_acknowledged", "record_acknowledged_ahead", "pending", "record_pending",
           "settle_pending", "forget_pending", "KEEP_S", "ACKED_KEEP"]

_FILE_PREFIX = "hscapture.subs-"
_RINGS_PREFIX = "hscapture.rings-"
_WHO_PREFIX = "hscapture.who-"
_ACKED_PREFIX = "hscapture.acked-"
_PENDING_PREFIX = "hscapture.pending-"
#: failures a durable name's record of acknowledgements keeps (the newest): older ones' ring
#: records are long gone, and a resumer cannot read them again
ACKED_KEEP = 1 << 16
#: how long a name whose subscriber is gone keeps places in new incarnations (seconds)
KEEP_S = 7 * 24 * 3600.0
#: consumer slots a new incarnation leaves free for subscribers that attach (reserve_places
#: keeps places for at most max_consumers minus this many names)
FREE_SLOTS = 2


#: the longest durable name, in UTF-8 bytes (a ring slot's name field, NUL-terminated)
MAX_NAME_BYTES = SLOT_NAME_LEN - 1
#: what a durable name may not contain: control characters (C0, DEL, C1) and the line and
#: paragraph separators (the names file holds one name per line, TAB-separated)
_NAME_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
NAME_RULE = (f"1..{MAX_NAME_BYTES} UTF-8 bytes, no control character (U+0000..U+001F, "
             "U+007F..U+009F) and no line or paragraph separator (U+2028, U+2029)")


def check_name(name: object) -> str:
    """Return ``name`` if it can be a durable subscription's name (:data:`NAME_RULE`), else
    raise :class:`~hscapture.errors.CaptureConfigError` saying what was expected and found.
    The one rule, checked where a name enters (``Subscriber(name=...)``) before anything is
    recorded: until 2026-12-05 a name with a line break was recorded as two (a restarted
    producer kept no place for it, and one for a phantom name) and one of 64 bytes or more
    failed only at the first attach, with a plain ValueError, after it was recorded."""
    if type(name) is not str:
        raise CaptureConfigError(f"durable name: expected str, found {type(name).__name__}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise CaptureConfigError(f"durable name {name[:40]!r}: expected valid Unicode, found "
                                 f"a lone surrogate at index {exc.start}") from None
    if not 0 < size <= MAX_NAME_BYTES:
        raise CaptureConfigError(
            f"durable name {name[:40]!r}: expected {NAME_RULE}; found {size} bytes")
    bad = _NAME_FORBIDDEN.search(name)
    if bad is not None:
        raise CaptureConfigError(
            f"durable name {name[:40]!r}: expected {NAME_RULE}; found U+{ord(bad.group()):04X} "
            f"at index {bad.start()}")
    return name


def _dir() -> Path:
    """``$HSCAPTURE_SUBS_DIR`` (default ``/dev/shm``), created (mode 0700) when missing."""
    d = Path(os.environ.get("HSCAPTURE_SUBS_DIR") or SHM_DIR)
    if not d.is_dir():
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            pass            # the write that needs it says why
    return d


def _read(path: Path) -> str:
    """``path``'s text; bytes that are not UTF-8 (a file damaged or not ours) become U+FFFD,
    so that such a line is skipped, never a UnicodeDecodeError in a subscriber or producer
    (until 2026-12-06 a byte that is not UTF-8 in a pending or acknowledged file raised
    out of a durable Subscriber)."""
    return path.read_bytes().decode("utf-8", "replace")


def _keep_s() -> float:
    try:
        return float(os.environ.get("HSCAPTURE_DURABLE_KEEP_S") or KEEP_S)
    except ValueError:
        return KEEP_S


def endpoint_key(endpoint: str) -> str:
    """What names an endpoint in the files (producers and subscribers alike): the first 16
    hex digits of a SHA-1 of

    - ``ipc://PATH``: its real path (symbolic links resolved: a trainer that reached the
      server's socket through a linked folder kept its name under another key until
      2026-12-05, and a restarted server kept no place for it);
    - ``tcp://HOST:PORT``: its port alone. A producer binds ``*``, ``0.0.0.0``, an address, a
      host name or an interface name where its subscriber connects to an address or a name
      spelled its own way; keyed by address too, every pair of spellings the two did not
      share (an interface name, ``127.1``, a name that does not resolve) lost the
      subscriber's samples without a word (fault hunt 8, 2026-12-05), so two servers on one
      port of two addresses share a key instead (GUARANTEES gap 7)."""
    if endpoint.startswith("ipc://"):
        text = "ipc://" + os.path.realpath(endpoint[len("ipc://"):])
    elif endpoint.startswith("tcp://"):
        text = "tcp:" + endpoint.rsplit(":", 1)[-1]
    else:
        text = endpoint
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def endpoint_registry_path(endpoint: str) -> Path:
    """The durable names recorded at an endpoint (by subscribers, before or after they
    attached), read by every producer that binds it: in ``/dev/shm`` beside the rings file,
    whatever ``HSCAPTURE_SUBS_DIR`` says. Why: it is the one file a server reads from its
    trainers' side; in that folder, a trainer and a server that disagreed on it (one set, the
    other not) lost every sample committed while the trainer was away, without a word
    (GUARANTEES gap 8, open from 2026-12-05 to 2026-12-07)."""
    return Path(SHM_DIR) / f"{_FILE_PREFIX}{os.geteuid()}-ep-{endpoint_key(endpoint)}"


def segments_path(endpoint: str) -> Path:
    """The segments producers made for an endpoint (what its durable subscribers may adopt):
    in ``/dev/shm`` beside the segments themselves, whatever ``HSCAPTURE_SUBS_DIR`` says (a
    server and a trainer that disagreed on it would otherwise never adopt a kept ring)."""
    return Path(SHM_DIR) / f"{_RINGS_PREFIX}{os.geteuid()}-ep-{endpoint_key(endpoint)}"


def _parse(text: str) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for line in text.split("\n"):       # (not splitlines: it splits at more than "\n")
        parts = line.split("\t")
        if len(parts) == 3 and parts[0]:
            try:
                out[parts[0]] = (int(parts[1]), float(parts[2]))
            except ValueError:
                continue
    return out


def entries(endpoint: str) -> dict[str, tuple[int, float]]:
    """The names recorded at ``endpoint``: name -> (pid, last attach time)."""
    try:
        return _parse(_read(endpoint_registry_path(endpoint)))
    except FileNotFoundError:
        return {}


def _rewrite(path: Path, parse: Callable[[str], Any], render: Callable[[Any], str],
             change: Callable[[Any], None]) -> None:
    """Read ``path`` (missing: empty), let ``change`` edit what ``parse`` made of it in
    place, and write it back whole (``render``; removed when empty) under an exclusive
    ``flock`` of ``<path>.lock``: concurrent writers never lose each other's lines."""
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            text = _read(path)
        except FileNotFoundError:
            text = ""
        have = parse(text)
        want = parse(text)
        change(want)
        if want == have:
            return
        if not want:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(render(want))
        os.replace(tmp, path)
    finally:
        os.close(lock)


def _update(path: Path, change: Callable[[dict[str, tuple[int, float]]], Any]) -> None:
    _rewrite(path, _parse, lambda d: "".join(f"{n}\t{p}\t{t:.0f}\n" for n, (p, t) in d.items()),
             change)


def remember(name: str, *, endpoint: str) -> None:
    """Record ``name`` at ``endpoint`` (a durable subscriber of it starts, or attached to a
    ring made for it now): producers that bind it keep a place for the name."""
    def add(d: dict[str, tuple[int, float]]) -> None:
        d[name] = (os.getpid(), time.time())
    try:
        _update(endpoint_registry_path(endpoint), add)
    except OSError as exc:   # best effort: the places in the rings it attached exist anyway
        log.warning("hscapture subscriber: cannot record durable subscription %r for the "
                    "next incarnations at %s: %s", name, endpoint, exc)


def forget(name: str, endpoints: Iterable[str]) -> None:
    """Remove ``name`` from the files of ``endpoints`` (``unsubscribe``): the same name at
    another endpoint is another subscription, and stays."""
    for endpoint in endpoints:
        try:
            _update(endpoint_registry_path(endpoint), lambda d: d.pop(name, None))
        except OSError as exc:
            log.warning("hscapture subscriber: cannot remove %r from the durable "
                        "subscriptions at %s: %s", name, endpoint, exc)


def _segment_lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith(DEFAULT_PREFIX)]


def record_segment(endpoint: str, segment: str) -> None:
    """A producer made ``segment`` for ``endpoint`` (before its first capture): the durable
    subscribers of this endpoint, and only they, may adopt it once its producer ended.
    Segments that no longer exist are dropped from the file. Never raises (logged: a ring not
    recorded is still read by the notices of its live producer)."""
    def add(segments: list[str]) -> None:
        segments[:] = [s for s in segments if s != segment and os.path.exists(os.path.join(SHM_DIR, s))]
        segments.append(segment)
    try:
        _rewrite(segments_path(endpoint), _segment_lines,
                 lambda segments: "".join(f"{s}\n" for s in segments), add)
    except OSError as exc:
        log.warning("hscapture: cannot record segment %s as made for %s (its durable "
                    "subscribers will not adopt it once it ended): %s", segment, endpoint, exc)


def segments_of(endpoints: Iterable[str]) -> set[str]:
    """The segments producers made for any of ``endpoints`` (:func:`record_segment`)."""
    out: set[str] = set()
    for endpoint in endpoints:
        try:
            out.update(_segment_lines(_read(segments_path(endpoint))))
        except FileNotFoundError:
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reserve_places(segment: str, endpoint: str) -> list[str]:
    """A new incarnation, before its first capture: register a durable place in its own ring
    ``segment`` for every name recorded at its ``endpoint`` (the place of a subscriber that
    attached and went away: it bounds the producer until that subscriber resumes it). Names
    whose subscriber is gone and did not attach for ``HSCAPTURE_DURABLE_KEEP_S`` are forgotten
    instead. Returns the names reserved; never raises (logged)."""
    from . import _ring

    path = endpoint_registry_path(endpoint)
    now, keep = time.time(), _keep_s()
    try:
        try:
            recorded = _parse(_read(path))
        except FileNotFoundError:
            recorded = {}
        stale = [n for n, (pid, t) in recorded.items() if now - t > keep and not _alive(pid)]
        if stale:
            _update(path, lambda d: [d.pop(n, None) for n in stale])
            for n in stale:
                del recorded[n]
    except OSError as exc:
        log.warning("hscapture: cannot read the durable subscriptions of %s: %s", endpoint, exc)
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


def _who_path(name: str) -> Path:
    return _named_path(_WHO_PREFIX, name)


def describe(name: str, **info: Any) -> None:
    """Record what the durable subscription ``name`` is (a drain: its output directory and
    endpoints), so that a message about a place kept for it (``hscapture cleanup``) can say
    how to end it. Best effort (logged at debug level)."""
    path = _who_path(name)
    old = who(name) or {}
    if isinstance(old.get("endpoints"), list) and isinstance(info.get("endpoints"), list) \
            and old.get("out_dir") == info.get("out_dir"):
        # every endpoint the name was ever used at: its places may be in any of their rings
        # (a drain run with -e A -e B, then with -e A alone, still holds B's ring)
        info["endpoints"] = list(dict.fromkeys([*old["endpoints"], *info["endpoints"]]))
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"name": name, **info}, f)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError) as exc:
        log.debug("hscapture: cannot describe durable subscription %r: %s", name, exc)


def who(name: str) -> dict[str, Any] | None:
    """What :func:`describe` recorded for ``name`` (None: nothing, or unreadable)."""
    try:
        got = json.loads(_read(_who_path(name)))
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) and got.get("name") == name else None


def _named_path(prefix: str, name: str) -> Path:
    digest = hashlib.sha1(name.encode()).hexdigest()[:16]
    return _dir() / f"{prefix}{os.geteuid()}-{digest}"


def _acked_path(name: str) -> Path:
    return _named_path(_ACKED_PREFIX, name)


def acknowledged(name: str) -> tuple[dict[str, str], set[str],
                                      dict[int, list[tuple[int, str, int]]]]:
    """What subscribers of the durable ``name`` acknowledged, read in one pass of its
    acknowledged file: ``event -> rid`` of the failures (:func:`record_acknowledged`) and the
    events of those an abort ended, which a resumer passes to ``Subscriber.known_failures``
    (a failure whose ring record an older record held back is not reported twice); and
    epoch -> ``(last row, rid, first row)`` of the samples acknowledged out of queue order
    (:func:`record_acknowledged_ahead`), which a resumed place skips as those below the
    slot's ``delivered`` (``_settlement.Settlement.inherit_ahead``)."""
    events: dict[str, str] = {}
    aborted: set[str] = set()
    ahead: dict[int, list[tuple[int, str, int]]] = {}
    try:
        text = _read(_acked_path(name))
    except OSError:
        return events, aborted, ahead
    for line in text.split("\n")[:-1]:       # (a torn last line is ignored; the file is cut)
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("event"), str) and isinstance(d.get("rid"), str):
            events[d["event"]] = d["rid"]
            if d.get("aborted") is True:
                aborted.add(d["event"])
            continue
        number = parse_event(d.get("sample"))
        if number is None:
            continue
        rid, first = d.get("rid"), d.get("first")
        if type(rid) is not str or type(first) is not int or not 0 <= first <= number[1]:
            rid, first = "", number[1]        # (the last row alone still says it)
        ahead.setdefault(number[0], []).append((number[1], rid, first))
    return events, aborted, ahead


def record_acknowledged_ahead(name: str, epoch: int, last_seq: int, rid: str,
                              first_seq: int) -> None:
    """Record, before it counts, that a subscriber of the durable ``name`` acknowledged the
    sample ``rid`` (rows ``first_seq`` .. ``last_seq`` of incarnation ``epoch``) while a
    sample queued before it was not (the slot's ``delivered`` covers an in-order prefix
    only): a line ``{"sample": "epoch:last", "rid": ..., "first": ...}`` of the acknowledged
    file. Best effort (logged): one not recorded is handed out again by a resumer."""
    _append_acked(name, json.dumps({"sample": f"{epoch}:{last_seq}", "rid": rid,
                                    "first": first_seq}) + "\n")


def record_acknowledged(name: str, failures: Iterable[tuple[str, str, str, str | None]]) -> None:
    """Append the events of ``failures`` (``Subscriber.failures()`` tuples) that a subscriber
    of the durable ``name`` acknowledges, before it does: in ``$HSCAPTURE_SUBS_DIR``, which a
    SIGKILL leaves as it was. The file is cut to its newest :data:`ACKED_KEEP` failure lines
    and newest :data:`ACKED_KEEP` sample lines (:func:`record_acknowledged_ahead`) when it
    grows past twice that. Best effort: a failure not recorded may be reported again by a
    resumer (logged), never lost."""
    lines = "".join(json.dumps({"event": e, "rid": rid,
                                **({"aborted": True} if ended_by_abort(reason) else {})}) + "\n"
                    for _kind, rid, reason, e in failures if e)
    if lines:
        _append_acked(name, lines)


#: durable name -> the acknowledged file's size after this process last cut it
_ACKED_CUT_SIZE: dict[str, int] = {}


def _keep_newest_of_each_kind(lines: list[str]) -> None:
    """The acknowledged file's cut: the newest :data:`ACKED_KEEP` failure lines and the
    newest :data:`ACKED_KEEP` sample lines, in file order (until 2026-12-06 one window of
    lines, which sample lines of a ``get()``-heavy consumer could fill: older failures were
    then reported again by a resumer; fault hunt H20, read at unit level)."""
    samples = [i for i, line in enumerate(lines) if line.startswith('{"sample"')]
    failures = [i for i, line in enumerate(lines) if not line.startswith('{"sample"')]
    keep = set(samples[-ACKED_KEEP:]) | set(failures[-ACKED_KEEP:])
    lines[:] = [line for i, line in enumerate(lines) if i in keep]


def _append_acked(name: str, lines: str) -> None:
    path = _acked_path(name)
    try:
        append_lines(str(path), lines, fsync=False, mode=0o600)   # (whole lines only)
        size = path.stat().st_size
        if size > max(ACKED_KEEP * 2 * 64, 2 * _ACKED_CUT_SIZE.get(name, 0)):
            # (one live subscriber per durable name: no append races this rewrite)
            _rewrite(path, lambda text: text.split("\n")[:-1],
                     lambda kept: "".join(x + "\n" for x in kept),
                     _keep_newest_of_each_kind)
            # (what a cut keeps may stay past the first bound: the next cut waits until the
            # file doubled, never at every append)
            _ACKED_CUT_SIZE[name] = path.stat().st_size
    except OSError as exc:
        log.warning("hscapture subscriber: cannot record what %r acknowledged (%s): a "
                    "resumer of the name may report (a failure) or hand out (a sample) it "
                    "again", name, exc)


#: a failure as ``Subscriber.failures()`` gives it: ``(kind, rid, reason, event)``
Failure = tuple[str, str, str, "str | None"]
#: the kinds a pending line may have (``Subscriber.failures()``'s)
_PENDING_KINDS = ("dropped", "incomplete", "rejected", ENDED)


def _pending_path(name: str) -> Path:
    return _named_path(_PENDING_PREFIX, name)


def _pending_lines(text: str) -> list[tuple[str, Failure]]:
    """``(endpoint key, failure)`` of each whole line a subscriber wrote (a torn last line,
    and any line it could not have written, are skipped)."""
    out: list[tuple[str, Failure]] = []
    for line in text.split("\n")[:-1]:                 # (a torn last line is ignored)
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not (isinstance(d, dict) and d.get("kind") in _PENDING_KINDS and
                all(type(d.get(k)) is str for k in ("endpoint", "rid", "reason", "event"))
                and parse_event(d["event"]) is not None):
            continue      # (not a line this module wrote: skipped, as a torn one)
        try:
            check_rid(d["rid"])
        except InvalidRidError:
            continue
        out.append((d["endpoint"], (d["kind"], d["rid"], d["reason"], d["event"])))
    return out


def _render_pending(lines: Iterable[tuple[str, Failure]]) -> str:
    return "".join(json.dumps({"endpoint": ep, "kind": k, "rid": rid, "reason": reason,
                               "event": e}) + "\n"
                   for ep, (k, rid, reason, e) in lines)


def pending(name: str, endpoints: Collection[str]) -> list[Failure]:
    """The failures a subscriber of the durable ``name`` read from rings of ``endpoints``
    (their :func:`endpoint_key`) and had not acknowledged when the bounds on the ring gave
    their records back (:func:`record_pending`), in the order they were recorded, each once:
    a resumer of the subscription reports them again, as it would have from the ring, until
    one acknowledges them (:func:`settle_pending`). The same name at other endpoints is
    another subscription: its lines are not these."""
    try:
        lines = _pending_lines(_read(_pending_path(name)))
    except OSError:
        return []
    return list(dict.fromkeys(f for ep, f in lines if ep in endpoints))


def record_pending(name: str, failures: list[tuple[str, Failure]]) -> bool:
    """Append ``failures`` (``(endpoint key, failure)``, each with its ring event) to the
    durable ``name``'s pending file, before the ring records that name them are given back
    unacknowledged (a quarter of the ring or ``partial_hold_s``): a SIGKILL after that leaves
    them to the resumer here, not to no one (GUARANTEES gap 1). Whole lines only (a short
    write is completed, a failed one cut off). False (logged as an error naming the rids)
    when the file cannot be written."""
    if not failures:
        return True
    try:
        append_lines(str(_pending_path(name)), _render_pending(failures), fsync=False,
                     mode=0o600)
    except OSError as exc:
        log.error("hscapture subscriber %r: cannot record %d failure(s) not yet acknowledged "
                  "(%s) before their ring records are given back: if this process dies "
                  "before acknowledging them, its resumer will not report %s", name,
                  len(failures), exc, sorted({f[1] for _ep, f in failures}))
        return False
    return True


def settle_pending(name: str, endpoints: Collection[str], done: Iterable[Failure]) -> None:
    """Take the failures ``done`` (acknowledged, or known to the caller) of ``endpoints`` out
    of the durable ``name``'s pending file (removed when empty). Best effort: one left in it
    is reported again by a resumer (logged), never lost."""
    gone = set(done)
    if gone:
        _edit_pending(name, lambda ep, f: ep in endpoints and f in gone)


def forget_pending(name: str, endpoints: Collection[str]) -> None:
    """Take every line of ``endpoints`` out of the durable ``name``'s pending file
    (``unsubscribe``: nothing resumes the subscription; the name at other endpoints keeps
    its own)."""
    _edit_pending(name, lambda ep, f: ep in endpoints)


def _edit_pending(name: str, drop: Callable[[str, Failure], bool]) -> None:
    try:
        _rewrite(_pending_path(name), _pending_lines, _render_pending,
                 lambda kept: kept.__setitem__(slice(None),
                                               [x for x in kept if not drop(*x)]))
    except OSError as exc:
        log.warning("hscapture subscriber: cannot update the failures %r has pending (%s): a "
                    "resumer of the name may report them again", name, exc)
