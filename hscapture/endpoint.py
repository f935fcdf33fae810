"""ZeroMQ endpoints: where a producer publishes notices and how a subscriber finds them.

Default endpoints are ipc sockets inside a private (0700) directory of the current user, so
other users can neither read notices nor inject forged ones.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import tempfile
from pathlib import Path

from .errors import EndpointError

__all__ = ["socket_dir", "default_endpoint", "check_endpoint", "ipc_path", "claim_endpoint",
           "release_endpoint"]

_ENDPOINT = re.compile(r"^(ipc|tcp|inproc)://.+$")


def socket_dir() -> Path:
    """The private directory holding default ipc sockets (created 0700, checked if it exists).

    ``$HSCAPTURE_SOCKET_DIR`` overrides it; otherwise ``$XDG_RUNTIME_DIR/hscapture`` or
    ``<tmp>/hscapture-<uid>``.
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
        raise EndpointError(f"cannot create socket directory {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise EndpointError(
            f"socket directory {path}: expected a directory owned by uid {os.getuid()}, "
            f"found mode {stat.filemode(st.st_mode)} owned by uid {st.st_uid}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def default_endpoint(producer_id: str) -> str:
    """``ipc://<socket_dir>/<producer_id>.sock``."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", producer_id):
        raise EndpointError(
            f"producer id must match [A-Za-z0-9_.-]+ to name a socket, found {producer_id!r}")
    return f"ipc://{socket_dir() / producer_id}.sock"


def check_endpoint(endpoint: str) -> str:
    """Return ``endpoint`` if it is a ZeroMQ endpoint hscapture can use, else raise."""
    if not isinstance(endpoint, str) or not _ENDPOINT.match(endpoint):
        raise EndpointError(
            f"endpoint: expected 'ipc://PATH', 'tcp://HOST:PORT' or 'inproc://NAME', "
            f"found {endpoint!r}")
    return endpoint


def ipc_path(endpoint: str) -> Path | None:
    """The filesystem path of an ipc endpoint, or None for other transports."""
    return Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None


def claim_endpoint(endpoint: str) -> int | None:
    """Take the exclusive claim on an ipc endpoint for this process's lifetime.

    ZeroMQ silently replaces an existing ipc socket file on bind, so without a claim a second
    producer would steal a live producer's subscribers. The claim is an flock on
    ``<path>.lock``; the kernel drops it when the holder dies. Returns the lock's fd (close it
    to release), or None for non-ipc endpoints (their bind fails by itself when in use).
    """
    path = ipc_path(endpoint)
    if path is None:
        return None
    lock = f"{path}.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise EndpointError(f"cannot create {lock} to claim {endpoint}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise EndpointError(f"endpoint {endpoint} is in use by another producer (pid {holder}); "
                            f"expected a free endpoint") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def release_endpoint(endpoint: str, claim: int | None) -> None:
    """Give up a claim taken by :func:`claim_endpoint` and remove the socket and claim files
    (a closed producer leaves nothing behind in the socket directory)."""
    path = ipc_path(endpoint)
    if path is not None:
        for leftover in (path, Path(f"{path}.lock")):
            try:
                leftover.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                pass
    if claim is not None:
        os.close(claim)
