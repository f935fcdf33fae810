"""Test-only stub of ``triton`` (see ``_hscapture_permissive_stub``); never shipped.

sglang 0.5.23 imports triton unconditionally (``sglang/srt/utils/common.py``) and
decorates kernels at import time. The real wheel is ~290 MB and does nothing on a
machine without a GPU. tests/sglang/conftest.py puts this directory on the path only
when the real triton cannot be imported.
"""

from _hscapture_permissive_stub import install

install(__name__)
