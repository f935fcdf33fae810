"""A stand-in for an inference server's ``/generate`` (SGLang's request shape), for testing
the extraction client end to end without a GPU.

It is not SGLang: it runs the demo's tiny random Llama on the CPU and captures through the
real path (``HiddenStateCapture`` → ``Producer`` → ring → notices). The SGLang hook itself is
tested against SGLang's real classes in ``tests/sglang``. Captures only rids with the opt-in
prefix, like the SGLang plugin, and honours ``sampling_params.custom_params.hscapture_loss_mask``
and ``hscapture_meta`` exactly as the SGLang hook does (parsed by the hook's own
``CaptureConfig.loss_mask_of`` / ``sample_extra``): the mask travels with the sample as its
``loss_mask`` field, the meta as its ``extra["meta"]``.

    python generate_standin.py ENDPOINT  → prints "PORT <n>" once ready, serves until
                                           SIGTERM/SIGINT (then closes its producer)

``--delay-s S`` makes each captured request take S seconds longer (a slow GPU, so that a test
can stop a client mid-run); ``--request-log FILE`` appends each received rid to FILE, one per
line, when its computation starts; ``--no-fields`` ignores every request's loss mask (as an
older hook or ``CaptureConfig(fields=False)`` would), ``--no-meta`` every request's meta.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import torch

from hscapture import Producer
from hscapture.errors import HSCaptureError
from hscapture.adapters.transformers import CONVENTION, HiddenStateCapture
from hscapture.demo import tiny_llama
from hscapture.sglang.config import CaptureConfig

LAYERS = [0, 1]


def main(endpoint: str, delay_s: float = 0.0, request_log: str | None = None,
         with_fields: bool = True, with_meta: bool = True) -> None:
    config = CaptureConfig(fields=with_fields, meta=with_meta)
    model = tiny_llama(seed=3, layers=3, hidden=64)
    producer = Producer(endpoint, producer_id="standin", capacity=16 << 20, convention=CONVENTION,
                        model="tiny-random-llama(seed=3)")
    cap = HiddenStateCapture(model, producer, LAYERS)
    lock = threading.Lock()
    log = open(request_log, "a", buffering=1) if request_log else None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = torch.tensor([body["input_ids"]])
            rid = body.get("rid")
            custom = (body.get("sampling_params") or {}).get("custom_params")
            req = SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom))
            extra, _ = config.sample_extra(req)      # the hook's own meta and mask handling
            mask, bad = config.loss_mask_of(req, ids.shape[1])
            fields = None if mask is None else {"loss_mask": mask}
            if bad is not None:
                extra = {**extra, "mask_error": bad}
            with lock, torch.no_grad():
                if log is not None:
                    log.write(f"{rid}\n")
                if rid and rid.startswith("hscap-"):
                    if delay_s:
                        time.sleep(delay_s)       # a slower forward pass, not synchronization
                    with cap.request([rid], ids, fields=[fields], extra=[extra]):
                        model(ids)
                else:
                    model(ids)
            out = json.dumps({"text": "", "meta_info": {"id": rid}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def stop(signum: int, frame: object) -> None:   # shutdown() waits for serve_forever()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()
    with lock:                  # no capture in progress: close the producer (unlinks its ring)
        producer.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="CPU stand-in for SGLang's /generate (testing)")
    ap.add_argument("endpoint", help="hscapture producer endpoint to bind")
    ap.add_argument("--delay-s", type=float, default=0.0,
                    help="extra seconds per captured request (default: 0)")
    ap.add_argument("--request-log", default=None, help="append each received rid to this file")
    ap.add_argument("--no-fields", action="store_true",
                    help="ignore the requests' per-token fields (loss masks)")
    ap.add_argument("--no-meta", action="store_true",
                    help="ignore the requests' per-sample metadata (hscapture_meta)")
    a = ap.parse_args()
    try:
        main(a.endpoint, a.delay_s, a.request_log, not a.no_fields, not a.no_meta)
    except HSCaptureError as exc:       # e.g. the endpoint held by an earlier stand-in
        raise SystemExit(f"generate_standin: error: {exc}") from None
