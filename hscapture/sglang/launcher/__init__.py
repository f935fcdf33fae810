"""Fallback launcher for deployments where the entry point is filtered out.

``python -m hscapture.sglang <sglang launch_server args>`` (or
``python -m hscapture.sglang.launcher ...``) starts SGLang's HTTP server exactly like
``python -m sglang.launch_server``, but passes :func:`run_scheduler_process` as SGLang's
``run_scheduler_process_func`` (``sglang.srt.entrypoints.http_server.launch_server``
accepts it in 0.5.23). SGLang spawns its scheduler processes, so a monkeypatch in this
launcher would never reach them; the function below runs inside each scheduler process,
registers the capture hook there, then hands over to SGLang's own ``run_scheduler_process``.

Capture is switched on (``HSCAPTURE_ENABLE=1``) unless the environment already says
otherwise. Only the default HTTP mode is supported (not ``--grpc-mode``, Ray or
encoder-only servers).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

__all__ = ["main", "run_scheduler_process"]


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """SGLang's scheduler process entry, with the capture hook registered first.

    Module level (importable by name) because SGLang spawns it with ``multiprocessing``.
    """
    from sglang.srt.managers.scheduler import run_scheduler_process as sglang_entry
    from sglang.srt.plugins.hook_registry import HookRegistry

    from ..plugin import register

    register()  # never raises; idempotent with the entry point (same process)
    HookRegistry.apply_hooks()
    return sglang_entry(*args, **kwargs)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") and len(argv) == 1:
        print(__doc__.strip().splitlines()[0])
        print("usage: python -m hscapture.sglang <sglang launch_server arguments>")
        print("       (configure with HSCAPTURE_* environment variables; see docs/sglang.md)")
        if not argv:
            raise SystemExit(2)
    os.environ.setdefault("HSCAPTURE_ENABLE", "1")

    try:
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.entrypoints.http_server import launch_server
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.utils import kill_process_tree
    except ImportError as exc:   # one line, not SGLang's import traceback
        if argv[0] in ("-h", "--help"):
            print(f"(SGLang's own arguments are not listed: sglang does not import here: "
                  f"{type(exc).__name__}: {exc})")
            raise SystemExit(0) from None
        raise SystemExit(f"hscapture: error: cannot start SGLang: it does not import here "
                         f"({type(exc).__name__}: {exc}); run this in the server's "
                         f"environment (pip install 'hscapture[sglang]' there)") from None

    from ..plugin import check_sglang_version

    check_sglang_version()  # the launcher may refuse loudly: nothing runs yet
    load_plugins()
    server_args = prepare_server_args(argv)
    server_args.resolve_once()
    cfg = resolving_view(server_args)
    for flag in ("encoder_only", "smg_grpc_mode", "grpc_mode", "use_ray"):
        if getattr(cfg, flag, False):
            raise SystemExit(
                f"hscapture launcher: --{flag.replace('_', '-')} is not supported; install "
                "hscapture in the server's environment and use the sglang.srt.plugins entry "
                "point instead (see docs/sglang.md)")
    try:
        launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
