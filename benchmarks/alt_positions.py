#!/usr/bin/env python3
"""Loop turn and hook time by a pass's position in its alt=N block, from a forward log.

    python benchmarks/alt_positions.py forwards.bin[.xz] [--window first|second|all]

``bench_server --alt N`` captures N prefill passes, skips N, in turn; its ratios compare
whole blocks. This splits them by position: for each side (1 captured, 2 skipped) and each
position in the block, the median loop turn (this pass's hook entry to the next one's) and
the median and mean hook time, over extend passes. A cost that lands on one position (the
turn after a capture's copies were issued, a drain at a block's end) shows here and not in
the block ratios. The windows of ``--alt-log`` (e.g. 0 and 50 ms) follow each other in one
log; ``--window`` keeps the passes before or after the longest pause between two passes.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def positions(path: str, window: str = "all", n_pos: int = 16) -> list[dict]:
    from hscapture.sglang.timing import read_forward_log

    f = read_forward_log(path)
    f = f[np.argsort(f["t_ns"], kind="stable")]
    f = f[f["phase"] > 0]
    turns = np.diff(f["t_ns"]).astype(np.float64)
    f = f[:-1]
    pos = np.zeros(len(f), dtype=np.int64)
    for i in range(1, len(f)):
        pos[i] = pos[i - 1] + 1 if f["phase"][i] == f["phase"][i - 1] else 0
    keep = np.ones(len(f), dtype=bool)
    if window != "all" and len(turns) > 1:
        cut = int(np.argmax(turns))
        keep = np.arange(len(f)) <= cut if window == "first" else np.arange(len(f)) > cut
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
    ap.add_argument("--window", choices=("all", "first", "second"), default="all")
    a = ap.parse_args(argv)
    rows = positions(a.path, a.window)
    if not rows:
        print("no alt=N passes in", a.path)
        return 1
    for r in rows:
        print(f"{'captured' if r['side'] == 1 else 'skipped ':8} position {r['position']:2}: "
              f"{r['passes']:5} passes, turn median {r['turn_us_median']:7.0f} us, hook median "
              f"{r['hook_us_median']:5.0f} / mean {r['hook_us_mean']:5.0f} us, "
              f"{r['tokens_mean']:.0f} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
