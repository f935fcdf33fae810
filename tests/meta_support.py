"""A producer process whose requests carry ``custom_params`` the way SGLang requests do.

``python meta_support.py SPEC_JSON`` runs a real :class:`~hscapture.Producer` in its own
process and captures ``spec["requests"]`` (``[rid, tokens, chunk, custom_params]``) in chunks.
Each sample's row ``extra`` and ``loss_mask`` field come from the SGLang hook's own
:class:`~hscapture.sglang.config.CaptureConfig` (``sample_extra`` once per sample, reused by
every chunk, and ``loss_mask_of`` once per sample, sliced per chunk), so what arrives is what
the hook would publish.
Layers: residual ``LAYERS`` and ``final_norm`` after decoder layer ``NUM_LAYERS - 1`` (so both
exports can be made). Tensors are :func:`capture_support.source` of the rid (regenerable).

Prints JSON lines: ``ready`` once a subscriber is attached, ``done`` after closing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capture_support import source  # noqa: E402

HIDDEN = 16
NUM_LAYERS = 8
LAYERS = [1, 3, 5, NUM_LAYERS - 1]           # residual; then final_norm
KINDS = ["residual"] * len(LAYERS) + ["final_norm"]
ALL_LAYERS = LAYERS + [NUM_LAYERS - 1]


def produce(spec: dict) -> None:
    from hscapture import Producer
    from hscapture.sglang.config import CaptureConfig

    config = CaptureConfig()
    p = Producer(spec["endpoint"], producer_id="meta-test", capacity=32 << 20,
                 full_policy="wait", wait_timeout_s=20.0, convention="test-meta",
                 model="toy-meta")
    if not p.wait_for_consumers(1, timeout_s=30):
        print(json.dumps({"event": "no_consumer"}), flush=True)
        return
    print(json.dumps({"event": "ready"}), flush=True)
    for rid, tokens, chunk, custom in spec["requests"]:
        tensors, ids = source(rid, tokens, HIDDEN, len(ALL_LAYERS))
        req = SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom))
        extra, _ = config.sample_extra(req)
        mask, bad = config.loss_mask_of(req, tokens)
        if bad is not None:
            extra = {**extra, "mask_error": bad}
        for s in range(0, tokens, chunk):
            e = min(tokens, s + chunk)
            p.capture(rid, [t[s:e] for t in tensors], layers=ALL_LAYERS, layer_kinds=KINDS,
                      token_start=s, is_last_chunk=e == tokens, token_ids=ids[s:e],
                      extra=extra,
                      fields={} if mask is None else {"loss_mask": list(mask[s:e])})
    p.flush()
    p.close()
    print(json.dumps({"event": "done"}), flush=True)


if __name__ == "__main__":
    produce(json.loads(sys.argv[1]))
