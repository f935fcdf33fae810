"""hscapture: exact per-request hidden states from a running inference server.

The public API is listed in ``__all__`` below (checked by a test); everything else is internal.
"""

from __future__ import annotations

from . import errors
from .errors import *  # noqa: F401,F403  (the typed errors are part of the public API)
from .producer import Producer
from .sample import Sample, layer_name
from .subscriber import Subscriber

__version__ = "0.1.0"

__all__ = ["Producer", "Subscriber", "Sample", "layer_name", "errors", "__version__",
           *errors.__all__]
