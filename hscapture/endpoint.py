"""ZeroMQ endpoints: where a producer publishes notices and how a subscriber finds them.

Default endpoints are ipc sockets inside a private (0700) directory of the current user, so
other users can neither read notices nor inject forged ones. The directory is the first of

1. ``$HSCAPTURE_SOCKET_DIR``
2. ``$XDG_RUNTIME_DIR/hscapture`` (set by systemd for logged-in users)
3. ``<tmp>/hscapture-<uid>`` (root, containers, batch jobs)

and a producer with id ``NAME`` binds ``ipc://<that directory>/NAME.sock`` (SGLang's DP rank
N: ``sglang-dpN``). ``hscapture endpoints`` prints them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import stat
import tempfile
from pathlib import Path

from ._flock import lock_held
from .errors import EndpointError

__all__ = ["socket_dir", "default_endpoint", "check_endpoint", "ipc_path", "claim_endpoint",
           "release_endpoint", "cleanup_sockets", "probe_endpoint", "live_endpoints"]

_ID = re.compile(r"[A-Za-z0-9_.-]+")
_TCP = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[^:/\[\]]+):(\d+|\*)$")
_EXPECTED = "'ipc://PATH' or 'tcp://HOST:PORT'"


def socket_dir() -> Path:
    """The private directory holding default ipc sockets (created 0700, checked if it exists).

    ``$HSCAPTURE_SOCKET_DIR`` overrides it; otherwise ``$XDG_RUNTIME_DIR/hscapture`` or
    ``<tmp>/hscapture-<uid>``. Raises :class:`EndpointError` if it cannot be created or is
    not a directory owned by this user.
    """
    base = os.environ.get("HSCAPTURE_SOCKET_DIR")
    if base:
        path = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "hscapture"
    else:
        path = Path(tempfile.gettempdir()) / f"hscapture-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as exc:
        raise EndpointError(f"cannot create socket directory {path}: {exc.strerror} "
                            f"(set HSCAPTURE_SOCKET_DIR to a writable directory)") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise EndpointError(
            f"socket directory {path}: expected a directory owned by uid {os.getuid()}, "
            f"found mode {stat.filemode(st.st_mode)} owned by uid {st.st_uid}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def default_endpoint(producer_id: str) -> str:
    """``ipc://<socket_dir>/<producer_id>.sock``."""
    if not isinstance(producer_id, str) or not _ID.fullmatch(producer_id):
        raise EndpointError(
            f"producer id must match [A-Za-z0-9_.-]+ to name a socket, found {producer_id!r}")
    return f"ipc://{socket_dir() / producer_id}.sock"


def check_endpoint(endpoint: str, *, allow_inproc: bool = True) -> str:
    """Return ``endpoint`` if it is a ZeroMQ endpoint hscapture can use, else raise
    :class:`EndpointError` saying what was expected.

    Accepted: ``ipc://PATH`` (non-empty path), ``tcp://HOST:PORT`` (port 1-65535, or ``*``
    for "any port" when binding; IPv6 hosts in brackets) and, unless ``allow_inproc`` is
    False, ``inproc://NAME`` (one process only: useless between processes, so the command
    line refuses it).
    """
    expected = _EXPECTED if not allow_inproc else "'ipc://PATH', 'tcp://HOST:PORT' or 'inproc://NAME'"
    if not isinstance(endpoint, str):
        raise EndpointError(f"endpoint: expected {expected}, found {endpoint!r}")
    if endpoint.startswith("ipc://"):
        if len(endpoint) > len("ipc://") and "\0" not in endpoint:
            return endpoint
        raise EndpointError(f"endpoint {endpoint!r}: expected ipc://PATH with a non-empty path")
    if endpoint.startswith("tcp://"):
        m = _TCP.match(endpoint)
        if m is None:
            raise EndpointError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT, e.g. "
                                f"tcp://127.0.0.1:5557 (the port is required)")
        if m.group(2) != "*" and not 1 <= int(m.group(2)) <= 65535:
            raise EndpointError(f"endpoint {endpoint!r}: expected a port in 1-65535, "
                                f"found {m.group(2)}")
        return endpoint
    if endpoint.startswith("inproc://"):
        if not allow_inproc:
            raise EndpointError(
                f"endpoint {endpoint!r}: inproc:// works only inside one process; expected "
                f"{_EXPECTED} to reach a producer in another process")
        if len(endpoint) > len("inproc://"):
            return endpoint
    raise EndpointError(f"endpoint: expected {expected}, found {endpoint!r}")


def ipc_path(endpoint: str) -> Path | None:
    """The filesystem path of an ipc endpoint, or None for other transports."""
    return Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None


