#!/usr/bin/env python3
"""Loop turn and hook time by a pass's position in its alt=N block, from a forward log.

    python benchmarks/alt_positions.py forwards.bin[.xz] [--server-json server.json]

``bench_server --alt N`` captures N prefill passes, skips N, in turn; its ratios compare
whole blocks. This splits them by position: for each side (1 captured, 2 skipped) and each
position in the block, the median loop turn (this pass's hook entry to the next one's) and
the median and mean hook time, over extend passes. A cost that lands on one position (the
turn after a capture's copies were issued, a drain at a block's end) shows here and not in
the block ratios. The windows of ``--alt-log`` (e.g. 0 and 50 ms) follow each other in one
log without a pause: ``--server-json`` (bench_server's ``--out``) splits them by each window's
``t_a``..``t_b`` (``time.perf_counter`` seconds, the forward log's clock); without it every
alt=N pass of the log is counted together.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def windows(server_json: str) -> list[tuple[str, float, float]]:
    """(label, t_a, t_b) of every interleaved window in a bench_server result."""
    import json

    with open(server_json) as fh:
        res = json.load(fh)
    out = []
    for mix, m in res.get("results", {}).get("mixes", {}).items():
        for key, val in m.items():
            if key.startswith("interleaved") and isinstance(val, dict):
                for w in val.get("windows", []):
                    out.append((f"{mix}, {key}", float(w["t_a"]), float(w["t_b"])))
    return sorted(out, key=lambda x: x[1])


def positions(path: str, t_a: float | None = None, t_b: float | None = None,
              n_pos: int = 16) -> list[dict]:
    """Per side and position, over the alt=N passes whose hook ran in [t_a, t_b] (seconds of
    the forward log's clock; all when None)."""
    from hscapture.sglang.timing import read_forward_log

    f = read_forward_log(path)
    f = f[np.argsort(f["t_ns"], kind="stable")]
    if t_a is not None:
        f = f[(f["t_ns"] >= t_a * 1e9) & (f["t_ns"] <= t_b * 1e9)]
    f = f[f["phase"] > 0]
    turns = np.diff(f["t_ns"]).astype(np.float64)
    f = f[:-1]
    pos = np.zeros(len(f), dtype=np.int64)
    for i in range(1, len(f)):
        pos[i] = pos[i - 1] + 1 if f["phase"][i] == f["phase"][i - 1] else 0
    keep = np.ones(len(f), dtype=bool)
    out = []
    for side in (1, 2):
        for k in range(n_pos):
            m = keep & (f["phase"] == side) & (pos == k) & (f["extend"] == 1) & (turns < 1e9)
            if m.sum() < 10:
                continue
            out.append({"side": side, "position": k, "passes": int(m.sum()),
                        "turn_us_median": float(np.median(turns[m]) / 1e3),
                        "hook_us_median": float(np.median(f["hook_ns"][m]) / 1e3),
                        "hook_us_mean": float(f["hook_ns"][m].mean() / 1e3),
                        "tokens_mean": float(f["tokens"][m].mean())})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--server-json", default=None)
    a = ap.parse_args(argv)
    spans = windows(a.server_json) if a.server_json else [("every alt=N pass", None, None)]
    found = False
    for label, t_a, t_b in spans:
        rows = positions(a.path, t_a, t_b)
        if not rows:
            continue
        found = True
        print(f"== {label}")
        for r in rows:
            print(f"{'captured' if r['side'] == 1 else 'skipped ':8} position {r['position']:2}: "
                  f"{r['passes']:5} passes, turn median {r['turn_us_median']:7.0f} us, hook "
                  f"median {r['hook_us_median']:5.0f} / mean {r['hook_us_mean']:5.0f} us, "
                  f"{r['tokens_mean']:.0f} tokens")
    if not found:
        print("no alt=N passes in", a.path)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
