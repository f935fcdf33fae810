"""The ``hscapture`` command line: drain, inspect, demo, endpoints, cleanup, bench.

Conventions (those of click, pip, huggingface-cli):

* bad input is a usage error (exit 2) before anything runs: endpoints, sizes with units
  (``512M``, ``2G``), ranges, ``--meta KEY=VALUE``;
* anticipated failures (no producer, unwritable directory, damaged shards, …) print one line
  ``hscapture: error: …`` and exit 1; ``--debug`` adds the traceback;
* everything the library says goes through the ``hscapture`` logger and is rendered here once
  as ``hscapture: message`` on stderr; data (``--json``, ``inspect``, ``endpoints``) goes to
  stdout.

Importing this module imports neither torch nor ZeroMQ: commands import what they need.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from ._cli_failure import Failure, Refusal, describe, json_error_too
from .errors import EndpointError, HSCaptureError

__all__ = ["main", "parse_size", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INCOMPLETE",
           "EXIT_INTERRUPTED"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: stdout closed by its reader: what a command killed by SIGPIPE returns
EXIT_BROKEN_PIPE = 141

log = logging.getLogger("hscapture.cli")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_PREFIX = re.compile(r"^(?:hscapture:?\s+)+")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``"512M"`` → 536870912. Units K, M, G, T are binary (``2G`` = 2 GiB; ``2GB``/``2GiB``
    mean the same); a plain number is bytes. Raises ValueError for anything else, zero or a
    negative size."""
    m = _SIZE.match(str(text))
    if m is None:
        raise ValueError(f"expected a size like 512M or 2G, found {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not math.isfinite(value) or int(value) <= 0:
        raise ValueError(f"expected a positive size like 512M or 2G, found {text!r}")
    return int(value)


class Size(click.ParamType):
    """A byte size with an optional unit (see :func:`parse_size`)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and value > 0:
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Endpoint(click.ParamType):
    """A ZeroMQ endpoint another process can reach: ``ipc://PATH`` or ``tcp://HOST:PORT``."""

    name = "ENDPOINT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from .endpoint import check_endpoint

        try:
            return check_endpoint(value, allow_inproc=False)
        except EndpointError as exc:
            self.fail(str(exc), param, ctx)


SIZE, ENDPOINT = Size(), Endpoint()
_POSITIVE = click.FloatRange(min=0, min_open=True)


# -- rendering ------------------------------------------------------------------------------


class _Renderer(logging.Handler):
    """Prints each ``hscapture*`` log record once as ``hscapture: [warning: ]message``."""

    def __init__(self, debug: bool) -> None:
        super().__init__(logging.DEBUG if debug else logging.INFO)
        self.debug = debug

    def emit(self, record: logging.LogRecord) -> None:
        from .progress import active_bar_write

        try:
            msg = record.getMessage()
            msg = _PREFIX.sub("", msg)       # library messages may carry the prefix
            level = {logging.WARNING: "warning: ", logging.ERROR: "error: ",
                     logging.CRITICAL: "error: "}.get(record.levelno, "")
            text = f"hscapture: {level}{msg}"
            if record.exc_info and self.debug:
                text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            active_bar_write(text, sys.stderr)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def _setup_logging(debug: bool) -> None:
    root = logging.getLogger("hscapture")
    for h in list(root.handlers):
        if isinstance(h, _Renderer):
            root.removeHandler(h)
    root.addHandler(_Renderer(debug))
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False


class _Group(click.Group):
    """Turns anticipated failures into one line + exit 1 and Ctrl-C into exit 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("hscapture: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            # stdout's reader went away (`hscapture inspect DIR | head`): stop quietly, as a
            # command killed by SIGPIPE would (exit 128 + 13); Python's final flush of stdout
            # would raise again, so it goes to /dev/null
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(EXIT_BROKEN_PIPE)
        except Failure as exc:
            if ctx.meta.get("hscapture.debug") and exc.__context__ is not None:
                traceback.print_exception(exc.__context__)
            raise
        except (HSCaptureError, OSError) as exc:
            if ctx.meta.get("hscapture.debug"):
                traceback.print_exc()
            raise Failure(describe(exc)) from None


_EPILOG = """\b
Exit codes:
  0    done
  1    error (one line "hscapture: error: ..."; --debug shows the traceback)
  2    usage error (bad option or argument), or a refusal (export: the shards
       cannot produce what was asked; nothing written)
  3    done, but some samples were dropped, incomplete, rejected, in flight or lost,
       numbers were not seen yet at the stop (unresolved), or two producers shared an id
       (all listed)
  130  interrupted (Ctrl-C); what was written is kept

\b
Default endpoint of a producer with id NAME (SGLang DP rank N: sglang-dpN):
  ipc://$HSCAPTURE_SOCKET_DIR/NAME.sock, else ipc://$XDG_RUNTIME_DIR/hscapture/NAME.sock,
  else ipc:///tmp/hscapture-<uid>/NAME.sock.  `hscapture endpoints` prints it.
"""


@click.group(cls=_Group, epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hscapture")
@click.option("--debug", is_flag=True, help="Show debug logs and tracebacks of errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Capture hidden states from a running inference server into safetensors shards."""
    ctx.meta["hscapture.debug"] = debug
    _setup_logging(debug)


# -- drain ----------------------------------------------------------------------------------


def _parse_meta(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]
                ) -> dict[str, str]:
    from .shard_format import DEFAULTABLE_KEYS, META_KEYS   # the format's reserved keys

    reserved = META_KEYS - DEFAULTABLE_KEYS
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, found {item!r}", ctx, param)
        if key in reserved:
            raise click.BadParameter(
                f"{key!r} is reserved by the shard format (reserved: "
                f"{', '.join(sorted(reserved))}); choose another key", ctx, param)
        out[key] = value
    return out


