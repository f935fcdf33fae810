"""SGLang adapter: capture hidden states from a running SGLang server.

Two ways in, both ending at the same AFTER hook on
``sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation``
(:mod:`hscapture.sglang.hook`):

- the ``sglang.srt.plugins`` entry point ``hscapture = hscapture.sglang.plugin:register``,
  which SGLang runs first thing in every scheduler process (``load_plugins``); inert unless
  ``HSCAPTURE_ENABLE=1`` or ``HSCAPTURE_ENDPOINT`` is set;
- the fallback launcher ``python -m hscapture.sglang <launch_server args>`` for deployments
  that filter entry points (``SGLANG_PLUGINS`` without ``hscapture``).

Configuration is read from ``HSCAPTURE_*`` environment variables (:mod:`.config`); see
``docs/sglang.md`` for the launch command, opt-in per request and rank behaviour.

Importing this package does not import SGLang or torch.
"""

from __future__ import annotations

#: SGLang versions this adapter was written and tested against (the fields it reads were
#: checked in 0.5.23's source; tests/sglang/test_tripwire.py fails if one moves).
SUPPORTED_SGLANG = ">=0.5.23,<0.6"

#: The hooked method.
HOOK_TARGET = "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"

__all__ = ["SUPPORTED_SGLANG", "HOOK_TARGET"]