def claim_endpoint(endpoint: str) -> int | None:
    """Take the exclusive claim on an ipc endpoint for this process's lifetime.

    ZeroMQ silently replaces an existing ipc socket file on bind, so without a claim a second
    producer would steal a live producer's subscribers. The claim is an flock on
    ``<path>.lock``; the kernel drops it when the holder dies. Returns the lock's fd (close it,
    or pass it to :func:`release_endpoint`, to release), or None for non-ipc endpoints (their
    bind fails by itself when in use).
    """
    path = ipc_path(endpoint)
    if path is None:
        return None
    lock = f"{path}.lock"
    for _ in range(16):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise EndpointError(
                f"cannot create {lock} to claim {endpoint}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise EndpointError(f"endpoint {endpoint} is in use by another producer (pid "
                                f"{holder}); expected a free endpoint") from None
        # cleanup_sockets / release_endpoint may have unlinked the file between our open and
        # flock: a lock on an unlinked inode claims nothing, so start over on the new file
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            return fd
        os.close(fd)
    raise EndpointError(f"cannot claim {endpoint}: {lock} keeps being removed")


def release_endpoint(endpoint: str, fd: int | None) -> None:
    """Give up a claim taken by :func:`claim_endpoint`: remove the ipc socket file and its
    ``.lock`` (while still holding the lock, so no other producer's files are touched), then
    close ``fd``. Call it after the socket is closed. No-op for ``fd=None``."""
    if fd is None:
        return
    path = ipc_path(endpoint)
    try:
        if path is not None:
            for name in (str(path), f"{path}.lock"):
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass
    finally:
        os.close(fd)


def _unix_listener(path: Path) -> bool:
    """Does a process accept connections on the unix socket ``path``?"""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def cleanup_sockets(directory: str | os.PathLike | None = None) -> list[str]:
    """Remove socket files of dead producers from ``directory`` (default :func:`socket_dir`).

    A ``NAME.sock`` / ``NAME.sock.lock`` pair is removed when nobody holds the claim (the
    flock on the ``.lock``; the kernel drops it when its producer dies): the lock is taken
    while removing, so a producer starting at the same moment gets a fresh claim. A ``.sock``
    with no ``.lock`` is removed only if nothing accepts connections on it. Files of live
    producers are never touched. Returns the removed paths.
    """
    d = Path(directory) if directory is not None else socket_dir()
    removed: list[str] = []
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return removed
    except OSError as exc:
        raise EndpointError(f"cannot list socket directory {d}: {exc.strerror}") from exc
    for name in names:
        path = d / name
        if name.endswith(".sock.lock"):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise EndpointError(f"cannot open {path}: {exc.strerror}") from exc
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                        continue        # a live producer holds it
                    raise EndpointError(f"cannot lock {path}: {exc.strerror}") from exc
                sock = d / name[:-len(".lock")]
                for victim in (sock, path):
                    try:
                        os.unlink(victim)
                        removed.append(str(victim))
                    except FileNotFoundError:
                        pass
            finally:
                os.close(fd)
        elif name.endswith(".sock") and not (d / f"{name}.lock").exists():
            if stat.S_ISSOCK(path.lstat().st_mode) and not _unix_listener(path):
                try:
                    os.unlink(path)
                    removed.append(str(path))
                except FileNotFoundError:
                    pass
    return removed


def live_endpoints(directory: str | os.PathLike | None = None) -> list[str]:
    """ipc endpoints in ``directory`` (default :func:`socket_dir`) whose claim is held by a
    live producer, sorted."""
    d = Path(directory) if directory is not None else socket_dir()
    out = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for name in names:
        if name.endswith(".sock.lock") and lock_held(d / name):
            out.append(f"ipc://{d / name[:-len('.lock')]}")
    return out


def probe_endpoint(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """Is a producer listening on ``endpoint``? None if something accepts connections there,
    else the reason, phrased for a user (no socket file, claim free, connection refused).

    A cheap pre-check (no ZeroMQ, nothing attached): a listener may still turn out not to be
    a hscapture producer, which the subscriber then reports.
    """
    check_endpoint(endpoint, allow_inproc=False)
    path = ipc_path(endpoint)
    if path is not None:
        if not path.exists():
            return f"no socket file {path}"
        lock = Path(f"{path}.lock")
        if lock.exists() and not lock_held(lock):
            return f"{path} is left over from a producer that exited (`hscapture cleanup` removes it)"
        if not _unix_listener(path):
            return f"nothing accepts connections on {path}"
        return None
    m = _TCP.match(endpoint)
    assert m is not None
    host, port = m.group(1).strip("[]"), m.group(2)
    if port == "*":
        return f"{endpoint}: a wildcard port can be bound, not connected to"
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc.strerror or exc}"
    return None