def _list_rids(label: str, rids: dict[str, str], limit: int = 20) -> None:
    for i, (rid, why) in enumerate(rids.items()):
        if i == limit:
            log.warning("... and %d more %s (all of them: --json)", len(rids) - limit, label)
            break
        log.warning("%s %s: %s", label, rid, why)


@main.command()
@click.option("--endpoint", "-e", "endpoints", multiple=True, required=True, type=ENDPOINT,
              help="Producer endpoint: ipc://PATH or tcp://HOST:PORT (repeat for several "
                   "producers, e.g. one per DP rank; `hscapture endpoints` prints the default).")
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Shard directory (created; resumed if it holds an index).")
@click.option("--samples", "-n", type=click.IntRange(min=1), default=None,
              help="Stop after N samples (shows % and ETA).")
@click.option("--idle-timeout", type=_POSITIVE, default=None, metavar="SECONDS",
              help="Stop after this many seconds without a new sample.")
@click.option("--connect-timeout", type=_POSITIVE, default=30.0, show_default=True,
              metavar="SECONDS", help="Fail if no producer answers within this many seconds.")
@click.option("--shard-size", type=SIZE, default="2G", show_default=True,
              help="Maximum size of one shard file (512M, 2G, ...).")
@click.option("--flush-every", type=SIZE, default="256M", show_default=True,
              help="Make written samples durable (and free their ring space) this often.")
@click.option("--meta", "metadata", multiple=True, callback=_parse_meta, metavar="KEY=VALUE",
              help="Added to every shard's metadata (repeatable).")
@click.option("--compress", "compression", type=click.Choice(["zstd", "fp8"]), default=None,
              help="Compact storage of the hidden states (default: none): zstd = lossless "
                   "(needs the 'compress' extra), fp8 = lossy FP8 e4m3 with per-token scales. "
                   "Every hscapture reader and export decodes it.")
@click.option("--compress-level", "compression_level", type=click.IntRange(min=-7, max=22),
              default=None, help="zstd level (default 1: as small as 3 on shuffled bf16, faster).")
