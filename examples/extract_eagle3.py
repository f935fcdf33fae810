"""Extract EAGLE-3 training data from a running SGLang server, the verifiable way.

The server (see docs/sglang.md) runs in capture-only mode with hscapture enabled::

    HSCAPTURE_ENABLE=1 python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct \\
        --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 \\
        --return-aux-hidden-state-layer-ids 1 15 28 --disable-radix-cache

This script reads a JSONL dataset of token-id lists (``{"id": "...", "input_ids": [...]}``
per line; ``id`` optional, the line number is used otherwise), sends each to ``/generate``
with an explicit rid (``hscap-<id>``) and ``max_new_tokens: 0`` (prefill only), and writes
every captured sample into safetensors shards via the Subscriber and ShardWriter. It
resumes: rids already in the shard index are skipped. Samples the producer dropped or
reported incomplete are listed at the end (exit code 3), never written.

    python examples/extract_eagle3.py data.jsonl out/ --server http://127.0.0.1:30000

(``--endpoint`` defaults to DP rank 0's default endpoint, ``hscapture endpoints``; repeat it
once per DP rank.) A dry run without a GPU: ``python tests/generate_standin.py ENDPOINT``
serves a tiny CPU model behind the same ``/generate`` API (see the README). Only the standard
library, tqdm (optional) and hscapture are needed on the client side.
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


DATASET_FORMAT = """\
input (DATASET): JSON lines, one prompt per line, already tokenized:
  {"id": "q17", "input_ids": [128000, 791, 6460, 374]}
  [128000, 791, 6460, 374]          (a bare list: the line number is the id)
Each line becomes the sample with rid RID_PREFIX + id (e.g. hscap-q17).

output (OUT): a shard directory (safetensors shards + index.jsonl; `hscapture inspect OUT`).
Rerunning skips the ids already in OUT. Exit code 0: all written; 1: error; 3: some samples
were dropped or incomplete (listed; rerun to retry them)."""


class PreflightError(Exception):
    """The server or the capture endpoint is not usable; the message says which and why."""


def preflight(server: str, endpoints: list[str], timeout_s: float = 5.0) -> None:
    """Check once, before anything is written or sent, that the server answers ``/health``
    and that a producer listens on every endpoint. Raises :class:`PreflightError` with one
    message naming what is missing and how to fix it."""
    from hscapture.endpoint import check_endpoint, probe_endpoint
    from hscapture.errors import EndpointError

    url = server.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code not in (404, 405, 501):     # reachable, just no /health route: fine
            raise PreflightError(f"the server at {server} is not healthy: GET /health "
                                 f"answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PreflightError(
            f"no server at {server} ({reason}): start SGLang as in docs/sglang.md, or the CPU "
            f"stand-in for a dry run (python tests/generate_standin.py ENDPOINT), and pass "
            f"--server") from None
    problems = []
    for ep in endpoints:
        try:
            check_endpoint(ep, allow_inproc=False)
        except EndpointError as exc:
            raise PreflightError(str(exc)) from None
        why = probe_endpoint(ep, timeout_s=timeout_s)
        if why:
            problems.append(f"{ep}: {why}")
    if problems:
        raise PreflightError(
            "the server is up but no hscapture producer listens on " + "; ".join(problems)
            + ". Is the server started with HSCAPTURE_ENABLE=1 (docs/sglang.md)? "
            "`hscapture endpoints --live` lists the producers running on this machine")


def _size(text: str) -> int:
    from hscapture.cli import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=DATASET_FORMAT,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", type=Path, help="JSONL file of tokenized prompts (format below)")
    ap.add_argument("out", type=Path, help="shard directory to write (created; resumed)")
    ap.add_argument("--server", default="http://127.0.0.1:30000",
                    help="SGLang server URL (default: %(default)s)")
    ap.add_argument("--endpoint", action="append", default=None,
                    help="producer endpoint, once per DP rank (default: DP rank 0's default "
                         "endpoint, as printed by `hscapture endpoints`)")
    ap.add_argument("--rid-prefix", default="hscap-",
                    help="must match the server's HSCAPTURE_RID_PREFIX (default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="requests in flight (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=0,
                    help="0: prefill only (default); 1 if your deployment rejects 0")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds to wait for each sample (default: %(default)s)")
    ap.add_argument("--shard-size", type=_size, default="2G",
                    help="maximum size of one shard file, e.g. 512M or 2G (default: 2G)")
    args = ap.parse_args(argv)
    if args.concurrency < 1 or args.timeout <= 0 or args.max_new_tokens < 0:
        ap.error("--concurrency must be >= 1, --timeout > 0 and --max-new-tokens >= 0")
    if args.endpoint is None:
        from hscapture.endpoint import default_endpoint

        args.endpoint = [default_endpoint("sglang-dp0")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        preflight(args.server, args.endpoint)
    except PreflightError as exc:
        print(f"extract_eagle3: error: {exc}", file=sys.stderr)
        return 1

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
