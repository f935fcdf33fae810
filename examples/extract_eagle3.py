"""Extract EAGLE-3 training data from a running SGLang server, the verifiable way.

The server (see docs/sglang.md) runs in capture-only mode with hscapture configured::

    HSCAPTURE_ENDPOINT='ipc:///run/user/1000/hscap-{dp_rank}.sock' \\
    python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct \\
        --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 \\
        --return-aux-hidden-state-layer-ids 1 15 28 --disable-radix-cache

This script reads a JSONL dataset of token-id lists (``{"id": "...", "input_ids": [...]}``
per line; ``id`` optional, the line number is used otherwise), sends each to ``/generate``
with an explicit rid (``hscap-<id>``) and ``max_new_tokens: 0`` (prefill only), and writes
every captured sample into safetensors shards via the Subscriber and ShardWriter. It
resumes: rids already in the shard index are skipped. Samples the producer dropped or
reported incomplete are listed at the end (exit code 3), never written.

    python examples/extract_eagle3.py data.jsonl out/ \\
        --server http://127.0.0.1:30000 --endpoint 'ipc:///run/user/1000/hscap-0.sock'

(Repeat ``--endpoint`` once per DP rank.) Only the standard library, tqdm (optional) and
hscapture are needed on the client side.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def read_dataset(path: Path, prefix: str):
    with open(path) as f:
        for lineno, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            ids = row["input_ids"] if isinstance(row, dict) else row
            key = str(row.get("id", lineno)) if isinstance(row, dict) else str(lineno)
            yield f"{prefix}{key}", [int(t) for t in ids]


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--server", default="http://127.0.0.1:30000")
    ap.add_argument("--endpoint", action="append", required=True,
                    help="producer endpoint (once per DP rank)")
    ap.add_argument("--rid-prefix", default="hscap-", help="must match HSCAPTURE_RID_PREFIX")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=0,
                    help="0: prefill only (default); 1 if your deployment rejects 0")
    ap.add_argument("--timeout", type=float, default=600.0, help="per sample, seconds")
    ap.add_argument("--shard-size", type=int, default=2 << 30)
    args = ap.parse_args(argv)

    from hscapture import Subscriber
    from hscapture.shards import ShardWriter

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None

    args.out.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(args.out, max_shard_bytes=args.shard_size,
                         metadata={"source": "sglang", "dataset": str(args.dataset)})
    todo = [(rid, ids) for rid, ids in read_dataset(args.dataset, args.rid_prefix)
            if not writer.seen(rid)]
    print(f"{len(todo)} samples to extract ({len(writer.rids)} already in {args.out})",
          file=sys.stderr)
    if not todo:
        writer.close()
        return 0

    # Attach before sending anything: a subscriber sees every record reserved after it
    # attached. The producer exists once the server is up (it starts with the scheduler).
    sub = Subscriber(args.endpoint)
    sub.wait_ready(timeout=60, producers=len(args.endpoint))
    url = args.server.rstrip("/") + "/generate"
    failed: dict[str, str] = {}
    lock = threading.Lock()
    bar = tqdm(total=len(todo), unit="sample") if tqdm else None

    def send(rid: str, ids: list[int]) -> None:
        body = {"rid": rid, "input_ids": ids,
                "sampling_params": {"max_new_tokens": args.max_new_tokens, "temperature": 0}}
        try:
            post(url, body, args.timeout)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            with lock:
                failed[rid] = f"request failed: {exc}"

    for rid, ids in todo:  # (main thread: the Subscriber is not shared across threads)
        sub.expect(rid, len(ids))  # a sample with any other token count is rejected
    pending = {rid for rid, _ in todo}
    with cf.ThreadPoolExecutor(args.concurrency) as pool:
        futures = [pool.submit(send, rid, ids) for rid, ids in todo]
        deadline = None
        while pending:
            sample = sub.poll(timeout=0.5)
            if sample is not None:
                if sample.rid in pending:
                    writer.add(sample)
                    pending.discard(sample.rid)
                    if bar:
                        bar.update(1)
                sample.release()
            stats = sub.stats()
            for kind in ("dropped", "incomplete", "rejected"):
                for rid, why in stats.get(kind, {}).items():
                    if rid in pending:
                        pending.discard(rid)
                        failed[rid] = f"{kind}: {why}"
                        if bar:
                            bar.update(1)
            with lock:
                pending -= set(failed)
            if all(f.done() for f in futures):
                deadline = deadline or time.monotonic() + args.timeout
                if time.monotonic() > deadline:
                    for rid in pending:
                        failed[rid] = "no sample arrived (timeout)"
                    break
    if bar:
        bar.close()
    writer.close()
    sub.close()
    for rid, why in sorted(failed.items()):
        print(f"FAILED {rid}: {why}", file=sys.stderr)
    print(f"wrote {len(todo) - len(failed)} samples; {len(failed)} failed (rerun to retry "
          f"them: done rids are skipped)", file=sys.stderr)
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
