"""Compact storage: none vs zstd vs fp8 — bytes per token, write and read GB/s, fp8 error.

    python benchmarks/bench_compact.py --out compact.json                     # random-weight Llama
    python benchmarks/bench_compact.py --model /path/to/local/model --out compact.json

Input: the hidden states of a transformers model run on prompts (``output_hidden_states``):
residual layers ``--aux`` (default: EAGLE-3's three: 1, N/2, N-3), the last decoder layer and
the final norm, in bf16. With ``--model`` a local checkpoint (local files only, nothing is
downloaded; a trained model's activations are what compression should be judged on); without
it a random-weight Llama of the ``make_llama.py`` kind at ``--hidden``/``--layers`` (random
weights compress differently from trained ones: the JSON and the README say which one ran).
Prompts are random token ids, so the activations are those of the model, not of a corpus.

Per repetition each method (none / zstd / fp8; the order rotates, ``_stats.run_alternating``)
writes every sample into a fresh directory with ``ShardWriter(compression=...)`` and then reads
every sample back through ``hscapture.reader.open_shards`` (every layer, token ids, fields).
Reported, median and min–max over ``--reps`` repetitions after one warm-up: write GB/s and read
GB/s of *logical* bytes (hidden states as captured), stored bytes per token (shard files /
tokens) and the compression ratio. For fp8, per layer: max-abs error, max relative error over
elements in e4m3's normal range after scaling, and the relative RMS error, against the bf16
originals (computed once, outside the timed region).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _stats  # noqa: E402

METHODS = ("none", "zstd", "fp8")


def build_model(a: argparse.Namespace):
    """(model, description) — a local checkpoint, or a random-weight Llama."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if a.model:
        model = AutoModelForCausalLM.from_pretrained(a.model, local_files_only=True,
                                                     torch_dtype=torch.bfloat16)
        return model.eval(), {"kind": "trained (local checkpoint)", "path": a.model}
    heads = max(1, a.hidden // 64)
    cfg = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.hidden * 4,
                      num_hidden_layers=a.layers, num_attention_heads=heads,
                      num_key_value_heads=max(1, heads // 4), head_dim=a.hidden // heads,
                      vocab_size=a.vocab, max_position_embeddings=max(2048, a.tokens),
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model.eval(), {"kind": "random weights (LlamaConfig, seeded)", "hidden": a.hidden,
                          "layers": a.layers, "vocab": a.vocab, "seed": a.seed}


def capture(model, a: argparse.Namespace) -> list:
    """Samples of ``a.samples`` prompts of ``a.tokens`` tokens: aux layers, the last layer
    (pre-norm) and the final norm, bf16, straight from ``output_hidden_states``."""
    from hscapture.sample import Sample, layer_name

    n_layers = model.config.num_hidden_layers
    aux = a.aux or sorted({1, n_layers // 2, max(0, n_layers - 3)})
    layers = [*aux, n_layers - 1, n_layers - 1]
    kinds = ["residual"] * (len(aux) + 1) + ["final_norm"]
    g = torch.Generator().manual_seed(a.seed + 1)
    vocab = model.config.vocab_size
    out = []
    # transformers puts the final norm's output last in ``hidden_states`` (hs[n_layers] is
    # post-norm), so the last decoder layer's own (pre-norm) output is taken by a hook on it:
    # until 2026-12-06 the "last layer" here was the final norm a second time
    last: list[torch.Tensor] = []
    hook = model.model.layers[-1].register_forward_hook(
        lambda _m, _i, o: last.append(o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            for i in range(0, a.samples, a.batch):
                b = min(a.batch, a.samples - i)
                ids = torch.randint(3, vocab, (b, a.tokens), generator=g)
                last.clear()
                hs = model(ids, output_hidden_states=True).hidden_states
                for r in range(b):
                    tensors = {layer_name(l, k): _layer_output(hs, last[-1], l, k, n_layers)[r]
                               .to(torch.bfloat16).contiguous() for l, k in zip(layers, kinds)}
                    out.append(Sample(
                        rid=f"bench-{i + r:06d}", producer_id="bench", epoch=1,
                        num_tokens=a.tokens, token_ids=ids[r].to(torch.int32), tensors=tensors,
                        layers=layers, layer_kinds=kinds, dtype="bfloat16",
                        hidden=model.config.hidden_size,
                        fields={"loss_mask": torch.ones(a.tokens, dtype=torch.uint8)}))
    finally:
        hook.remove()
    return out


def _layer_output(hs: tuple, last: torch.Tensor, layer: int, kind: str,
                  n_layers: int) -> torch.Tensor:
    """Decoder layer ``layer``'s output (``hs[layer + 1]``, except the last layer's, which
    transformers replaces by the final norm's: ``last``, from the hook), or the final norm's."""
    if kind == "final_norm":
        return hs[-1]
    return last if layer == n_layers - 1 else hs[layer + 1]


def dir_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if f.endswith(".safetensors"))


def fp8_errors(samples: list, d: str) -> dict:
    """Per layer name: max-abs, max relative (normal range), relative RMS error of fp8."""
    from hscapture.reader import open_shards

    ss = open_shards(d)
    acc: dict[str, dict[str, float]] = {}
    for s in samples:
        got = ss.get(s.rid)
        for name, x in s.tensors.items():
            xf, yf = x.float(), got.tensors[name].float()
            err = (yf - xf).abs()
            scale = xf.abs().amax(1, keepdim=True) / 448
            normal = (xf.abs() >= 2 ** -6 * scale) & (xf.abs() > 0)
            rel = (err[normal] / xf.abs()[normal]).max().item() if normal.any() else 0.0
            e = acc.setdefault(name, {"max_abs": 0.0, "max_rel_normal_range": 0.0,
                                      "sq_err": 0.0, "sq_ref": 0.0, "max_abs_value": 0.0})
            e["max_abs"] = max(e["max_abs"], err.max().item())
            e["max_rel_normal_range"] = max(e["max_rel_normal_range"], rel)
            e["sq_err"] += float((err.double() ** 2).sum())
            e["sq_ref"] += float((xf.double() ** 2).sum())
            e["max_abs_value"] = max(e["max_abs_value"], xf.abs().max().item())
    return {name: {"max_abs": e["max_abs"], "max_rel_normal_range": e["max_rel_normal_range"],
                   "rel_rms": (e["sq_err"] / e["sq_ref"]) ** 0.5 if e["sq_ref"] else 0.0,
                   "max_abs_value": e["max_abs_value"]} for name, e in acc.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="local transformers checkpoint (no download)")
    ap.add_argument("--hidden", type=int, default=1024, help="random model: hidden size")
    ap.add_argument("--layers", type=int, default=8, help="random model: decoder layers")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--aux", type=int, nargs="*", default=None, help="aux residual layers")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--level", type=int, default=1, help="zstd level (default: the writer's, 1)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fsync", action="store_true", help="fsync shards (default: off)")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                    help="scratch directory (default /dev/shm: the codecs' CPU cost, not a disk)")
    ap.add_argument("--out", default=None, help="JSON record")
    a = ap.parse_args()
    if a.reps < 5:
        print(f"note: --reps {a.reps} < 5: the figures are a code-path check only", flush=True)

    from hscapture.reader import open_shards
    from hscapture.shard_check import verify_dir
    from hscapture.shards import ShardWriter

    t0 = time.perf_counter()
    model, model_info = build_model(a)
    samples = capture(model, a)
    del model
    print(f"captured {len(samples)} samples x {a.tokens} tokens in "
          f"{time.perf_counter() - t0:.1f} s ({model_info['kind']})", flush=True)
    tokens = sum(s.num_tokens for s in samples)
    logical = sum(s.nbytes for s in samples)
    root = tempfile.mkdtemp(prefix="hsc-compact-", dir=a.dir)
    fs = _stats.fs_info(root)

    def method(name: str):
        comp = None if name == "none" else name
        level = a.level if name == "zstd" else None

        def run(rep: int) -> dict:
            d = os.path.join(root, f"{name}-{rep}")
            shutil.rmtree(d, ignore_errors=True)
            t0 = time.perf_counter()
            with ShardWriter(d, fsync=a.fsync, compression=comp, compression_level=level,
                             max_shard_bytes=512 << 20) as w:
                for s in samples:
                    w.add(s)
            tw = time.perf_counter() - t0
            stored = dir_bytes(d)
            data = verify_dir(d)["stored_bytes"]       # tensor data only (no header padding)
            t0 = time.perf_counter()
            ss = open_shards(d)
            n = 0
            for i in range(len(ss)):
                got = ss[i]
                for t in got.tensors.values():   # touch every 4 KiB page: bytes really read
                    t.reshape(-1).view(torch.uint8)[::4096].sum()
                    n += t.numel()
            tr = time.perf_counter() - t0
            assert n * 2 == logical, (n, logical)
            shutil.rmtree(d, ignore_errors=True)
            return {"write_s": tw, "read_s": tr, "stored_bytes": stored,
                    "write_gb_s": logical / tw / 1e9, "read_gb_s": logical / tr / 1e9,
                    "bytes_per_token": stored / tokens, "data_bytes_per_token": data / tokens}
        return run

    try:
        runs, order = _stats.run_alternating({m: method(m) for m in METHODS}, reps=a.reps,
                                             warmup=1)
        results: dict = {"model": model_info, "samples": len(samples), "tokens": tokens,
                         "logical_bytes": logical, "layers": list(samples[0].tensors),
                         "hidden": samples[0].hidden, "dtype": "bfloat16", "order": order,
                         "scratch": fs, "zstd_level": a.level, "methods": {}}
        base = _stats.median([r["bytes_per_token"] for r in runs["none"]])
        for m in METHODS:
            rs = runs[m]
            results["methods"][m] = {
                "bytes_per_token": _stats.summarize([r["bytes_per_token"] for r in rs]),
                "stored_vs_none": _stats.median([r["bytes_per_token"] for r in rs]) / base,
                "data_bytes_per_token": _stats.median([r["data_bytes_per_token"] for r in rs]),
                "write_gb_s": _stats.summarize([r["write_gb_s"] for r in rs]),
                "read_gb_s": _stats.summarize([r["read_gb_s"] for r in rs]),
                "runs": rs}
            mm = results["methods"][m]
            print(f"{m:5s}: {mm['bytes_per_token']['median']:.0f} B/token in files "
                  f"({mm['stored_vs_none']:.3f} of none; tensor data "
                  f"{mm['data_bytes_per_token']:.0f} B/token); write "
                  f"{_stats.fmt_spread(mm['write_gb_s'])} GB/s; read "
                  f"{_stats.fmt_spread(mm['read_gb_s'])} GB/s (logical)", flush=True)
        d = os.path.join(root, "fp8-errors")
        with ShardWriter(d, fsync=False, compression="fp8") as w:
            for s in samples:
                w.add(s)
        results["fp8_error"] = fp8_errors(samples, d)
        for name, e in results["fp8_error"].items():
            print(f"fp8 {name:12s}: max-abs {e['max_abs']:.4g} (|x| up to "
                  f"{e['max_abs_value']:.4g}), max rel (normal range) "
                  f"{e['max_rel_normal_range']:.4g}, rel RMS {e['rel_rms']:.4g}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.out:
        region = _stats.timed_region(
            inside=["write: ShardWriter creation, add() of every sample (encoding included), "
                    "close() (headers, renames, index)",
                    "read: open_shards (index read) + every sample loaded by position, every "
                    "layer decoded, token ids and fields, one byte per 4 KiB page of every "
                    "layer touched (uncompressed layers are memory-mapped)"],
            outside=["model forward and capture (samples are in memory before)",
                     "directory removal between runs", "fp8 error computation"],
            clock="time.perf_counter, write and read timed separately")
        _stats.write_record(
            a.out, benchmark="bench_compact", timed_regions={m: region for m in METHODS},
            results=results,
            config={k: v for k, v in vars(a).items()},
            notes=[f"activations of a {model_info['kind']} model"
                   + ("; random weights compress differently from trained ones"
                      if not a.model else ""),
                   "GB/s counts logical bytes (hidden states as captured, bf16)",
                   "bytes_per_token counts the whole shard files (headers, token ids, fields, "
                   "fp8 scales) over all tokens"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
