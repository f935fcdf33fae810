"""Page-locking the ring's mapping for the GPU (``cudaHostRegister``), checked, with fallback."""

from __future__ import annotations

import logging
import warnings

log = logging.getLogger("hscapture")

__all__ = ["HostRegistration", "register_host_memory"]


class HostRegistration:
    """A live ``cudaHostRegister`` of ``[address, address+size)``; :meth:`close` undoes it."""

    def __init__(self, address: int, size: int) -> None:
        self.address, self.size = address, size

    def close(self) -> None:
        if self.size:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.address)
            self.size = 0


def _clear_last_cuda_error() -> None:
    """Reset the CUDA runtime's per-thread last error after a failed cudaHostRegister.

    Otherwise the next kernel launched on this thread (the engine's forward pass!) would report
    it: PyTorch checks ``cudaGetLastError()`` after every launch. torch exposes no binding for
    it, so it is called through the libcudart that this process already loaded.
    """
    import ctypes

    candidates = []
    try:
        with open("/proc/self/maps") as maps:
            candidates = sorted({line.split()[-1] for line in maps
                                 if "libcudart.so" in line.split()[-1]})
    except OSError:
        pass
    for name in candidates + ["libcudart.so"]:
        try:
            ctypes.CDLL(name).cudaGetLastError()
            return
        except (OSError, AttributeError):
            continue
    log.warning("hscapture: could not reset the CUDA error left by a failed cudaHostRegister")


def register_host_memory(address: int, size: int) -> HostRegistration | None:
    """Register host memory with CUDA so device-to-host copies into it are async DMA.

    Returns None without CUDA. If registration fails, warns once and returns None: copies then
    fall back to pageable memory (about 4x slower and synchronous for the copying thread).
    """
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        cudart = torch.cuda.cudart()
        # cudaHostRegisterPortable(1): pinned for every CUDA context of this process.
        err = cudart.cudaHostRegister(address, size, 1)
        code = int(getattr(err, "value", err))
    except Exception as exc:  # pragma: no cover - depends on the CUDA runtime
        code, detail = -1, f"{type(exc).__name__}: {exc}"
    else:
        detail = f"cudaError {code}"
    if code != 0:
        _clear_last_cuda_error()
        warnings.warn(
            f"hscapture: cudaHostRegister of the ring ({size} bytes at {address:#x}) failed "
            f"({detail}); falling back to unpinned copies, which are slower and synchronous",
            RuntimeWarning, stacklevel=3)
        return None
    log.debug("registered %d bytes of ring memory with CUDA", size)
    return HostRegistration(address, size)
