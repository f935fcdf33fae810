"""The restart hunt's harness (../restart-2026-12-05/common.py), shared: loaded under its own
name, since this module is the one the reproducers import as ``common``."""
import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "restart-2026-12-05" / "common.py"
_spec = importlib.util.spec_from_file_location("_restart_hunt_common", _path)
_harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness)
globals().update({k: v for k, v in vars(_harness).items() if not k.startswith("__")})
