"""The embedded default job: capture a small real model on CPU, drain it in another process,
and check every shard bit-exact against the model's own ``output_hidden_states=True``.

Nothing is downloaded: the model is a transformers Llama built from a config with seeded random
weights. The capture path is the product's own: forward hooks → Producer → shared-memory ring
→ ZeroMQ notices → ``hscapture drain`` (a separate process) → safetensors shards.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .adapters.transformers import CONVENTION, HiddenStateCapture
from .endpoint import default_endpoint
from .errors import HSCaptureError, SampleTimeoutError, ShardError
from .producer import Producer
from .progress import format_size
from .sample import layer_name
from .shard_check import verify_dir
from .reader import load_sample
from .shard_format import DEMO_MARKER
from .shard_index import read_index

__all__ = ["DemoResult", "run_demo", "tiny_llama", "MARKER", "is_demo_output",
           "clear_demo_output"]

log = logging.getLogger("hscapture.demo")

#: Written into the output directory first: marks it as the demo's, so ``--overwrite`` knows
#: what it may delete (only the demo's own files, never anything else).
MARKER = DEMO_MARKER
_DEMO_FILES = re.compile(r"^(shard-\d{5,}(\.safetensors|\.safetensors\.tmp|\.journal)"
                         r"|index\.jsonl|\.lock|" + re.escape(MARKER) + r")$")


def is_demo_output(out_dir: str | os.PathLike) -> bool:
    """Was ``out_dir`` written by the demo (it holds the demo's marker file)?"""
    return (Path(out_dir) / MARKER).is_file()


def clear_demo_output(out_dir: str | os.PathLike) -> list[str]:
    """Remove the files a previous demo run wrote into ``out_dir`` (shards, journals, index,
    lock, marker) and nothing else; returns the removed names. Raises :class:`ShardError`
    if ``out_dir`` is not a demo output (no marker): then nothing is removed."""
    out = Path(out_dir)
    if not is_demo_output(out):
        raise ShardError(f"{out} is not an output of `hscapture demo` (no {MARKER} file); "
                         f"expected a demo output directory, nothing was removed")
    removed = []
    for entry in sorted(out.iterdir(), key=lambda p: p.name == MARKER):   # marker last
        if _DEMO_FILES.match(entry.name) and entry.is_file() and not entry.is_symlink():
            entry.unlink()
            removed.append(entry.name)
    return removed


@dataclass
class DemoResult:
    samples: int
    tokens: int
    bytes: int
    exact: int
    mismatched: list[str]
    out_dir: str
    drain_returncode: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return (self.drain_returncode == 0 and not self.mismatched and not self.problems
                and self.exact == self.samples)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.bfloat16,
               layers: int = 6, hidden: int = 256) -> torch.nn.Module:
    """A small Llama-architecture causal LM with seeded random weights (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=4096, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=2048)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def run_demo(out_dir: str | os.PathLike, *, requests: int = 48, batch: int = 8,
             chunk_size: int = 64, aux_layers: tuple[int, ...] = (1, 2, 4), seed: int = 0,
             dtype: str = "bfloat16", log: bool = True) -> DemoResult:
    """Capture ``requests`` prompts and verify the drained shards; see the module docstring.

    Writes only into ``out_dir`` (created; the caller decides whether an existing one may be
    used: see :func:`clear_demo_output`). Progress goes to the ``hscapture.demo`` logger
    (INFO; nothing when ``log`` is False).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `hscapture demo`; --overwrite may delete this "
                              "directory's shards, index and this file\n")
    say = log_info if log else (lambda *a, **k: None)
    producer_id = f"demo-{os.getpid()}"
    endpoint = default_endpoint(producer_id)
    drain_cmd = [sys.executable, "-m", "hscapture", "drain", "--endpoint", endpoint,
                 "--out", str(out), "--samples", str(requests), "--connect-timeout", "60",
                 "--idle-timeout", "60", "--quiet"]
    say(f"model: tiny random Llama ({dtype}), capture layers {list(aux_layers)} + "
        f"final_norm, {requests} requests in batches of {batch}, chunks of {chunk_size} tokens")
    say(f"drain process: {' '.join(['hscapture', *drain_cmd[3:]])}")
    model = tiny_llama(seed, getattr(torch, dtype))
    g = torch.Generator().manual_seed(seed + 1)
    references: dict[str, dict[str, torch.Tensor]] = {}
    with Producer(endpoint, producer_id=producer_id, capacity=64 << 20, full_policy="wait",
                  wait_timeout_s=30.0, convention=CONVENTION,
                  model=f"tiny-random-llama(seed={seed})") as producer:
        drain = subprocess.Popen(drain_cmd)
        try:
            _wait_for_consumer(producer, drain)
            cap = HiddenStateCapture(model, producer, aux_layers)
            n_layers = len(model.model.layers)
            with torch.no_grad():
                # warm-up pass outside request(): must never become a sample
                model(torch.randint(0, 4096, (2, 16), generator=g))
                done = 0
                while done < requests:
                    b = min(batch, requests - done)
                    lens = torch.randint(8, 300, (b,), generator=g)
                    width = int(lens.max())
                    ids = torch.randint(0, 4096, (b + 1, width), generator=g)
                    mask = torch.zeros(b + 1, width, dtype=torch.long)
                    for i, n in enumerate(lens.tolist()):
                        mask[i, :n] = 1
                    mask[b, :5] = 1     # one unrequested row rides along: rid None
                    rids = [f"demo-{done + i:05d}" for i in range(b)] + [None]
                    with cap.request(rids, ids, mask, chunk_size=chunk_size):
                        hs = model(ids, attention_mask=mask, output_hidden_states=True)
                    for i, rid in enumerate(rids[:-1]):
                        idx = mask[i].nonzero().flatten()
                        ref = {layer_name(L, "residual"): hs.hidden_states[L + 1][i, idx].clone()
                               for L in aux_layers}
                        ref["final_norm"] = hs.hidden_states[n_layers][i, idx].clone()
                        ref["token_ids"] = ids[i, idx].to(torch.int32)
                        references[rid] = ref
                    done += b
            producer.flush()
            say(f"captured {requests} requests; producer stats: "
                f"captured={producer.stats().get('captured_rows', 0)} chunks "
                f"dropped={producer.stats().get('dropped', 0)}")
            drain.wait(timeout=300)
        finally:
            if drain.poll() is None:
                drain.terminate()
                drain.wait(timeout=30)
    return _verify(out, references, drain.returncode, say)