@click.option("--unsubscribe", is_flag=True,
              help="Do not drain: end this output directory's durable subscription on the "
                   "given endpoints (their producers stop keeping records for it; give every "
                   "endpoint it drained), then exit.")
@click.option("--quiet", "-q", is_flag=True, help="No progress and no summary (problems still).")
@click.option("--json", "as_json", is_flag=True, help="Print the final report as JSON (stdout).")
@click.pass_context
def drain(ctx: click.Context, endpoints: tuple[str, ...], out_dir: str, samples: int | None,
          idle_timeout: float | None, connect_timeout: float, shard_size: int,
          flush_every: int, metadata: dict[str, str], compression: str | None,
          compression_level: int | None, unsubscribe: bool, quiet: bool,
          as_json: bool) -> None:
    """Subscribe to producers and write every complete sample into safetensors shards.

    Ctrl-C stops cleanly (exit 130): the open shard is finished, not lost, and a drain
    restarted into the same directory resumes without duplicates. Dropped, incomplete,
    rejected and in-flight rids, lost ranges and producer-id conflicts are listed at the end
    (exit 3 if there were any).

    \b
    Example:
      hscapture drain -e "$(hscapture endpoints)" -o shards/ -n 100000
    """
    from . import drain as drain_mod

    endpoints = tuple(dict.fromkeys(endpoints))   # -e X -e X: X once
    if unsubscribe:
        fn = getattr(drain_mod, "unsubscribe", None)
        if fn is None:
            raise Failure("this hscapture's drain has no durable subscriptions to end")
        held, given_up, failures = fn(list(endpoints), out_dir)
        if held:
            log.info("ended the subscription of %s on %s (places in %d ring(s) given back)",
                     out_dir, ", ".join(endpoints), held)
        else:
            log.info("no ring holds a place for the drain into %s on %s: nothing to give "
                     "back (its name is no longer recorded for new producers there either)",
                     out_dir, ", ".join(endpoints))
        if given_up:
            shown = ", ".join(given_up[:20]) + (", ..." if len(given_up) > 20 else "")
            log.warning("%d sample(s) committed to it were never written and are given up "
                        "with it: %s", len(given_up), shown)
        # failures no drain's report named yet (a drain killed before its report, or
        # before it recorded them): named here, then marked reported
        for kind in ("dropped", "incomplete", "rejected"):
            named = {rid: why for k, rid, why in failures if k == kind}
            _list_rids(kind, named, limit=len(named))       # (every one: no --json here)
        if failures:
            sys.stdout.flush()
            from ._report_log import ReportLog

            try:
                ReportLog(out_dir).mark_reported()
            except OSError as exc:
                log.warning("cannot mark %s/reports.jsonl reported: %s", out_dir, exc)
        return
    from .errors import SampleTimeoutError, ShardError
    from .shard_format import not_a_shard_directory

    try:
        names = sorted(os.listdir(out_dir))
    except (FileNotFoundError, NotADirectoryError):
        names = []
    foreign = not_a_shard_directory(names)
    if foreign:
        raise click.BadParameter(
            f"{out_dir} is not empty and holds no shards (it has "
            f"{', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}): drain into a new "
            f"or empty directory, or one a drain wrote", param_hint="--out")
    if compression_level is not None and compression != "zstd":
        raise click.UsageError("--compress-level applies to --compress zstd only")
    if compression == "zstd":
        from .codec import resolve

        try:
            resolve("zstd", compression_level)   # a missing zstandard fails now, not later
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--compress-level") from None
    level = logging.DEBUG if quiet else logging.INFO
    try:
        res = json_error_too(as_json, lambda: drain_mod.drain(list(endpoints), out_dir, max_samples=samples,
                              idle_timeout_s=idle_timeout, connect_timeout_s=connect_timeout,
                              max_shard_bytes=shard_size, flush_bytes=flush_every,
                              metadata=metadata, progress=not quiet, compression=compression,
                              compression_level=compression_level, report_by_caller=True,
                              on_waiting=lambda: _say_what_we_wait_for(endpoints,
                                                                       connect_timeout, level)))
    except SampleTimeoutError as exc:
        raise Failure(f"{exc}; is the producer running, and is the endpoint right? "
                      f"(`hscapture endpoints --live` lists running producers)") from None
    except ShardError as exc:   # a full disk, an unwritable or removed directory
        raise Failure(f"{describe(exc)}; what was not written stays in the producers' rings "
                      f"for this directory: rerun the same command once it can be written "
                      f"(a ring that fills meanwhile drops, and the next report names the "
                      f"drops)") from exc
    stats = res.stats or {}
    report = {"samples": res.samples, "bytes": res.bytes, "seconds": round(res.seconds, 3),
              "gb_per_s": round(res.gbps, 3), "duplicates_skipped": res.duplicates,
              "duplicate_rids": stats.get("skipped", [])[:1000],
              "stopped_by": res.stopped_by, "dropped": res.dropped,
              "incomplete": res.incomplete, "rejected": res.rejected,
              "in_flight": res.in_flight, "lost": res.lost, "unresolved": res.unresolved,
              "conflicts": res.conflicts,
              "not_written": stats.get("not_written", []),
              "lost_notices": stats.get("lost_notices", 0),
              "malformed_notices": stats.get("malformed_notices", 0),
              "stale_notices": stats.get("stale_notices", 0),
              # failures in reports.jsonl: named here from a killed drain, or read again and
              # not named twice (an earlier drain's report named them)
              "reported_from_earlier_drain": stats.get("reported_from_earlier_drain", 0),
              "failures_known_before": stats.get("failures_known_before", 0)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
    from .progress import format_size

    if not quiet:
        log.info("wrote %d samples (%s) to %s in %.1f s, %.3f GB/s; %d duplicates skipped; "
                 "stopped by %s", res.samples, format_size(res.bytes), out_dir, res.seconds,
                 res.gbps, res.duplicates, res.stopped_by or "?")
    if res.duplicates:
        dup = report["duplicate_rids"]
        log.warning("%d sample(s) came with a rid already in %s and were not written again "
                    "(the first copy is kept; e.g. a client's retry after a server restart): "
                    "%s", res.duplicates, out_dir,
                    ", ".join(dup[:20]) + (", ..." if res.duplicates > 20 else ""))
    for label in ("dropped", "incomplete", "rejected", "in_flight", "conflicts"):
        _list_rids(label.replace("_", " "), report[label])
    for lost in res.lost:
        log.warning("lost %s events of producer %s@%016x (seq %s..): %s", lost["count"],
                    lost["producer"], lost["epoch"], lost["first"], lost["reason"])
    for left in res.unresolved:
        log.warning("%s events of producer %s@%016x (seq %s..) %s", left["count"],
                    left["producer"], left["epoch"], left["first"], left["reason"])
    # the failures are marked reported only now that the report is out: a second Ctrl-C
    # (or a closed pipe) before this leaves them for the next drain to name again
    sys.stdout.flush()
    res.mark_reported()
    if res.stopped_by == "signal":
        log.warning("interrupted: %d samples written are kept; rerun the same command to go on",
                    res.samples)
        ctx.exit(EXIT_INTERRUPTED)
    if not res.complete:   # anything dropped, incomplete, rejected, in flight, lost, refused
        ctx.exit(EXIT_INCOMPLETE)


def _say_what_we_wait_for(endpoints: tuple[str, ...], timeout: float, level: int) -> None:
    """Tell at once what the drain waits for, where and how long (and why it may wait)."""
    from .endpoint import probe_endpoint

    for ep in endpoints:
        why = probe_endpoint(ep, timeout_s=0.5)
        log.log(level, "waiting up to %g s for the producer at %s%s; Ctrl-C to stop", timeout, ep,
                 f" (not up yet: {why})" if why else "")


# -- inspect --------------------------------------------------------------------------------


@main.command()
@click.argument("out_dir", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect(out_dir: str, as_json: bool) -> None:
    """Show the schema of a shard directory and verify it (exit 1 if anything is wrong)."""
    from .progress import format_size
    from .shard_check import verify_dir

    if not Path(out_dir).is_dir():
        raise click.BadParameter(
            f"{out_dir} is a file; inspect takes the shard directory that holds it: "
            f"hscapture inspect {Path(out_dir).parent}", param_hint="OUT_DIR")
    from .export import MANIFEST_NAME
    from .shard_format import INDEX_NAME

    if (Path(out_dir) / MANIFEST_NAME).is_file() and not (Path(out_dir) / INDEX_NAME).exists():
        raise Refusal(f"{out_dir} is an export (it holds {MANIFEST_NAME}), not a shard "
                      f"directory: inspect reads the shard directory it was exported from "
                      f"(its manifest's 'source')")
    report = verify_dir(out_dir)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        click.echo(f"{out_dir}: {report['samples']} samples, {report['tokens']} tokens, "
                   f"{report['shards']} shard(s), {format_size(report['bytes'])} of shard "
                   f"files (their headers included)")
        stored, logical = report.get("stored_bytes", 0), report.get("logical_bytes", 0)
        if stored != logical and logical:
            click.echo(f"  hidden states stored: {format_size(stored)} of "
                       f"{format_size(logical)} ({stored / logical:.2f} of their "
                       f"uncompressed size)")
        for sch in report["schemas"]:
            click.echo(f"  model: {sch['model'] or '(unknown)'}")
            click.echo(f"  convention: {sch['convention'] or '(none)'}")
            click.echo(f"  dtype: {sch['dtype']}, hidden size: {sch['hidden']}")
            names = sch["layer_names"] or [str(x) for x in sch["layers"]]
            kinds = sch["layer_kinds"] or ["?"] * len(names)
            after = sch.get("final_norm_after_layer")

            def what(k: str) -> str:
                if k == "final_norm":
                    return "after the final norm" + ("" if after is None else
                                                     f", applied to layer_{after}'s output")
                return k
            click.echo("  layers: " + ", ".join(f"{n} ({what(k)})" for n, k in zip(names, kinds)))
            if sch.get("num_layers") is not None:
                click.echo(f"  decoder layers: {sch['num_layers']}")
            codec = sch.get("codec") or {"name": "none", "lossless": True, "params": {}}
            if codec["name"] == "none":
                click.echo("  compression: none")
            else:
                lv = codec["params"].get("level")
                click.echo(f"  compression: {codec['name']}"
                           + (f" (level {lv})" if lv is not None else "")
                           + (", lossless" if codec["lossless"] else
                              ", LOSSY: readers return dequantized values"))
            if len(report["schemas"]) > 1:
                click.echo(f"  ({sch['shards']} shard(s), {sch['samples']} samples)")
        per = report.get("per_sample") or {}

        def counts(d: dict[str, int]) -> str:
            return ", ".join(f"{k} ({n})" for k, n in sorted(d.items()))
        if per.get("fields"):
            click.echo(f"  per-token fields (samples): {counts(per['fields'])}")
        if per.get("meta_keys"):
            click.echo(f"  client metadata keys (samples): {counts(per['meta_keys'])}")
        if per.get("meta_errors"):
            click.echo(f"  client metadata refused at capture: {per['meta_errors']} sample(s) "
                       f"(their meta_error says why)")
        if len(report["schemas"]) > 1:
            log.warning("%s holds samples of %d schemas (models, hidden sizes, dtypes or "
                        "layers); a trainer and `hscapture export` need one: drain each "
                        "capture into its own directory", out_dir, len(report["schemas"]))
        for f in report["in_progress"]:
            click.echo(f"  being written: {f}")
        for f in report["unrelated"]:
            click.echo(f"  not an hscapture shard: {f}")
        for problem in report["problems"]:
            click.echo(f"PROBLEM: {problem}")
        click.echo("OK" if report["ok"] else "FAILED")
    if not report["ok"]:
        first = report["problems"][0] if report["problems"] else "?"
        more = len(report["problems"]) - 1
        raise Failure(f"{first}" + (f" (and {more} more problems)" if more > 0 else ""))


# -- demo -----------------------------------------------------------------------------------


@main.command()
@click.option("--out", "-o", "out_dir", default="demo-out", show_default=True,
              type=click.Path(file_okay=False), help="Where the demo writes its shards.")
@click.option("--overwrite", is_flag=True,
              help="Replace a previous demo's output in --out (only the demo's own files).")
@click.option("--requests", "-n", default=48, show_default=True, type=click.IntRange(min=1),
              help="Requests to capture.")
@click.option("--chunk-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="Publish each request in chunks of this many tokens.")
@click.option("--dtype", default="bfloat16", show_default=True,
              type=click.Choice(["bfloat16", "float16", "float32"]))
def demo(out_dir: str, overwrite: bool, requests: int, chunk_size: int, dtype: str) -> None:
    """Capture a small random-weight Llama on CPU through the real path and verify the shards.

    Nothing is downloaded. Refuses a non-empty --out unless --overwrite (which removes only
    what an earlier demo wrote there).
    """
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise Failure("the demo's model is built with transformers, which is not installed: "
                      "pip install 'hscapture[demo]' (or transformers)")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        from .demo import clear_demo_output, is_demo_output
        from .shard_format import DEMO_MARKER

        if not overwrite:
            what = ("holds an earlier demo's output (only its hidden marker "
                    f"{DEMO_MARKER!r} if that demo was interrupted)"
                    if is_demo_output(out) else "is not empty")
            raise Refusal(f"{out_dir} {what}; choose a new directory or pass --overwrite "
                          f"to replace a previous demo's output")
        if not is_demo_output(out):
            raise Refusal(f"{out_dir} was not written by `hscapture demo`; --overwrite "
                          f"replaces only a demo's own output, so choose a new directory")
        clear_demo_output(out)
    from .demo import run_demo

    res = run_demo(out_dir, requests=requests, chunk_size=chunk_size, dtype=dtype)
    if not res.ok:
        raise Failure(f"the demo found {len(res.mismatched) + len(res.problems)} problem(s) "
                      f"(drain exit code {res.drain_returncode})")
    log.info("OK: every sample in %s is bit-exact", out_dir)


# -- endpoints / cleanup --------------------------------------------------------------------


@main.command()
@click.argument("producer_ids", nargs=-1)
@click.option("--dp-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Print the endpoints of SGLang DP ranks 0..N-1.")
@click.option("--live", is_flag=True, help="List the endpoints of running producers instead.")
def endpoints(producer_ids: tuple[str, ...], dp_size: int, live: bool) -> None:
    """Print default endpoints, one per line (stdout).

    Without arguments: where SGLang's DP rank 0 (..N-1 with --dp-size) publishes, read from
    the same HSCAPTURE_* variables the server reads. With PRODUCER_IDS: the default endpoint
    of a Producer(producer_id=ID).

    \b
    Example:
      hscapture drain -e "$(hscapture endpoints)" -o shards/
    """
    from .endpoint import default_endpoint, live_endpoints, socket_dir

    if live:
        found = live_endpoints()
        for ep in found:
            click.echo(ep)
        if not found:        # stdout stays empty for scripts; say why on stderr
            log.info("no live producer has an ipc endpoint in %s (a tcp:// endpoint is not "
                     "listed)", socket_dir())
        return
    if producer_ids:
        for pid in producer_ids:
            try:
                click.echo(default_endpoint(pid))
            except EndpointError as exc:
                raise click.BadParameter(str(exc), param_hint="PRODUCER_IDS") from None
        return
    from .sglang.config import endpoint_for_dp_rank, load_config

    cfg = load_config()
    for rank in range(dp_size):
        click.echo(endpoint_for_dp_rank(cfg.endpoint, rank)
                   or default_endpoint(f"{cfg.producer_id}-dp{rank}"))


@main.command()
@click.option("--prefix", default="hscapture-", show_default=True,
              help="Shared-memory segment name prefix.")
@click.option("--force", is_flag=True,
              help="Also remove segments a durable subscription has not finished reading.")
def cleanup(prefix: str, force: bool) -> None:
    """Remove what dead producers left: /dev/shm segments and ipc socket files.

    Only this user's segments and sockets whose producer is gone are removed.
    """
    from .endpoint import cleanup_sockets, socket_dir
    from .ring import cleanup_stale

    actions = cleanup_stale(prefix, force=force)
    removed = [a.name for a in actions if a.action == "removed"]
    for a in actions:
        if a.action == "removed":
            click.echo(f"removed stale segment {a.name}")
            continue
        why = a.reason.replace("pass force=True to remove it anyway", "`hscapture cleanup "
                               "--force` removes it anyway")
        click.echo(f"kept stale segment {a.name}: {why}")
        for name in dict.fromkeys(re.findall(r"durable subscription '([^']+)'", a.reason)):
            click.echo(f"  {_whose(name)}")
    sockets = cleanup_sockets()
    for path in sockets:
        click.echo(f"removed stale socket file {path}")
    log.info("%d stale segment(s) removed from /dev/shm, %d socket file(s) from %s",
             len(removed), len(sockets), socket_dir())


def _whose(name: str) -> str:
    """How to end the durable subscription ``name`` (what its drain recorded of itself)."""
    import shlex

    from ._subscriptions import who

    info = who(name) or {}
    out, eps = info.get("out_dir"), info.get("endpoints")
    if info.get("kind") == "drain" and isinstance(out, str) and isinstance(eps, list) and eps:
        cmd = "hscapture drain --unsubscribe " + " ".join(
            f"-e {shlex.quote(str(e))}" for e in eps) + f" -o {shlex.quote(out)}"
        gone = "" if os.path.isdir(out) else " (that directory no longer exists)"
        return f"'{name}' is the drain into {out}{gone}: `{cmd}` ends it, its samples given up"
    if name.startswith("drain-"):
        return (f"'{name}' is a drain's: `hscapture drain --unsubscribe -e ENDPOINT -o DIR` "
                f"(its endpoints and output directory) ends it, its samples given up")
    return (f"'{name}' is a durable subscriber's: its Subscriber(name=...).unsubscribe() ends "
            f"it, its samples given up")


# -- bench ----------------------------------------------------------------------------------


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("which", type=click.Choice(["ring", "e2e", "gpu", "all"]))
@click.pass_context
def bench(ctx: click.Context, which: str) -> None:
    """Run a benchmark from benchmarks/ (source checkout only; extra arguments pass through).

    The benchmark scripts are not part of the installed package: run this from a git
    checkout of hscapture (`pip install -e .`), or run benchmarks/*.py directly.
    """
    import runpy

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    scripts = {"ring": ["bench_ring.py"], "e2e": ["bench_e2e.py"], "gpu": ["bench_gpu.py"]}
    scripts["all"] = scripts["ring"] + scripts["e2e"] + scripts["gpu"]
    missing = [s for s in scripts[which] if not (root / s).is_file()]
    if missing:
        raise Failure(f"`hscapture bench` runs benchmarks/{missing[0]} of a source checkout, "
                      f"and this hscapture ({Path(__file__).resolve().parent}) is installed "
                      f"without one; clone the repository and run it there")
    for script in scripts[which]:
        path = root / script
        sys.argv = [str(path), *ctx.args]
        runpy.run_path(str(path), run_name="__main__")


def _register_export() -> None:
    from .cli_export import export

    main.add_command(export)


_register_export()
