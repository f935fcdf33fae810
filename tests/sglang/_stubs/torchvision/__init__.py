"""Test-only stub of ``torchvision`` (see ``_hscapture_permissive_stub``); never shipped.

sglang 0.5.23's ``sglang.srt.configs`` package imports ``torchvision.transforms`` at
import time (``sglang/srt/multimodal/internvl_utils.py``). PyPI's torchvision wheels
are CUDA builds that fail to import against CPU torch ("operator torchvision::nms
does not exist"). tests/sglang/conftest.py puts this directory on the path only when
the real torchvision cannot be imported.
"""

from _hscapture_permissive_stub import install

install(__name__)