def log_info(msg: str) -> None:
    log.info("%s", msg)


def _wait_for_consumer(producer: Producer, drain: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not producer.wait_for_consumers(1, timeout_s=0.2):
        if drain.poll() is not None:
            raise HSCaptureError(f"the drain process exited early with code {drain.returncode}")
        if time.monotonic() > deadline:
            raise SampleTimeoutError(f"the drain process did not attach to the ring within {timeout:g} s")


def _verify(out: Path, references: dict[str, dict[str, torch.Tensor]], rc: int,
            say) -> DemoResult:
    index = read_index(out)
    report = verify_dir(out)
    exact, mismatched, tokens, nbytes = 0, [], 0, 0
    for rid, ref in references.items():
        if rid not in index:
            mismatched.append(f"{rid}: missing from the index")
            continue
        got = load_sample(out, rid)
        bad = [k for k, v in ref.items()
               if k not in got or got[k].dtype != v.dtype or not torch.equal(got[k], v)]
        if bad:
            mismatched.append(f"{rid}: differs in {bad}")
        else:
            exact += 1
            tokens += int(ref["token_ids"].numel())
            nbytes += sum(v.numel() * v.element_size() for k, v in got.items() if k != "token_ids")
    extra = sorted(set(index) - set(references))
    problems = list(report.get("problems", [])) + [f"unexpected sample {r}" for r in extra]
    res = DemoResult(samples=len(references), tokens=tokens, bytes=nbytes, exact=exact,
                     mismatched=mismatched, out_dir=str(out), drain_returncode=rc,
                     problems=problems)
    say(f"shards in {out}: {report.get('shards', '?')} shard(s), {len(index)} samples, "
        f"{tokens} tokens, {format_size(nbytes)} of hidden states")
    say(f"bit-exact vs output_hidden_states=True: {exact}/{len(references)}; "
        f"unrequested/warm-up samples: {len(extra)}; drain exit code {rc}")
    for line in mismatched + problems:
        if say is log_info:
            log.warning("problem: %s", line)
    return res
