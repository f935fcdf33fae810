"""Bounds on a producer's settings, shared by :class:`hscapture.Producer` and the engine
adapters that read them from their configuration (``hscapture.sglang.config``), which check
them where a value enters, naming their own variable. Nothing heavy is imported here: the
adapters' configuration is read without torch."""

from __future__ import annotations

__all__ = ["MAX_WAIT_TIMEOUT_S"]

#: the longest a capture waits for ring space under ``full_policy="wait"`` (seconds): the
#: wait holds the engine's thread, so it is bounded (an infinite one hung a server's
#: scheduler until 2026-12-05)
MAX_WAIT_TIMEOUT_S = 60.0
