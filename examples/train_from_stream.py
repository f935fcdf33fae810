"""Train a toy EAGLE-3-style draft head from a LIVE producer: no shards, no storage service.

    python examples/train_from_stream.py --steps 20

A producer process (this script with ``--produce``) captures hidden states of three "aux"
layers for each request into the shared-memory ring, with a loss mask per request (the
prompt's first tokens are masked out, as a chat template masks the user turn). The training
process reads them through :class:`hscapture.StreamDataset` (bounded: at most ``--prefetch``
samples ahead; a slow trainer leaves the ring full and the producer drops, by rid) and trains
a small head mapping the concatenated aux layers ``[T, 3H]`` to logits over the vocabulary,
with cross-entropy on the next token id, masked by ``loss_mask``. It prints the loss per step
and, at the end, the stream's report: what it did not see, by rid.

The captured tensors are a pure function of the rid (see :func:`synthetic`), so a test can
check every streamed sample bit for bit, and the next token is a function of the current
one, so the loss visibly falls within a few steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import torch

AUX_LAYERS = (1, 3, 5)      # the aux layers EAGLE-3 concatenates (ascending)
VOCAB = 64
HIDDEN = 32


def next_token(ids: torch.Tensor) -> torch.Tensor:
    """The toy language: each token determines the next one."""
    return (ids * 7 + 3) % VOCAB


def synthetic(rid: str, tokens: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """(token ids int64 [T], one bf16 [T, H] tensor per aux layer, loss mask uint8 [T]) of
    ``rid``: deterministic, and the aux states carry the current token (so the next is
    learnable)."""
    g = torch.Generator().manual_seed(int.from_bytes(rid.encode()[-8:].rjust(8, b"\0"), "big")
                                      & (2**62 - 1))
    start = int(torch.randint(0, VOCAB, (1,), generator=g))
    ids = torch.empty(tokens, dtype=torch.int64)
    ids[0] = start
    for t in range(1, tokens):
        ids[t] = next_token(ids[t - 1])
    table = torch.Generator().manual_seed(1234)
    emb = [torch.randn(VOCAB, HIDDEN, generator=table) for _ in AUX_LAYERS]
    layers = [(e[ids] + 0.1 * torch.randn(tokens, HIDDEN, generator=g)).to(torch.bfloat16)
              for e in emb]
    mask = torch.ones(tokens, dtype=torch.uint8)
    mask[: max(1, tokens // 4)] = 0          # the "prompt" part: not trained on
    return ids, layers, mask


def request_plan(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """``n`` (rid, tokens) pairs, lengths 8..71."""
    g = torch.Generator().manual_seed(seed)
    return [(f"req-{seed}-{i}", 8 + int(torch.randint(0, 64, (1,), generator=g)))
            for i in range(n)]


def produce(endpoint: str, n: int, seed: int, chunk: int, capacity: int, policy: str) -> None:
    """The producer process: capture ``request_plan(n, seed)`` in chunks of ``chunk`` tokens
    (a prefill split as a server splits it), then say which rids it dropped."""
    from hscapture import Producer

    p = Producer(endpoint, producer_id=f"toy-{seed}", capacity=capacity, full_policy=policy,
                 wait_timeout_s=30.0)
    try:
        print(json.dumps({"event": "ready"}), flush=True)
        if not p.wait_for_consumers(1, timeout_s=60):
            print(json.dumps({"event": "no_consumer"}), flush=True)
            return
        dropped = []
        for rid, tokens in request_plan(n, seed):
            ids, layers, mask = synthetic(rid, tokens)
            for s in range(0, tokens, chunk):
                e = min(tokens, s + chunk)
                ok = p.capture(rid, [t[s:e] for t in layers], layers=list(AUX_LAYERS),
                               token_start=s, is_last_chunk=e == tokens, token_ids=ids[s:e],
                               fields={"loss_mask": mask[s:e]})
                if not ok:
                    dropped.append(rid)
        p.flush()
        print(json.dumps({"event": "done", "dropped": sorted(set(dropped))}), flush=True)
    finally:
        p.close()


class DraftHead(torch.nn.Module):
    """A toy EAGLE-3 head: concatenated aux states [T, 3H] -> fc -> [T, H] -> logits [T, V]."""

    def __init__(self, hidden: int = HIDDEN, vocab: int = VOCAB, aux: int = len(AUX_LAYERS)):
        super().__init__()
        self.fc = torch.nn.Linear(aux * hidden, hidden)
        self.act = torch.nn.SiLU()
        self.lm_head = torch.nn.Linear(hidden, vocab)

    def forward(self, aux: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.act(self.fc(aux)))


def to_batch(item: dict[str, Any]) -> dict[str, Any]:
    """StreamDataset transform: aux layers concatenated in ascending layer order, float32."""
    aux = torch.cat([item[f"layer_{L}"] for L in AUX_LAYERS], dim=-1).float()
    return {"rid": item["rid"], "input_ids": item["input_ids"], "aux": aux,
            "loss_mask": item.get("loss_mask")}


def loss_of(head: DraftHead, batch: dict[str, Any]) -> torch.Tensor:
    """Cross-entropy of predicting token t+1 from the aux states at t, masked by loss_mask."""
    logits = head(batch["aux"][:-1])
    target = batch["input_ids"][1:]
    losses = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    mask = batch["loss_mask"]
    weight = mask[1:].float() if mask is not None else torch.ones_like(losses)
    return (losses * weight).sum() / weight.sum().clamp(min=1.0)


def train(endpoint: str, steps: int, prefetch: int, idle_timeout_s: float,
          lr: float = 3e-2) -> dict[str, Any]:
    """Train for ``steps`` samples streamed from ``endpoint``; returns losses and the report."""
    from torch.utils.data import DataLoader

    from hscapture import StreamDataset

    torch.manual_seed(0)
    head = DraftHead()
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    ds = StreamDataset(endpoint, max_samples=steps, idle_timeout_s=idle_timeout_s,
                       prefetch=prefetch, transform=to_batch)
    losses = []
    for step, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=0)):
        loss = loss_of(head, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:3d}  {batch['rid']:>12}  tokens {batch['input_ids'].numel():3d}  "
              f"loss {loss.item():.4f}", flush=True)
    report = ds.report()
    return {"losses": losses, "report": report, "max_buffered": ds.max_buffered}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="training steps (one sample each)")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests the producer captures (default: --steps)")
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=16, help="tokens per captured chunk")
    ap.add_argument("--capacity", type=int, default=8 << 20, help="ring bytes")
    ap.add_argument("--policy", choices=("drop", "wait"), default="wait")
    ap.add_argument("--idle-timeout", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    ap.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    requests = args.steps if args.requests is None else args.requests
    if args.produce:
        produce(args.endpoint, requests, args.seed, args.chunk, args.capacity, args.policy)
        return 0
    sock_dir = tempfile.mkdtemp(prefix="hsc-stream-")
    endpoint = args.endpoint or f"ipc://{sock_dir}/{uuid.uuid4().hex[:8]}.sock"
    producer = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--produce", "--endpoint", endpoint,
         "--requests", str(requests), "--seed", str(args.seed), "--chunk", str(args.chunk),
         "--capacity", str(args.capacity), "--policy", args.policy],
        stdout=subprocess.PIPE, text=True)
    try:
        line = producer.stdout.readline()
        if not line or json.loads(line)["event"] != "ready":
            print(f"producer did not start (exit {producer.wait()})", file=sys.stderr)
            return 1
        t0 = time.monotonic()
        result = train(endpoint, args.steps, args.prefetch, args.idle_timeout)
        done = [json.loads(x) for x in producer.communicate(timeout=60)[0].splitlines()]
        result["producer_dropped"] = next((d["dropped"] for d in done
                                           if d["event"] == "done"), None)
        result["seconds"] = round(time.monotonic() - t0, 3)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
        for f in os.listdir(sock_dir):
            os.unlink(os.path.join(sock_dir, f))
        os.rmdir(sock_dir)
    r = result["report"]
    print(f"trained {len(result['losses'])} steps in {result['seconds']}s; first loss "
          f"{result['losses'][0]:.4f}, last {result['losses'][-1]:.4f}" if result["losses"]
          else "no sample arrived")
    print("not seen: " + json.dumps({k: r[k] for k in ("dropped", "incomplete", "rejected",
                                                       "lost", "in_flight", "undelivered")}))
    if args.json:
        print(json.dumps(result))
    return 0 if result["losses"] else 1


if __name__ == "__main__":
    sys.exit(main())
