"""Draw the README's ratio goals as one picture: each figure's median and spread against its goal.

    python benchmarks/plot_scoreboard.py [--data benchmarks/scoreboard.json] [--out docs/scoreboard.png]

The data is ``benchmarks/scoreboard.json`` (one entry a figure of the README's Performance
table; ``tests/test_scoreboard.py`` keeps the two in agreement). A figure is drawn green when
its whole spread clears its goal, red otherwise, as the table judges it. Needs matplotlib (not
a dependency of hscapture: ``pip install matplotlib``); without it, says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import get_pyplot  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path) -> list[dict[str, Any]]:
    """The scoreboard's entries, numbers parsed (``median``/``lo``/``hi`` are written as text)."""
    rows = json.loads(path.read_text())["rows"]
    for r in rows:
        for k in ("median", "lo", "hi"):
            r[k] = float(r[k])
        if not r["lo"] <= r["median"] <= r["hi"]:
            raise ValueError(f"{r['label']}: median {r['median']} outside its spread "
                             f"{r['lo']}-{r['hi']}")
    return rows


def met(row: dict[str, Any]) -> bool:
    """The table's rule: a goal is met only when the whole spread clears it."""
    return row["lo"] >= row["goal"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "scoreboard.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "scoreboard.png")
    a = ap.parse_args()
    rows = load(a.data)
    plt = get_pyplot()
    if plt is None:
        return 0
    # two panels: the real server's goal (0.98) needs a fine scale, the others a wide one
    panels = [[r for r in rows if r["goal"] >= 0.95], [r for r in rows if r["goal"] < 0.95]]
    panels = [p for p in panels if p]
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(8.5, 0.42 * len(rows) + 1.0 * len(panels) + 0.6),
                             gridspec_kw={"height_ratios": [len(p) for p in panels]})
    for ax, group in zip(axes[:, 0], panels):
        lo = min(min(r["lo"], r["goal"]) for r in group)
        span = max(r["goal"] for r in group) - lo
        right = max(r["goal"] for r in group) + max(span, 0.02) * 1.6
        for y, r in enumerate(reversed(group)):
            color = "tab:green" if met(r) else "tab:red"
            ax.plot([r["lo"], min(r["hi"], right)], [y, y], color=color, linewidth=2.2)
            if r["hi"] > right:      # a spread past the panel: its end written, not drawn
                ax.annotate(f"→ {r['hi']:g}", (right, y), xytext=(-30, 4),
                            textcoords="offset points", fontsize=7, color=color)
            ax.plot([r["median"]], [y], "o", color=color)
            ax.plot([r["goal"], r["goal"]], [y - 0.38, y + 0.38], color="black", linewidth=1.4)
        ax.set_xlim(lo - max(span, 0.02) * 0.15, right)
        ax.set_yticks(range(len(group)))
        ax.set_yticklabels([f"{r['label']} [{r['cmd']}]" for r in reversed(group)], fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ratio to the baseline (dot: median; bar: spread or CI; "
                           "black tick: the goal)")
    axes[0, 0].set_title("hscapture's ratio goals: green when the whole spread clears the goal",
                         fontsize=9)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}: {sum(map(met, rows))} of {len(rows)} figures meet their goal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
