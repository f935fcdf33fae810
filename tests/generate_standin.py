"""A stand-in for an inference server's ``/generate`` (SGLang's request shape), for testing
the extraction client end to end without a GPU.

It is not SGLang: it runs the demo's tiny random Llama on the CPU and captures through the
real path (``HiddenStateCapture`` → ``Producer`` → ring → notices). The SGLang hook itself is
tested against SGLang's real classes in ``tests/sglang``. Captures only rids with the opt-in
prefix, like the SGLang plugin.

    python generate_standin.py ENDPOINT  → prints "PORT <n>" once ready, serves until killed
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from hscapture import Producer
from hscapture.adapters.transformers import CONVENTION, HiddenStateCapture
from hscapture.demo import tiny_llama

LAYERS = [0, 1]


def main(endpoint: str) -> None:
    model = tiny_llama(seed=3, layers=3, hidden=64)
    producer = Producer(endpoint, producer_id="standin", capacity=16 << 20, convention=CONVENTION,
                        model="tiny-random-llama(seed=3)")
    cap = HiddenStateCapture(model, producer, LAYERS)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = torch.tensor([body["input_ids"]])
            rid = body.get("rid")
            with lock, torch.no_grad():
                if rid and rid.startswith("hscap-"):
                    with cap.request([rid], ids):
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
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
