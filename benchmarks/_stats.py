"""The one place where benchmarks repeat, compare, decide and record.

Every benchmark in this folder measures a *candidate* (hscapture) against a *baseline* (the
like-for-like thing it should approach) the same way:

- :func:`run_paired` alternates them ``A B A B ...`` (or ``A B B A ...``) for ``reps``
  repetitions after ``warmup`` discarded ones, so drift (page cache, clocks, thermals) hits both
  sides alike and each repetition gives one *paired* ratio.
- :func:`summarize` reports the median, the min–max and a bootstrap 95 % interval of the
  median; :func:`ratio_summary` does it for the paired ratios.
- :func:`goal_met` calls a goal met only when the whole spread (every repetition) clears it.
- :func:`abba_order` / :func:`pair_summary`: many short adjacent pairs (ABBA), one ratio per
  pair, judged on the distribution-free interval of the median ratio (:func:`median_ci`):
  enough pairs resolve a 2 % difference where the min–max of a few long rounds cannot.
- :func:`write_record` writes the JSON: results, configuration, what is and is not inside the
  timed region, the machine (CPU, GPU, memory), the commit and the command line.

Nothing here imports torch at module import time (the arithmetic is tested without it).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent

#: Directions a goal can have: the figure must be at least (``>=``) or at most (``<=``) the goal.
DIRECTIONS = (">=", "<=")


# -- arithmetic ---------------------------------------------------------------------------------

def _finite(xs: Sequence[float]) -> list[float]:
    out = [float(x) for x in xs]
    if not out:
        raise ValueError("expected at least one value, found none")
    if any(not math.isfinite(x) for x in out):
        raise ValueError(f"expected finite values, found {out}")
    return out


def median(xs: Sequence[float]) -> float:
    """The median of ``xs`` (mean of the two middle values for an even count)."""
    return float(statistics.median(_finite(xs)))


def spread(xs: Sequence[float]) -> tuple[float, float]:
    """``(min, max)`` of ``xs``."""
    v = _finite(xs)
    return min(v), max(v)


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q`` % of ``xs`` at or below it.

    Always one of the values (no interpolation), so a p99 is a latency that really happened.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: expected 0 <= q <= 100, found {q}")
    v = sorted(_finite(xs))
    k = max(0, math.ceil(q / 100 * len(v)) - 1)
    return v[min(k, len(v) - 1)]


def bootstrap_ci(xs: Sequence[float], *, level: float = 0.95, n_boot: int = 2000,
                 seed: int = 0, stat: Callable[[Sequence[float]], float] = median
                 ) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``stat`` (default: the median) of ``xs``.

    Deterministic for a given ``seed``. For the median (or any statistic that lies between its
    sample's min and max) the interval lies inside ``spread(xs)``. With 5 repetitions it is
    coarse (it can only take sample values or midpoints); report it beside min–max, never
    instead of it.
    """
    v = _finite(xs)
    if not 0 < level < 1:
        raise ValueError(f"bootstrap_ci: expected 0 < level < 1, found {level}")
    if len(v) == 1:
        return v[0], v[0]
    rng = random.Random(seed)
    n = len(v)
    boots = sorted(stat([v[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    alpha = (1 - level) / 2
    lo = boots[max(0, math.floor(alpha * n_boot))]
    hi = boots[min(n_boot - 1, math.ceil((1 - alpha) * n_boot) - 1)]
    return float(lo), float(hi)


def median_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free confidence interval of the median: ``(lo, hi, coverage)``.

    The order statistics ``x_(k) .. x_(n+1-k)`` (1-based, sorted) with the largest ``k``
    for which ``P(Binomial(n, 1/2) < k) <= (1 - level) / 2``: for independent values of
    any continuous distribution the interval holds the true median with probability
    ``coverage = 1 - 2 P(Binomial(n, 1/2) < k) >= level``. Needs no resampling and no
    shape assumption, and it is exact for constant input. With too few values for
    ``level`` (n < 6 at 95 %) no ``k >= 1`` qualifies: then it is ``(min, max)`` with the
    coverage it really has (``1 - 2^(1-n)``), below ``level`` — read ``coverage``.
    """
    v = sorted(_finite(xs))
    if not 0 < level < 1:
        raise ValueError(f"median_ci: expected 0 < level < 1, found {level}")
    n = len(v)
    alpha = (1 - level) / 2
    cdf, k = 0.0, 0          # cdf = P(B < k+1) as k grows
    pmf = 0.5 ** n           # P(B = 0)
    while k + 1 <= (n + 1) // 2:
        if cdf + pmf > alpha:
            break
        cdf += pmf
        pmf = pmf * (n - k) / (k + 1)
        k += 1
    if k == 0:               # too few values: the whole range, with its real coverage
        return v[0], v[-1], 1.0 - 2 * 0.5 ** n if n > 1 else 0.0
    return v[k - 1], v[n - k], 1.0 - 2 * cdf


def abba_order(names: Sequence[str], blocks: int) -> list[tuple[int, str, str]]:
    """The rounds of ``blocks`` blocks comparing a baseline ``names[0]`` with each candidate
    ``names[1:]`` in adjacent pairs: ``[(block, first, second), ...]``.

    In block ``b`` the pair for candidate ``j`` runs baseline-first when ``b + j`` is even,
    candidate-first otherwise (ABBA across blocks), so a linear drift cancels between
    consecutive blocks and every pair is two rounds run back to back. The candidates' order
    inside a block rotates by one per block, so over ``k`` blocks each candidate's pair
    holds each position of the block once: a position effect (what the round before a pair
    was, a mode switch before it) is spread over the candidates instead of favouring one
    (with a fixed order the second candidate beat the first in two H200 runs, whichever
    mode it was: benchmarks/results/h200-2026-12-01f)."""
    if len(names) < 2:
        raise ValueError(f"abba_order: expected a baseline and at least one candidate, "
                         f"found {list(names)}")
    if blocks < 1:
        raise ValueError(f"abba_order: expected blocks >= 1, found {blocks}")
    base, cands = names[0], list(names[1:])
    k = len(cands)
    out = []
    for b in range(blocks):
        for i in range(k):
            j = (b + i) % k
            cand = cands[j]
            out.append((b, base, cand) if (b + j) % 2 == 0 else (b, cand, base))
    return out


def pair_summary(ratios: Sequence[float], goal: float | None = None, direction: str = ">=",
                 *, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """The paired ratios, summarized for a decision: n, median, the distribution-free
    ``level`` interval of the median (:func:`median_ci`, with its real coverage), the
    bootstrap interval, min–max and the values. With ``goal``, ``met`` is judged on the
    interval of the median (``">="``: its lower end clears the goal; ``"<="``: its upper
    end does), and ``judged_on`` says so in words; ``met_whole_spread`` is the stricter
    min–max verdict of :func:`goal_met`, for reference."""
    v = _finite(ratios)
    lo, hi, cov = median_ci(v, level)
    out: dict[str, Any] = {"n": len(v), "median": median(v), "ci": [lo, hi],
                           "ci_level": level, "ci_coverage": cov,
                           "ci_method": "distribution-free order statistics of the median",
                           "bootstrap_ci": list(bootstrap_ci(v, level=level, seed=seed)),
                           "min": min(v), "max": max(v), "values": v}
    if goal is not None:
        if direction not in DIRECTIONS:
            raise ValueError(f"pair_summary: expected direction in {DIRECTIONS}, found "
                             f"{direction!r}")
        end = "lower" if direction == ">=" else "upper"
        bound = lo if direction == ">=" else hi
        out.update(goal=goal, direction=direction,
                   met=bound >= goal if direction == ">=" else bound <= goal,
                   judged_on=f"the {end} end of the {cov:.1%} confidence interval of the "
                             f"median paired ratio ({end} end {bound:.4f} {direction} {goal:g})",
                   met_whole_spread=goal_met(v, goal, direction))
    return out


def summarize(xs: Sequence[float], *, seed: int = 0) -> dict[str, Any]:
    """``{"n", "median", "min", "max", "ci95", "values"}`` of ``xs`` (``ci95``: bootstrap of the
    median)."""
    v = _finite(xs)
    lo, hi = spread(v)
    return {"n": len(v), "median": median(v), "min": lo, "max": hi,
            "ci95": list(bootstrap_ci(v, seed=seed)), "values": v}


def paired_ratios(candidate: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """``candidate[i] / baseline[i]`` for each repetition ``i`` (same length, baseline > 0)."""
    c, b = _finite(candidate), _finite(baseline)
    if len(c) != len(b):
        raise ValueError(f"paired_ratios: expected as many candidate as baseline values, "
                         f"found {len(c)} and {len(b)}")
    if any(x <= 0 for x in b):
        raise ValueError(f"paired_ratios: expected positive baseline values, found {b}")
    return [x / y for x, y in zip(c, b)]


def ratio_summary(candidate: Sequence[float], baseline: Sequence[float], *,
                  seed: int = 0) -> dict[str, Any]:
    """:func:`summarize` of the paired ratios candidate/baseline."""
    return summarize(paired_ratios(candidate, baseline), seed=seed)


def slowdown_pct(candidate_rate: Sequence[float], baseline_rate: Sequence[float]) -> list[float]:
    """Per repetition, how much slower the candidate is, in % of the baseline, from *rates*
    (higher is better): ``(1 - candidate/baseline) * 100``. Negative means faster."""
    return [(1.0 - r) * 100.0 for r in paired_ratios(candidate_rate, baseline_rate)]


def goal_met(values: Sequence[float], goal: float, direction: str) -> bool:
    """True only when every value (the whole spread) clears ``goal``.

    ``direction`` ``">="``: every value is at least ``goal``; ``"<="``: every value is at most
    ``goal``. No values, or any non-finite value, is never a met goal.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"goal_met: expected direction in {DIRECTIONS}, found {direction!r}")
    v = [float(x) for x in values]
    if not v or any(not math.isfinite(x) for x in v):
        return False
    return min(v) >= goal if direction == ">=" else max(v) <= goal


def goal_record(name: str, values: Sequence[float], goal: float, direction: str,
                unit: str = "") -> dict[str, Any]:
    """A goal, its verdict and the spread it was judged on, for the JSON and the log."""
    met = goal_met(values, goal, direction)
    rec: dict[str, Any] = {"name": name, "goal": goal, "direction": direction, "unit": unit,
                           "met": met}
    try:
        rec.update(summarize(values))
    except ValueError:
        rec["values"] = [float(x) for x in values]
    return rec


def format_goal(g: Mapping[str, Any]) -> str:
    """One log line: ``goal NAME >= 0.9: MET (median 0.95, min 0.93 .. max 0.97, n=5)``."""
    head = f"goal {g['name']} {g['direction']} {g['goal']:g}{g.get('unit', '')}: " \
           f"{'MET' if g['met'] else 'MISSED'}"
    if "median" in g:
        head += f" (median {g['median']:.4g}, min {g['min']:.4g} .. max {g['max']:.4g}, " \
                f"n={g['n']})"
    return head


def fmt_spread(s: Mapping[str, Any], digits: int = 3) -> str:
    """``1.23 [1.20 .. 1.31]`` from a :func:`summarize` dict (median [min .. max])."""
    return f"{s['median']:.{digits}g} [{s['min']:.{digits}g} .. {s['max']:.{digits}g}]"


# -- repetitions --------------------------------------------------------------------------------

@dataclass
class Paired:
    """Results of :func:`run_paired`: per repetition, the candidate's and the baseline's run
    (whatever the callables returned) and the figure extracted from each."""

    candidate_runs: list[Any] = field(default_factory=list)
    baseline_runs: list[Any] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    order: list[str] = field(default_factory=list)       # e.g. ["warmup:A", "warmup:B", "A", ...]
    warmup_runs: list[Any] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return paired_ratios(self.candidate, self.baseline)

    def summary(self) -> dict[str, Any]:
        return {"candidate": summarize(self.candidate), "baseline": summarize(self.baseline),
                "ratio": ratio_summary(self.candidate, self.baseline), "order": self.order}


def _figure(run: Any, key: str | Callable[[Any], float] | None) -> float:
    if key is None:
        return float(run)
    if callable(key):
        return float(key(run))
    return float(run[key])


def run_paired(candidate: Callable[[int], Any], baseline: Callable[[int], Any], *,
               reps: int = 5, warmup: int = 1, order: str = "ABAB",
               key: str | Callable[[Any], float] | None = None,
               on_rep: Callable[[int, Any, Any], None] | None = None) -> Paired:
    """Run ``candidate(rep)`` and ``baseline(rep)`` alternately; return every run.

    ``order="ABAB"``: candidate then baseline in every repetition; ``"ABBA"``: the first of
    the two alternates between repetitions (cancels a linear drift). ``warmup`` repetitions run
    first, in the same order, and are kept only in ``warmup_runs`` (rep index < 0). ``key``
    extracts the figure from a run (a dict key, a function, or None when the callable returns
    a number). ``on_rep(rep, candidate_run, baseline_run)`` is called after each counted
    repetition (for progress lines).
    """
    if reps < 1:
        raise ValueError(f"run_paired: expected reps >= 1, found {reps}")
    if order not in ("ABAB", "ABBA"):
        raise ValueError(f"run_paired: expected order ABAB or ABBA, found {order!r}")
    out = Paired()
    for i in range(-warmup, reps):
        first_a = order == "ABAB" or (i % 2 == 0)
        seq = (("A", candidate), ("B", baseline)) if first_a else \
            (("B", baseline), ("A", candidate))
        got: dict[str, Any] = {}
        for tag, fn in seq:
            got[tag] = fn(i)
            out.order.append(f"warmup:{tag}" if i < 0 else tag)
        if i < 0:
            out.warmup_runs.append(got)
            continue
        out.candidate_runs.append(got["A"])
        out.baseline_runs.append(got["B"])
        out.candidate.append(_figure(got["A"], key))
        out.baseline.append(_figure(got["B"], key))
        if on_rep is not None:
            on_rep(i, got["A"], got["B"])
    return out


def run_alternating(fns: Mapping[str, Callable[[int], Any]], *, reps: int = 5,
                    warmup: int = 1) -> tuple[dict[str, list[Any]], list[str]]:
    """More than two methods: every repetition runs each once, the order rotating by one per
    repetition (A B C, B C A, C A B, ...). Returns ``({name: [run per counted rep]}, order)``;
    warm-up repetitions are discarded."""
    names = list(fns)
    runs: dict[str, list[Any]] = {n: [] for n in names}
    order: list[str] = []
    for i in range(-warmup, reps):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            r = fns[n](i)
            order.append(f"warmup:{n}" if i < 0 else n)
            if i >= 0:
                runs[n].append(r)
    return runs, order


# -- machine, commit, record ----------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def git_commit(root: Path = ROOT) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout at ``root``."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": None if status is None else bool(status)}


def machine_info() -> dict[str, Any]:
    """Host, CPU model and count, memory, Python, numpy/torch versions, GPU name (via torch when
    it imports and sees CUDA), and the commit (via git)."""
    info: dict[str, Any] = {"host": platform.node(), "kernel": platform.release(),
                            "cpu": _cpu_model(), "cpus": os.cpu_count(),
                            "mem_total_bytes": _mem_total_bytes(),
                            "python": sys.version.split()[0]}
    try:
        info["sched_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except Exception:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["cuda_version"] = torch.version.cuda
    except Exception as exc:
        info["torch"] = f"not importable: {type(exc).__name__}"
    try:
        import hscapture
        info["hscapture"] = hscapture.__version__
    except Exception:
        pass
    info.update(git_commit())
    return info


def timed_region(inside: Sequence[str], outside: Sequence[str], clock: str) -> dict[str, Any]:
    """What a figure's clock covers: ``inside`` it, ``outside`` it, and which clock it is."""
    if not inside:
        raise ValueError("timed_region: say what is inside the timed region")
    return {"clock": clock, "inside": list(inside), "outside": list(outside)}


def write_record(path: str | os.PathLike, *, benchmark: str,
                 timed_regions: Mapping[str, Mapping[str, Any]], results: Mapping[str, Any],
                 config: Mapping[str, Any] | None = None,
                 goals: Sequence[Mapping[str, Any]] = (), notes: Sequence[str] = ()
                 ) -> dict[str, Any]:
    """Write one benchmark's JSON record and return it.

    ``timed_regions`` maps each measured method (or figure) to a :func:`timed_region` dict; a
    record without one is refused (ValueError), so no JSON can omit what its clock covered.
    The record also holds ``machine`` (:func:`machine_info`), ``command`` (this process's argv)
    and ``time`` (UTC, ISO 8601).
    """
    if not timed_regions:
        raise ValueError("write_record: expected at least one timed_region, found none")
    for name, tr in timed_regions.items():
        if not isinstance(tr, Mapping) or not tr.get("inside") or "outside" not in tr \
                or not tr.get("clock"):
            raise ValueError(f"write_record: timed_regions[{name!r}] must have clock, inside "
                             f"and outside; found {tr!r}")
    rec = {"benchmark": benchmark,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
           "machine": machine_info(), "timed_region": dict(timed_regions),
           "config": dict(config or {}), "goals": list(goals), "notes": list(notes),
           "results": dict(results)}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=2, default=_json_default)
        f.write("\n")
    os.replace(tmp, p)
    print(f"wrote {p}", flush=True)
    return rec


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


# -- filesystems and plots --------------------------------------------------------------------

def fs_info(path: str | os.PathLike) -> dict[str, Any]:
    """Filesystem type, mount point and free space of ``path`` (from /proc/self/mountinfo)."""
    real = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                sep = parts.index("-")
                mnt = parts[4].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/") or mnt == "/") \
                        and len(mnt) >= len(best[0]):
                    best = (mnt, parts[sep + 1], parts[sep + 2])
    except (OSError, ValueError):
        pass
    st = os.statvfs(real)
    fstype = best[1]
    return {"path": real, "mount": best[0], "fstype": fstype, "source": best[2],
            "free_bytes": st.f_bavail * st.f_frsize, "size_bytes": st.f_blocks * st.f_frsize,
            "memory_backed": fstype in ("tmpfs", "ramfs", "hugetlbfs")}


def get_pyplot() -> Any:
    """matplotlib.pyplot with the Agg backend, or None (and a line saying the plot is skipped)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except Exception as exc:
        print(f"no plot: matplotlib is not importable ({type(exc).__name__}); the JSON has "
              f"every number", flush=True)
        return None


def errorbar_args(summaries: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[list[float]]]:
    """Medians and asymmetric min–max error bars for ``plt.errorbar`` / ``plt.bar(yerr=...)``."""
    med = [s["median"] for s in summaries]
    return med, [[s["median"] - s["min"] for s in summaries],
                 [s["max"] - s["median"] for s in summaries]]
