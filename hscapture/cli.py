"""The ``hscapture`` command line: drain, inspect, demo, bench, cleanup."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .errors import EndpointError, HSCaptureError, SampleTimeoutError, ShardError

__all__ = ["main"]

_SIZE_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _parse_size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in _SIZE_SUFFIX else ""
    try:
        number = float(text[:-1] if unit else text)
    except ValueError:
        raise click.BadParameter(f"expected a size like 512M or 2G, found {value!r}") from None
    return int(number * _SIZE_SUFFIX[unit])


@click.group()
@click.version_option(package_name="hscapture")
def main() -> None:
    """Capture hidden states from a running inference server into safetensors shards."""


@main.command()
@click.option("--endpoint", "-e", "endpoints", multiple=True, required=True,
              help="Producer endpoint (repeat for several producers, e.g. one per DP rank).")
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Shard directory (created; resumed if it holds an index).")
@click.option("--samples", "-n", type=int, default=None, help="Stop after N samples.")
@click.option("--idle-timeout", type=float, default=None,
              help="Stop after this many seconds without a new sample.")
@click.option("--connect-timeout", type=float, default=30.0, show_default=True,
              help="Fail if no producer announces itself within this many seconds.")
@click.option("--shard-size", default="2G", show_default=True, callback=_parse_size,
              help="Maximum bytes per shard.")
@click.option("--flush-every", default="256M", show_default=True, callback=_parse_size,
              help="Make written samples durable (and release their ring space) this often.")
@click.option("--meta", multiple=True, help="KEY=VALUE added to every shard's metadata.")
@click.option("--quiet", "-q", is_flag=True, help="No progress line.")
@click.option("--json", "as_json", is_flag=True, help="Print the final report as JSON.")
def drain(endpoints: tuple[str, ...], out_dir: str, samples: int | None,
          idle_timeout: float | None, connect_timeout: float, shard_size: int,
          flush_every: int, meta: tuple[str, ...], quiet: bool, as_json: bool) -> None:
    """Subscribe to producers and write every complete sample into safetensors shards.

    Ctrl-C stops cleanly: the open shard is finished, not lost. Dropped, incomplete and
    rejected rids are listed at the end (exit code 3 if there were any).
    """
    from .drain import drain as run_drain

    metadata = {}
    for item in meta:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, found {item!r}", param_hint="--meta")
        metadata[key] = value
    try:
        res = run_drain(list(endpoints), out_dir, max_samples=samples,
                        idle_timeout_s=idle_timeout, connect_timeout_s=connect_timeout,
                        max_shard_bytes=shard_size, flush_bytes=flush_every,
                        metadata=metadata, progress=not quiet)
    except SampleTimeoutError as exc:
        raise click.ClickException(
            f"{exc}. Is the producer running, and is the endpoint right?") from None
    except (EndpointError, ShardError) as exc:
        raise click.ClickException(str(exc)) from None
    report = {"samples": res.samples, "bytes": res.bytes, "seconds": round(res.seconds, 3),
              "gb_per_s": round(res.gbps, 3), "duplicates_skipped": res.duplicates,
              "stopped_by": res.stopped_by, "dropped": res.dropped,
              "incomplete": res.incomplete, "rejected": res.rejected,
              "not_written": res.stats.get("not_written", []),
              "lost_notices": res.stats.get("lost_notices", 0),
              "malformed_notices": res.stats.get("malformed_notices", 0),
              "stale_notices": res.stats.get("stale_notices", 0)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(f"wrote {res.samples} samples, {res.bytes / 1e9:.3f} GB in {res.seconds:.1f}s "
                   f"({res.gbps:.3f} GB/s) to {out_dir}; skipped {res.duplicates} duplicates; "
                   f"stopped by {res.stopped_by}", err=True)
        for label in ("dropped", "incomplete", "rejected"):
            for rid, why in report[label].items():
                click.echo(f"  {label}: {rid}: {why}", err=True)
    if res.dropped or res.incomplete or res.rejected:
        sys.exit(3)


@main.command()
@click.argument("out_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect(out_dir: str, as_json: bool) -> None:
    """Summarize and verify a shard directory (exit code 1 if anything is wrong)."""
    from .shards import verify_dir

    try:
        report = verify_dir(out_dir)
    except HSCaptureError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        for key, value in report.items():
            if key != "problems":
                click.echo(f"{key}: {value}")
        for problem in report.get("problems", []):
            click.echo(f"PROBLEM: {problem}")
        click.echo("OK" if not report.get("problems") else "FAILED")
    if report.get("problems"):
        sys.exit(1)


@main.command()
@click.option("--out", "-o", "out_dir", default="demo-out", show_default=True,
              type=click.Path(file_okay=False), help="Where the demo writes its shards.")
@click.option("--requests", "-n", default=48, show_default=True, help="Requests to capture.")
@click.option("--chunk-size", default=64, show_default=True,
              help="Publish each request in chunks of this many tokens.")
@click.option("--dtype", default="bfloat16", show_default=True,
              type=click.Choice(["bfloat16", "float16", "float32"]))
def demo(out_dir: str, requests: int, chunk_size: int, dtype: str) -> None:
    """Capture a small random-weight Llama on CPU through the real path and verify the shards."""
    import shutil

    from .demo import run_demo

    if Path(out_dir).exists():
        shutil.rmtree(out_dir)
    res = run_demo(out_dir, requests=requests, chunk_size=chunk_size, dtype=dtype)
    if not res.ok:
        sys.exit(1)


@main.command()
@click.option("--prefix", default="hscapture-", show_default=True)
@click.option("--force", is_flag=True, help="Also remove segments a durable subscription has not drained.")
def cleanup(prefix: str, force: bool) -> None:
    """Remove shared-memory segments of this user whose producer is dead."""
    from .ring import cleanup_stale

    actions = cleanup_stale(prefix, force=force)
    for a in actions:
        click.echo(f"{a.action} stale segment {a.name}" + ("" if a.action == "removed" else f": {a.reason}"))
    click.echo(f"{sum(a.action == 'removed' for a in actions)} stale segment(s) removed")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("which", type=click.Choice(["ring", "e2e", "gpu", "all"]))
@click.pass_context
def bench(ctx: click.Context, which: str) -> None:
    """Run a benchmark from benchmarks/ (extra arguments are passed through)."""
    import runpy

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    scripts = {"ring": ["bench_ring.py"], "e2e": ["bench_e2e.py"], "gpu": ["bench_gpu.py"]}
    scripts["all"] = scripts["ring"] + scripts["e2e"] + scripts["gpu"]
    for script in scripts[which]:
        path = root / script
        if not path.exists():
            raise click.ClickException(
                f"{path} not found: benchmarks run from a source checkout of hscapture")
        sys.argv = [str(path), *ctx.args]
        runpy.run_path(str(path), run_name="__main__")
