"""hscapture: exact per-request hidden states from a running inference server.

The public API is listed in ``__all__`` below (checked by a test); everything else is internal.
``Producer``, ``Subscriber``, ``Sample``, ``layer_name``, ``stream``, ``StreamDataset``,
``open_shards`` and ``ShardDataset`` are imported on first use (PEP 562), so ``import
hscapture`` (and the ``hscapture`` command) does not pay for torch and ZeroMQ.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors
from .errors import *  # noqa: F401,F403  (the typed errors are part of the public API)

if TYPE_CHECKING:  # pragma: no cover
    from .producer import Producer
    from .reader import ShardDataset, open_shards
    from .sample import Sample, layer_name
    from .stream import StreamDataset, stream
    from .subscriber import Subscriber

__version__ = "0.1.0"

#: public name -> module that defines it (imported on first attribute access)
_LAZY = {"Producer": ".producer", "Subscriber": ".subscriber", "Sample": ".sample",
         "layer_name": ".sample", "stream": ".stream", "StreamDataset": ".stream",
         "open_shards": ".reader", "ShardDataset": ".reader"}

__all__ = ["Producer", "Subscriber", "Sample", "layer_name", "stream", "StreamDataset",
           "open_shards", "ShardDataset", "errors", "__version__", *errors.__all__]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hscapture' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
