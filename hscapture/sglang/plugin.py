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

__all__ = ["register", "check_sglang_version", "installed_hook", "close_on_sigterm"]

#: AFTER hook that reports chunked requests aborted between chunks without waiting for the
#: next forward pass (optional: registered only when the method exists). SGLang calls it at
#: every scheduling step: ``SGLangCaptureHook.sweep`` only looks at the requests in flight.
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

        hook = SGLangCaptureHook(config, on_producer=close_on_sigterm)
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
            if target == SWEEP_TARGET:
                hook.step_hook = True   # a step runs after SGLang queued its result read-back


def close_on_sigterm(hook: Any) -> bool:
    """Make SIGTERM close ``hook``'s producer before the process ends; True if installed.

    How an SGLang 0.5.23 scheduler process ends (``sglang/srt/managers/scheduler.py``
    ``run_scheduler_process``, ``tokenizer_manager.py`` ``sigterm_watchdog``,
    ``utils/common.py`` ``kill_process_tree``):

    - SIGTERM to the server: the tokenizer manager drains, sends ``ShutdownReq``, the
      scheduler's event loop returns and the process exits normally: ``atexit`` closes the
      producer (:data:`hscapture.producer.EXIT_CLOSE_TIMEOUT_S` at most). Schedulers still
      alive 15 s later are SIGKILLed.
    - SIGINT (Ctrl-C reaches the whole process group): ``KeyboardInterrupt`` in the
      scheduler, a normal interpreter exit: ``atexit`` again.
    - SIGTERM to the scheduler itself (systemd's control-group stop, ``kill``): the
      scheduler installs no handler, so the default action would end it at once, with no
      ``atexit``. This handler closes the producer (bounded), then restores the default
      action and re-sends SIGTERM, so the process still ends by SIGTERM (a second SIGTERM
      during the close ends it at once).
    - SIGKILL (``kill_process_tree`` at the end of ``launch_server``, ``Engine.shutdown``,
      the parent dying: ``PR_SET_PDEATHSIG``): nothing can run; the next producer with the
      same id removes the dead one's segment at start (unless a durable subscriber still
      needs it), ``hscapture cleanup`` too.

    Installed only in the main thread and only over the default action: a handler someone
    else installed (or SIG_IGN) is left alone, and ``atexit`` covers the exits it leads to.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except Exception:
        return False
    if previous not in (signal.SIG_DFL, None):
        log.debug("hscapture: SIGTERM already handled (%r); the producer closes at exit",
                  previous)
        return False

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)   # a second SIGTERM ends the process at once
        try:
            from ..producer import EXIT_CLOSE_TIMEOUT_S

            hook.close(timeout_s=EXIT_CLOSE_TIMEOUT_S)
        except BaseException:   # never keep a terminating process alive
            pass
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)   # only reached if the signal is blocked in this thread

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        return False
    return True
