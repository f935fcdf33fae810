"""The ``sglang.srt.plugins`` entry point: ``hscapture = hscapture.sglang.plugin:register``.

SGLang calls :func:`register` first thing in every scheduler process
(``sglang.srt.plugins.load_plugins``, then ``HookRegistry.apply_hooks()``). It is inert
unless capture is configured (``HSCAPTURE_ENABLE=1`` or ``HSCAPTURE_ENDPOINT``), and it never
raises: a misconfiguration or an unsupported SGLang version is logged and capture stays off,
the server starts as usual.

The hooks must be registered here, inside the plugin function: ``apply_hooks()`` patches a
target once, so a hook registered after it would be ignored.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..errors import CaptureConfigError, UnsupportedEngineError
from . import HOOK_TARGET, SUPPORTED_SGLANG

log = logging.getLogger("hscapture.sglang")

__all__ = ["register", "check_sglang_version", "installed_hook"]

#: AFTER hook that reports chunked requests aborted between chunks without waiting for the
#: next forward pass (optional: registered only when the method exists).
SWEEP_TARGET = "sglang.srt.managers.scheduler.Scheduler.process_pending_chunked_abort"

#: AFTER hook that starts the producer when the scheduler is constructed (ranks are
#: published by then), so its endpoint exists before the first request.
START_TARGET = "sglang.srt.managers.scheduler.Scheduler.__init__"

_HOOK: Any = None


def installed_hook() -> Any:
    """The :class:`~hscapture.sglang.hook.SGLangCaptureHook` registered in this process."""
    return _HOOK


def check_sglang_version(version: str | None = None) -> str:
    """Return the installed SGLang version; raise :class:`UnsupportedEngineError` outside
    :data:`~hscapture.sglang.SUPPORTED_SGLANG`."""
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            version = dist_version("sglang")
        except PackageNotFoundError as exc:
            raise UnsupportedEngineError("sglang is not installed") from exc
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion as exc:
        raise UnsupportedEngineError(f"cannot parse the sglang version {version!r}") from exc
    # Compare the release only, so 0.5.23.post1 / 0.5.24rc1 builds count as what they are.
    if Version(parsed.base_version) not in SpecifierSet(SUPPORTED_SGLANG):
        raise UnsupportedEngineError(
            f"hscapture's SGLang adapter supports sglang{SUPPORTED_SGLANG}, found {version}; "
            "capture stays off (the server runs normally)")
    return version


def register() -> None:
    """Install the capture hook if configured. Never raises."""
    global _HOOK
    try:
        from .config import load_config

        config = load_config()
        if not config.enabled:
            log.debug("hscapture: not configured (set HSCAPTURE_ENABLE=1 or "
                      "HSCAPTURE_ENDPOINT); plugin inert")
            return
        if _HOOK is not None:
            return  # already registered in this process
        version = check_sglang_version()
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from .hook import SGLangCaptureHook

        hook = SGLangCaptureHook(config)
        HookRegistry.register(HOOK_TARGET, hook, HookType.AFTER)
        _register_sweep(hook, HookRegistry, HookType)
        _HOOK = hook
        log.info("hscapture: capture hook registered (sglang %s, pid %d, rid prefix %r, "
                 "custom_params key %r)", version, os.getpid(), config.rid_prefix, config.param)
    except (UnsupportedEngineError, CaptureConfigError) as exc:
        log.error("hscapture: %s", exc)
    except Exception:
        log.exception("hscapture: plugin failed to register; capture stays off")


def _register_sweep(hook: Any, registry: Any, hook_type: Any) -> None:
    """The optional hooks (start, sweep): registered only where the target exists."""
    import pkgutil

    for target, fn in ((START_TARGET, hook.start), (SWEEP_TARGET, hook.sweep)):
        obj_path, _, attr = target.rpartition(".")
        try:
            owner = pkgutil.resolve_name(obj_path)
        except Exception:
            continue
        if callable(getattr(owner, attr, None)):
            registry.register(target, fn, hook_type.AFTER)
