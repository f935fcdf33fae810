"""hunt-e8 harness: the drain/follower hunt's (../drain-follower-2026-12-06/hd7.py), plus
fault_support's ``source`` (a sample's tensors, derived from its rid)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drain-follower-2026-12-06"))
from hd7 import *  # noqa: E402,F401,F403
from fault_support import source  # noqa: E402,F401
