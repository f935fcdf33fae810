"""``hscapture export``: shards → a trainer's on-disk layout (registered in :mod:`hscapture.cli`
with ``main.add_command(export)``)."""

from __future__ import annotations

import json

import click

from ._cli_failure import Refusal, describe, json_error_too

__all__ = ["export"]


def _layers(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"expected layer ids like 1,15,28, found {value!r}") from None


@click.command("export")
@click.option("--format", "-f", "fmt", type=click.Choice(["specforge", "speculators"]),
              required=True, help="Trainer layout to write.")
@click.argument("shard_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--layers", callback=_layers, default=None,
              help="Aux layers as hscapture ids (output of decoder layer L), e.g. 1,15,28; "
                   "default: every captured residual layer except the last decoder layer.")
@click.option("--loss-mask", type=click.Choice(["require", "all"]), default="require",
              show_default=True,
              help="require: fail if a sample has no stored loss_mask; all: such samples "
                   "train on every token (recorded in the export's manifest).")
@click.option("--num-layers", type=click.IntRange(min=1), default=None,
              help="The model's number of decoder layers, for shards that do not record it "
                   "(no final_norm captured); one the shards contradict is refused.")
@click.option("--gzip", "gz", is_flag=True,
              help="SpecForge: write data_{i}.ckpt.gz (gzip level 6, as SpecForge reads "
                   "them) instead of data_{i}.ckpt.")
@click.option("--no-crc", "no_crc", is_flag=True,
              help="SpecForge .ckpt: write every zip record's CRC-32 as 0, as torch.save does "
                   "under torch.serialization.set_crc32_options(False): one pass over the "
                   "data less; torch.load (SpecForge) reads them, zip tools report CRC errors.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in OUT instead of "
                                                 "resuming it.")
@click.option("--allow-mixed-models", "mixed_models", is_flag=True,
              help="Export samples captured from different models (refused by default: a "
                   "trainer takes them as one verifier's); for the same weights under two "
                   "names.")
@click.option("--no-fsync", is_flag=True, help="Do not fsync each file (scratch data).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Reader/writer threads (default 4).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def export(fmt: str, shard_dir: str, out: str, layers: list[int] | None, loss_mask: str,
           num_layers: int | None, gz: bool, no_crc: bool, overwrite: bool,
           mixed_models: bool, no_fsync: bool,
           workers: int | None, quiet: bool, as_json: bool) -> None:
    """Export the samples of SHARD_DIR to OUT in SpecForge's or speculators' layout.

    Resumable: rerunning skips complete files and rewrites partial ones. Refuses (exit 2)
    when the captured layers or the loss masks cannot produce what the trainer needs; exits
    1 when a write failed (a full disk: every file in place is complete) and 130 when
    interrupted (Ctrl-C): rerun to resume.
    """
    from .export import ExportError, ExportWriteError, export as run_export

    try:
        r = json_error_too(as_json, lambda: run_export(
            shard_dir, out, fmt, layers=layers, loss_mask=loss_mask, num_layers=num_layers,
            progress=not quiet, overwrite=overwrite, fsync=not no_fsync, workers=workers,
            gzip=gz, mixed_models=mixed_models, crc32=not no_crc))
    except KeyboardInterrupt:
        click.echo(f"hscapture: export to {out} interrupted: every file in place is complete; "
                   f"rerun to resume", err=True)
        raise SystemExit(130) from None
    except ExportWriteError:
        raise                   # hscapture: error: ..., exit 1 (cli._Group, --debug: traceback)
    except ExportError as e:
        raise Refusal(describe(e)) from e
    if as_json:
        click.echo(json.dumps(r.as_dict()))
        return
    lm = r.loss_mask
    click.echo(f"{r.format}: {r.samples} samples ({r.written} written, {r.skipped} already "
               f"complete, {r.rewritten} partial rewritten), {r.tokens} tokens, "
               f"{r.bytes_written / 1e9:.3f} GB in {r.seconds:.1f} s "
               f"({r.gb_per_s:.2f} GB/s) -> {r.out_dir}")
    click.echo(f"loss mask: {lm['stored']} stored, {lm['all_ones']} all-ones ({lm['mode']})")
    if not r.manifest.get("values_exact", True):
        click.echo("note: " + r.manifest["conventions"]["values"])
    hint = r.manifest.get("trainer_settings", {})
    if hint:
        # as they are pasted: a flag and its values for the command line, a config key as
        # its YAML line
        click.echo("trainer settings:")
        for k, v in hint.items():
            if k.startswith("--"):
                click.echo(f"  {k} " + " ".join(map(str, v if isinstance(v, list) else [v])))
            else:
                click.echo(f"  {k}: {json.dumps(v)}")
