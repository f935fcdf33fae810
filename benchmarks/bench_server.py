#!/usr/bin/env python3
"""Prompt throughput of a REAL SGLang server with capture on vs off, alternating, same server.

Run as the client of ``.sgl/bin/serve.sh`` on the GPU host (see benchmarks/README.md):

    HSCAPTURE_ENDPOINT='ipc:///tmp/hscap-{dp_rank}.sock' HSCAPTURE_STATS_FILE=/tmp/hook.json \\
    bash .sgl/bin/serve.sh --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 \\
        --return-aux-hidden-state-layer-ids 0 1 2 --disable-radix-cache -- \\
        python3 benchmarks/bench_server.py --out $OUT/server.json

What is timed: the wall time from the first request sent to the last response received, for
a fixed set of requests (``max_new_tokens=1``, greedy) sent with a fixed concurrency; prompt
tokens/s = prompt tokens / that time. "on" requests opt in (rid prefix ``hscap-``), "off"
requests do not; both run on the same server, alternating in every repetition (off, on, off,
on, ...), after one discarded warm-up round. A subscriber runs in another process for the
whole run and every "on" sample it receives is checked (token count and token ids) against
what was sent. ``--experiments`` adds hook modes (``noop``: the hook returns at once,
``nocapture``: everything but ``Producer.capture``) switched through
``HSCAPTURE_EXPERIMENT_FILE`` to find where the time goes. The hook's own time per forward
(``HSCAPTURE_STATS_FILE``) is recorded after every repetition.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
import zlib

MIXES = {"short": (200, 400), "long": (2500, 3500)}
_CHILDREN: list[subprocess.Popen] = []


def post(url: str, payload: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(f"{url}/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def ids_crc(ids: list[int]) -> int:
    import numpy as np
    return zlib.crc32(np.asarray(ids, dtype="<i4").tobytes())


def run_round(url: str, prompts: list[list[int]], rids: list[str], concurrency: int
              ) -> tuple[float, list[list[int]]]:
    outs: list = [None] * len(prompts)

    def one(i: int) -> None:
        r = post(url, {"input_ids": prompts[i], "rid": rids[i],
                       "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
        outs[i] = r.get("output_ids")

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, range(len(prompts))))
    return time.perf_counter() - t0, outs


def subscriber_main(endpoint: str, out: str, stop_file: str) -> None:
    """Drain every sample into a JSONL of (rid, tokens, crc of ids, layers); stop on file."""
    from hscapture import Subscriber

    n = 0
    with Subscriber(endpoint) as sub, open(out, "w") as f:
        sub.wait_ready(timeout=120)
        open(f"{stop_file}.ready", "w").close()
        while not os.path.exists(stop_file):
            s = sub.poll(timeout=0.2)
            if s is None:
                continue
            ids = s.token_ids.to("cpu").numpy().astype("<i4")
            f.write(json.dumps({"rid": s.rid, "n": s.num_tokens, "crc": zlib.crc32(ids.tobytes()),
                                "layers": sorted(s.tensors)}) + "\n")
            s.release()
            n += 1
        st = sub.stats()
        f.write(json.dumps({"stats": {k: v for k, v in st.items()
                                      if k not in ("errors", "in_flight")}},
                           default=str) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("SGLANG_URL", "http://127.0.0.1:30000"))
    ap.add_argument("--endpoint", default=None, help="subscriber endpoint (default: HSCAPTURE_ENDPOINT, dp 0)")
    ap.add_argument("--mix", default="short,long")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", default="short=512,long=128",
                    help="requests per round and mix; scaled up after the warm-up round so that "
                         "a capture-off round lasts about --round-s seconds")
    ap.add_argument("--round-s", type=float, default=0.0,
                    help="target seconds per round (0: use --requests as given)")
    ap.add_argument("--experiments", default="", help="extra hook modes, e.g. noop,nocapture")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn from [3, vocab)")
    args = ap.parse_args()

    endpoint = args.endpoint or os.environ.get("HSCAPTURE_ENDPOINT", "").replace("{dp_rank}", "0")
    exp_file = os.environ.get("HSCAPTURE_EXPERIMENT_FILE", "")
    stats_file = os.environ.get("HSCAPTURE_STATS_FILE", "")
    nreq = dict(kv.split("=") for kv in args.requests.split(","))
    rng = random.Random(args.seed)
    workdir = os.path.dirname(os.path.abspath(args.out))
    samples_file = os.path.join(workdir, "server-samples.jsonl")
    stop_file = os.path.join(workdir, "server-stop")
    for stale in (stop_file, f"{stop_file}.ready"):
        if os.path.exists(stale):
            os.unlink(stale)
    sub = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--subscribe", endpoint,
                            samples_file, stop_file])
    _CHILDREN.append(sub)

    def set_mode(mode: str) -> None:
        """Switch the hook's mode and wait until the hook reports it (its stats file, written
        at most once a second on the scheduler's thread, names the mode it ran with): tiny
        plain requests keep the server stepping until then."""
        if not exp_file:
            return
        with open(exp_file, "w") as f:
            f.write(mode)
        deadline = time.monotonic() + 30
        while hook_stats().get("mode", "") != mode:
            if time.monotonic() > deadline:
                raise SystemExit(f"the hook did not switch to mode {mode!r} within 30 s "
                                 f"(stats file {stats_file!r})")
            post(args.url, {"input_ids": [5, 6, 7], "rid": f"plain-mode-{time.monotonic_ns()}",
                            "sampling_params": {"max_new_tokens": 1}})

    def hook_stats() -> dict:
        try:
            with open(stats_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    modes = ["off", "on"] + [f"on:{e}" for e in args.experiments.split(",") if e]
    expected: dict[str, tuple[int, int]] = {}
    report: dict = {"args": vars(args), "mixes": {}}
    deadline = time.monotonic() + 120
    while not os.path.exists(f"{stop_file}.ready"):   # the subscriber attached to the ring
        if time.monotonic() > deadline or sub.poll() is not None:
            raise SystemExit("the subscriber did not attach within 120 s")
        time.sleep(0.05)
    for mix in args.mix.split(","):
        lo, hi = MIXES[mix]
        n = int(nreq[mix])
        prompts = [[rng.randrange(3, args.vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
        tokens = sum(map(len, prompts))
        rows: dict[str, list[float]] = {m: [] for m in modes}
        hooks: dict[str, list] = {m: [] for m in modes}
        outputs: dict[str, list] = {}
        warm_dt = 0.0
        for rep in range(-1, args.reps):       # rep -1: warm-up, discarded
            if rep == 0 and args.round_s > 0 and warm_dt:
                # long enough rounds: the server's own round-to-round noise shrinks with them
                scale = max(1.0, args.round_s / warm_dt)
                more = int(n * scale) - n
                prompts += [[rng.randrange(3, args.vocab) for _ in range(rng.randint(lo, hi))]
                            for _ in range(more)]
                n = len(prompts)
                tokens = sum(map(len, prompts))
                print(f"[bench_server] {mix}: {n} requests per round (~{args.round_s:g} s)",
                      flush=True)
            order = modes if rep % 2 == 0 else [modes[1], modes[0], *modes[2:]]
            for mode in order:
                set_mode(mode.partition(":")[2] if mode.startswith("on") else "")
                tag = mode.replace(":", "-")
                rids = [f"{'hscap' if mode.startswith('on') else 'plain'}-{mix}-{tag}-{rep}-{i}"
                        for i in range(n)]
                before = hook_stats().get("timing", {})
                dt, outs = run_round(args.url, prompts, rids, args.concurrency)
                after = hook_stats().get("timing", {})
                if mode == "on":
                    for r, p in zip(rids, prompts):
                        expected[r] = (len(p), ids_crc(p))
                outputs.setdefault(mode, outs)
                if rep < 0 and mode == "off":
                    warm_dt = dt
                if rep >= 0:
                    rows[mode].append(tokens / dt)
                    calls = after.get("calls", 0) - before.get("calls", 0)
                    ms = after.get("total_ms", 0) - before.get("total_ms", 0)
                    hooks[mode].append({"calls": calls, "hook_ms": ms, "wall_s": dt,
                                        "p50_us": after.get("p50_us"), "p90_us": after.get("p90_us")})
                print(f"[bench_server] {mix} rep {rep} {mode:14s} {tokens / dt:10.0f} prompt tok/s "
                      f"({dt:.2f}s)", flush=True)
        set_mode("")
        off = rows["off"]
        res = {"prompt_tokens": tokens, "requests": n, "tok_per_s": rows, "hook": hooks,
               "ratio_on_off": [a / b for a, b in zip(rows["on"], off)],
               # warm-up rounds of both modes; their batches differ, so greedy ids may differ
               # on near-tied logits (tests/server compares outputs with equal batches)
               "same_output_ids_warmup": all(a == b for a, b in zip(outputs.get("on", []),
                                                                    outputs.get("off", [])))}
        for m in modes:
            res.setdefault("median", {})[m] = statistics.median(rows[m])
        r = res["ratio_on_off"]
        res["ratio_summary"] = {"median": statistics.median(r), "min": min(r), "max": max(r)}
        report["mixes"][mix] = res
        print(f"[bench_server] {mix}: on/off median {res['ratio_summary']['median']:.3f} "
              f"(min {min(r):.3f}, max {max(r):.3f}); warm-up outputs identical: {res['same_output_ids_warmup']}",
              flush=True)
    time.sleep(2.0)
    open(stop_file, "w").close()
    sub.wait(timeout=60)
    got, tail = {}, {}
    with open(samples_file) as f:
        for line in f:
            rec = json.loads(line)
            if "stats" in rec:
                tail = rec["stats"]
            else:
                got[rec["rid"]] = rec
    wrong = [r for r, (n, crc) in expected.items()
             if r in got and (got[r]["n"] != n or got[r]["crc"] != crc)]
    missing = [r for r in expected if r not in got]
    extra = [r for r in got if r not in expected and not r.startswith("hscap-") or "plain" in r]
    report["verification"] = {"expected": len(expected), "received": len(got), "wrong": wrong[:20],
                              "n_wrong": len(wrong), "missing": len(missing),
                              "unrequested": extra[:20], "subscriber": tail}
    print(f"[bench_server] samples: expected {len(expected)}, received {len(got)}, wrong "
          f"{len(wrong)}, missing {len(missing)}, unrequested {len(extra)}", flush=True)
    report["hook_final"] = hook_stats()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    return 0 if not wrong and not extra else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--subscribe":
        subscriber_main(*sys.argv[2:5])
        sys.exit(0)
    try:
        sys.exit(main())
    finally:
        for child in _CHILDREN:
            if child.poll() is None:
                child.terminate()
