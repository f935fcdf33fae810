"""Extract EAGLE-3 training data from a running SGLang server, the verifiable way.

The server (see docs/sglang.md) runs in capture-only mode with hscapture enabled::

    HSCAPTURE_ENABLE=1 python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct \\
        --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 \\
        --return-aux-hidden-state-layer-ids 1 15 28 --disable-radix-cache

This script reads a JSONL dataset (format: ``--help``), sends each row to ``/generate`` with an
explicit rid (``hscap-<id>``) and ``max_new_tokens: 0`` (prefill only), and writes every
captured sample into safetensors shards via the Subscriber and ShardWriter. A row's
``loss_mask`` (or one built from ``messages`` with ``--chat-template TOKENIZER``: 1 on assistant
tokens) travels with its request as ``sampling_params.custom_params.hscapture_loss_mask`` and
is stored with the sample as ``{rid}/field.loss_mask``. Each row's metadata (``row``: its line
number; plus the row's own keys named by ``--meta-fields``, e.g. ``id,split``) travels as
``custom_params.hscapture_meta`` and is stored as the sample's ``extra["meta"]``, which every
reader and both exports carry (docs/training.md).

    python examples/extract_eagle3.py data.jsonl out/ --server http://127.0.0.1:30000

What it guarantees:

* **Verified.** A sample is written only if its token ids are exactly the request's and its
  loss mask (when the row has one) and its metadata arrived bit for bit; anything else (dropped by the
  producer, incomplete, rejected, a failed request, no sample after the server answered) is
  listed by rid at the end and the exit code is 3.
* **Durable as it goes.** The shard writer is flushed every ``--flush-every`` samples or
  ``--flush-interval`` seconds, whichever comes first: a flushed sample survives a crash or
  SIGKILL (the next run's writer recovers it from the shard journal).
* **Stops cleanly.** SIGINT (Ctrl-C) or SIGTERM stops sending, finishes the open shard (every
  sample written so far becomes durable and indexed) and exits 130, without a traceback. A
  second signal abandons the open shard at once; what was flushed before is still recovered.
* **Resumes per sample.** A rerun into the same OUT skips every rid already in OUT (index, or
  a recovered journal) and requests exactly the others: nothing is written twice, nothing is
  skipped.

Why no durable subscription (``Subscriber(name=...)``, as ``hscapture drain`` uses): the drain
cannot ask for a sample again, so it must keep its place in the ring while it is away. This
client sends every request itself, so a sample it did not make durable is simply requested
again by the next run; a durable subscription would add nothing but would, while the client is
stopped, hold ring space on the server (and make the producer drop other consumers' samples)
until someone ran ``hscapture drain --unsubscribe``. Requests still in flight when it stops are
abandoned; their samples are not in OUT, so the rerun requests them.

(``--endpoint`` defaults to DP rank 0's default endpoint, ``hscapture endpoints``; repeat it
once per DP rank.) A dry run without a GPU: ``python tests/generate_standin.py ENDPOINT``
serves a tiny CPU model behind the same ``/generate`` API (see the README). Client side: the
standard library, hscapture, tqdm (optional) and, for ``--chat-template`` only, transformers.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import queue
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

EXIT_OK, EXIT_ERROR, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 0, 1, 3, 130
MASK_PARAM = "hscapture_loss_mask"   # hscapture.sglang.config: f"{DEFAULT_PARAM}_loss_mask"
META_PARAM = "hscapture_meta"        # hscapture.sglang.config.META_PARAM
ROW_KEY = "row"                      # the meta key every request carries: the line number

DATASET_FORMAT = """\
input (DATASET): JSON lines, one prompt per line, either already tokenized:
  {"id": "q17", "input_ids": [128000, 791, 6460, 374], "loss_mask": [0, 0, 1, 1]}
  [128000, 791, 6460, 374]          (a bare list: the line number is the id)
or a conversation, tokenized here with --chat-template TOKENIZER (loss mask: 1 on the
assistant turns' tokens, including their end-of-turn token; 0 elsewhere):
  {"id": "c3", "messages": [{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello!"}]}
`id` is optional (the line number is used); ids must be unique. `loss_mask` is optional:
one 0 or 1 per token (1 = trained on). A row with `input_ids` uses them as they are.
Each line becomes the sample with rid RID_PREFIX + id (e.g. hscap-q17).
Metadata: every sample's extra["meta"] holds "row" (the line's 0-based number) and, with
--meta-fields id,split, those keys of the row (when it has them; each named key must be in
some row). Values must be str, int, float, bool or null; at most 16 keys and 1 KiB of JSON.

output (OUT): a shard directory (safetensors shards + index.jsonl; `hscapture inspect OUT`).
Rerunning skips the ids already in OUT and requests only the others. Exit code 0: all written;
1: error; 3: some samples were dropped or incomplete (listed; rerun to retry them);
130: stopped by SIGINT/SIGTERM (what was written is kept; rerun to go on)."""


class DatasetError(Exception):
    """A dataset row (or the tokenizer that should read it) is unusable; the message names
    the line and what was expected."""


class PreflightError(Exception):
    """The server or the capture endpoint is not usable; the message says which and why."""


@dataclass
class Row:
    """One request to make: its rid, its prompt tokens and (optional) loss mask bytes."""

    rid: str
    input_ids: list[int]
    loss_mask: bytes | None = None
    #: ``custom_params.hscapture_meta`` (already checked by the meta rule)
    meta: dict[str, Any] | None = None


# -- the dataset ---------------------------------------------------------------------------


class ChatTemplateMask:
    """Tokenizes a ``messages`` conversation with a tokenizer's chat template and marks the
    assistant tokens (loss mask 1), from local files only (``from_pretrained(...,
    local_files_only=True)``: a hub name works once it is in the local cache).

    An assistant turn ``i`` spans, in the rendered text, from the end of
    ``render(messages[:i], add_generation_prompt=True)`` (the assistant header, mask 0) to the
    end of ``render(messages[:i+1])`` (content and end-of-turn, mask 1); a token is 1 if its
    characters overlap such a span. Templates that do not render conversations prefix by prefix
    (e.g. ones that rewrite earlier turns) are refused with :class:`DatasetError`, never
    guessed at. The token ids are those of ``apply_chat_template(messages, tokenize=True)``.
    """

    def __init__(self, name: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise DatasetError("--chat-template needs transformers (pip install transformers)") \
                from None
        try:
            self.tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise DatasetError(f"--chat-template {name}: cannot load a tokenizer from local "
                               f"files ({exc})") from None
        if not getattr(self.tok, "is_fast", False):
            raise DatasetError(f"--chat-template {name}: expected a fast tokenizer (one with "
                               f"offset mappings), found {type(self.tok).__name__}")
        if not getattr(self.tok, "chat_template", None):
            raise DatasetError(f"--chat-template {name}: the tokenizer has no chat template")
        self.name = name

    def _render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=generation_prompt)

    def __call__(self, messages: list[dict]) -> tuple[list[int], bytes]:
        """``(input_ids, loss_mask)`` of one conversation."""
        text = self._render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            head = self._render(messages[:i], generation_prompt=True)
            upto = self._render(messages[: i + 1])
            if not (text.startswith(upto) and upto.startswith(head)):
                raise DatasetError(
                    f"the chat template of {self.name} does not render this conversation "
                    f"prefix by prefix (turn {i} changes earlier text), so its assistant spans "
                    f"cannot be located: tokenize it yourself and pass input_ids + loss_mask")
            spans.append((len(head), len(upto)))
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = bytes(int(any(s < b and e > a for a, b in spans))
                     for s, e in enc["offset_mapping"])
        return [int(t) for t in enc["input_ids"]], mask


def _messages(value: Any, where: str) -> list[dict]:
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in value):
        raise DatasetError(f"{where}: messages: expected a non-empty list of "
                           f'{{"role": str, "content": str}}, found {str(value)[:80]}')
    return value


def read_dataset(path: Path, prefix: str, chat: Callable[[list[dict]], tuple[list[int], bytes]]
                 | None = None, meta_fields: Sequence[str] = ()) -> list[Row]:
    """Every row of ``path``, validated: unique ids, valid rids, non-empty integer token ids, a
    loss mask of one 0/1 per token, a meta (``row`` and the row's ``meta_fields``) that obeys
    the meta rule. Raises :class:`DatasetError` naming the first bad line (or a meta field no
    row has)."""
    from hscapture.errors import HSCaptureError
    from hscapture.notice import check_rid
    from hscapture.sglang.config import check_meta

    if ROW_KEY in meta_fields:
        raise DatasetError(f"--meta-fields: {ROW_KEY!r} is always sent (the line number); "
                           f"name the row's other keys")
    rows: list[Row] = []
    first_line: dict[str, int] = {}
    found: set[str] = set()
    with open(path) as f:
        for lineno, line in enumerate(f):
            where = f"{path}:{lineno + 1}"
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not JSON ({exc})") from None
            if isinstance(obj, list):
                obj = {"input_ids": obj}
            if not isinstance(obj, dict):
                raise DatasetError(f"{where}: expected an object or a list of token ids, "
                                   f"found {type(obj).__name__}")
            key = str(obj.get("id", lineno))
            rid = f"{prefix}{key}"
            try:
                check_rid(rid)
            except HSCaptureError as exc:
                raise DatasetError(f"{where}: id {key!r} makes an invalid rid: {exc}") from None
            if rid in first_line:
                raise DatasetError(f"{where}: id {key!r} repeats line {first_line[rid]}")
            first_line[rid] = lineno + 1
            meta = {ROW_KEY: lineno, **{k: obj[k] for k in meta_fields if k in obj}}
            found.update(k for k in meta_fields if k in obj)
            try:
                meta = check_meta(meta)
            except HSCaptureError as exc:
                raise DatasetError(f"{where}: --meta-fields: {exc}") from None
            mask = obj.get("loss_mask")
            if "input_ids" in obj:
                ids = obj["input_ids"]
                if not isinstance(ids, list) or not ids or not all(
                        type(t) is int and t >= 0 for t in ids):
                    raise DatasetError(f"{where}: input_ids: expected a non-empty list of "
                                       f"non-negative ints, found {str(ids)[:80]}")
            elif "messages" in obj:
                if chat is None:
                    raise DatasetError(f"{where}: a messages row needs --chat-template "
                                       f"TOKENIZER (or give input_ids)")
                if mask is not None:
                    raise DatasetError(f"{where}: a messages row gets its loss mask from the "
                                       f"chat template; drop its loss_mask or give input_ids")
                ids, built = chat(_messages(obj["messages"], where))
                rows.append(Row(rid, ids, built, meta))
                continue
            else:
                raise DatasetError(f"{where}: expected input_ids or messages, found keys "
                                   f"{sorted(obj)}")
            if mask is not None:
                if not isinstance(mask, list) or len(mask) != len(ids) or not all(
                        type(v) is int and v in (0, 1) for v in mask):
                    raise DatasetError(f"{where}: loss_mask: expected {len(ids)} values of 0 or "
                                       f"1 (one per token), found {str(mask)[:80]}")
                mask = bytes(mask)
            rows.append(Row(rid, ids, mask, meta))
    missing = [k for k in meta_fields if k not in found]
    if missing:
        raise DatasetError(f"{path}: --meta-fields {','.join(missing)}: expected in some row, "
                           f"found in none (row keys are case-sensitive)")
    return rows


# -- the server ----------------------------------------------------------------------------


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def request_body(row: Row, max_new_tokens: int) -> dict:
    """The ``/generate`` body of ``row``: explicit rid, prefill only, the loss mask (if any) and
    the metadata (if any) in ``custom_params`` where the hscapture SGLang hook reads them."""
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": 0}
    custom: dict[str, Any] = {}
    if row.loss_mask is not None:
        custom[MASK_PARAM] = list(row.loss_mask)
    if row.meta:
        custom[META_PARAM] = row.meta
    if custom:
        params["custom_params"] = custom
    return {"rid": row.rid, "input_ids": row.input_ids, "sampling_params": params}


def preflight(server: str, endpoints: list[str], timeout_s: float = 5.0) -> None:
    """Check once, before anything is written or sent, that the server answers ``/health``
    and that a producer listens on every endpoint. Raises :class:`PreflightError` with one
    message naming what is missing and how to fix it."""
    from hscapture.endpoint import check_endpoint, probe_endpoint
    from hscapture.errors import EndpointError

    url = server.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code not in (404, 405, 501):     # reachable, just no /health route: fine
            raise PreflightError(f"the server at {server} is not healthy: GET /health "
                                 f"answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PreflightError(
            f"no server at {server} ({reason}): start SGLang as in docs/sglang.md, or the CPU "
            f"stand-in for a dry run (python tests/generate_standin.py ENDPOINT), and pass "
            f"--server") from None
    problems = []
    for ep in endpoints:
        try:
            check_endpoint(ep, allow_inproc=False)
        except EndpointError as exc:
            raise PreflightError(str(exc)) from None
        why = probe_endpoint(ep, timeout_s=timeout_s)
        if why:
            problems.append(f"{ep}: {why}")
    if problems:
        raise PreflightError(
            "the server is up but no hscapture producer listens on " + "; ".join(problems)
            + ". Is the server started with HSCAPTURE_ENABLE=1 (docs/sglang.md)? "
            "`hscapture endpoints --live` lists the producers running on this machine")


class Senders:
    """``concurrency`` daemon threads that post the rows in order until they run out or
    ``stop`` is set. Each answer lands in :attr:`answers` as ``(rid, error or None)``. Daemon
    threads: a request still in flight when the client exits is abandoned, never waited on."""

    def __init__(self, url: str, rows: list[Row], concurrency: int, timeout_s: float,
                 max_new_tokens: int, stop: threading.Event) -> None:
        self.answers: queue.SimpleQueue[tuple[str, str | None]] = queue.SimpleQueue()
        self._todo: queue.SimpleQueue[Row] = queue.SimpleQueue()
        for r in rows:
            self._todo.put(r)
        self._args = url, timeout_s, max_new_tokens, stop
        for i in range(concurrency):
            threading.Thread(target=self._run, name=f"extract-send-{i}", daemon=True).start()

    def _run(self) -> None:
        url, timeout_s, max_new_tokens, stop = self._args
        while not stop.is_set():
            try:
                row = self._todo.get_nowait()
            except queue.Empty:
                return
            try:
                post(url, request_body(row, max_new_tokens), timeout_s)
                self.answers.put((row.rid, None))
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.answers.put((row.rid, f"request failed: {exc}"))


# -- signals -------------------------------------------------------------------------------


class StopOnSignal:
    """SIGINT/SIGTERM set :attr:`event` (the run stops cleanly); a second one raises
    KeyboardInterrupt (abandon the open shard). :meth:`restore` puts the old handlers back."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal = ""
        self._previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in self._previous:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        self.event.set()

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)


# -- the run -------------------------------------------------------------------------------


def _size(text: str) -> int:
    from hscapture.cli import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=DATASET_FORMAT,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", type=Path, help="JSONL file of tokenized prompts or of conversations (format below)")
    ap.add_argument("out", type=Path, help="shard directory to write (created; resumed)")
    ap.add_argument("--server", default="http://127.0.0.1:30000",
                    help="SGLang server URL (default: %(default)s)")
    ap.add_argument("--endpoint", action="append", default=None,
                    help="producer endpoint, once per DP rank (default: DP rank 0's default "
                         "endpoint, as printed by `hscapture endpoints`)")
    ap.add_argument("--rid-prefix", default="hscap-",
                    help="must match the server's HSCAPTURE_RID_PREFIX (default: %(default)s)")
    ap.add_argument("--chat-template", "--chat-template-spans", metavar="TOKENIZER",
                    default=None,
                    help="tokenize `messages` rows with this tokenizer's chat template (a "
                         "local directory, or a hub name already in the local cache; nothing "
                         "is downloaded) and set loss_mask = 1 on assistant tokens")
    ap.add_argument("--meta-fields", default="", metavar="KEYS",
                    help="comma-separated row keys (e.g. id,split) sent with each request as "
                         "its metadata, besides the line number (stored as the sample's "
                         "extra['meta'])")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="requests in flight (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=0,
                    help="0: prefill only (default); 1 if your deployment rejects 0")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds to wait for each request's answer (default: %(default)s)")
    ap.add_argument("--sample-timeout", type=float, default=60.0,
                    help="seconds to wait for a sample after the server answered its request "
                         "(default: %(default)s)")
    ap.add_argument("--flush-every", type=int, default=64, metavar="N",
                    help="make written samples durable every N samples (default: %(default)s)")
    ap.add_argument("--flush-interval", type=float, default=5.0, metavar="SECONDS",
                    help="... or every SECONDS, whichever comes first (default: %(default)s)")
    ap.add_argument("--shard-size", type=_size, default="2G",
                    help="maximum size of one shard file, e.g. 512M or 2G (default: 2G)")
    ap.add_argument("--compress", choices=("zstd", "fp8"), default=None,
                    help="compact storage of the hidden states (default: none): zstd = "
                         "lossless (pip install 'hscapture[compress]'), fp8 = lossy FP8 e4m3 "
                         "with per-token scales; every hscapture reader and export decodes it")
    args = ap.parse_args(argv)
    if (args.concurrency < 1 or args.timeout <= 0 or args.max_new_tokens < 0
            or args.sample_timeout <= 0 or args.flush_every < 1 or args.flush_interval <= 0):
        ap.error("--concurrency and --flush-every must be >= 1, --max-new-tokens >= 0, and "
                 "--timeout, --sample-timeout and --flush-interval > 0")
    args.meta_fields = [k.strip() for k in args.meta_fields.split(",") if k.strip()]
    if args.endpoint is None:
        from hscapture.endpoint import default_endpoint

        args.endpoint = [default_endpoint("sglang-dp0")]
    return args


def say(text: str) -> None:
    print(f"extract_eagle3: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the extraction; returns the exit code (0, 1, 3 or 130, see ``--help``)."""
    stop = StopOnSignal()       # first: a signal from here on stops cleanly
    try:
        return _main(argv, stop)
    except KeyboardInterrupt:   # a second signal (or Ctrl-C before the handlers existed)
        say("interrupted again: stopped at once; samples flushed before are kept and the "
            "next run recovers them")
        return EXIT_INTERRUPTED
    finally:
        stop.restore()


def _main(argv: list[str] | None, stop: StopOnSignal) -> int:
    args = parse_args(argv)
    try:
        chat = ChatTemplateMask(args.chat_template) if args.chat_template else None
        rows = read_dataset(args.dataset, args.rid_prefix, chat, args.meta_fields)
        if stop.event.is_set():
            say(f"interrupted by {stop.signal} before anything was sent")
            return EXIT_INTERRUPTED
        preflight(args.server, args.endpoint)
    except (DatasetError, PreflightError, OSError) as exc:
        say(f"error: {exc}")
        return EXIT_ERROR

    from hscapture.errors import SampleTimeoutError, ShardError
    from hscapture.shards import SampleRefusedError, ShardWriter

    metadata = {"source": "sglang", "dataset": str(args.dataset)}
    if chat is not None:
        metadata["loss_mask_from"] = f"chat template of {args.chat_template}: assistant tokens"
    try:
        writer = ShardWriter(args.out, max_shard_bytes=args.shard_size, metadata=metadata,
                             compression=args.compress)
    except ShardError as exc:
        say(f"error: {exc}")
        return EXIT_ERROR
    todo = [r for r in rows if not writer.seen(r.rid)]
    before = len(rows) - len(todo)
    say(f"{len(todo)} samples to extract ({before} already in {args.out})")
    if not todo:
        writer.close()
        return EXIT_OK

    from hscapture import Subscriber

    by_rid = {r.rid: r for r in todo}
    pending = set(by_rid)                 # requested or to request, not yet resolved
    failed: dict[str, str] = {}
    durable = 0
    error: str | None = None
    # Not durable (no name): see the module docstring. Attach before sending anything: a
    # subscriber sees every record reserved after it attached.
    sub = Subscriber(args.endpoint, rid_filter=pending.__contains__)
    bar = Progress(len(todo), args.out)
    try:
        deadline = time.monotonic() + 60
        while not stop.event.is_set():
            try:
                sub.wait_ready(timeout=0.2, producers=len(args.endpoint))
                break
            except SampleTimeoutError:
                if time.monotonic() > deadline:
                    raise
        for r in todo:
            sub.expect(r.rid, len(r.input_ids))   # any other token count is rejected
        senders = Senders(args.server.rstrip("/") + "/generate", todo, args.concurrency,
                          args.timeout, args.max_new_tokens, stop.event)
        answered: collections.deque[tuple[float, str]] = collections.deque()  # answer order
        reported = dict.fromkeys(("dropped", "incomplete", "rejected"), 0)
        unflushed, last_flush = 0, time.monotonic()
        while pending and not stop.event.is_set():
            sample = sub.poll(timeout=0.1)
            if sample is not None:
                with sample:                      # released once written (or refused)
                    if sample.rid in pending:     # else: a second capture of a done rid
                        pending.discard(sample.rid)
                        why = _check(sample, by_rid[sample.rid])
                        if why is None:
                            try:
                                writer.add(sample)
                                unflushed += 1
                            except SampleRefusedError as exc:
                                why = f"the shard writer refused it: {exc}"
                        if why is not None:
                            failed[sample.rid] = why
                        bar(1)
            while True:
                try:
                    rid, err = senders.answers.get_nowait()
                except queue.Empty:
                    break
                if err is None:
                    answered.append((time.monotonic(), rid))
                elif rid in pending:
                    pending.discard(rid)
                    failed[rid] = err
                    bar(1)
            for kind, done in reported.items():   # the subscriber's reports, new ones only
                report = getattr(sub, kind)
                if len(report) != done:
                    reported[kind] = len(report)
                    for rid, why in itertools.islice(report.items(), done, None):
                        if rid in pending:
                            pending.discard(rid)
                            failed[rid] = f"{kind}: {why}"
                            bar(1)
            now = time.monotonic()
            while answered and now - answered[0][0] > args.sample_timeout:
                rid = answered.popleft()[1]
                if rid in pending:
                    pending.discard(rid)
                    failed[rid] = (f"the server answered but no sample arrived within "
                                   f"{args.sample_timeout:g} s (is the rid prefix the "
                                   f"server's HSCAPTURE_RID_PREFIX, and the endpoint right?)")
                    bar(1)
            if unflushed and (unflushed >= args.flush_every
                              or now - last_flush >= args.flush_interval):
                durable += len(writer.flush())
                unflushed, last_flush = 0, now
                bar.durable(before + durable)
    except SampleTimeoutError as exc:
        error = f"{exc}; is the server started with HSCAPTURE_ENABLE=1?"
    except ShardError as exc:
        error = str(exc)
    finally:
        try:
            durable += len(writer.close())
        except ShardError as exc:
            error = error or str(exc)
        bar.close()
        sub.close()

    for rid, why in sorted(failed.items()):
        print(f"FAILED {rid}: {why}", file=sys.stderr)
    left = len(todo) - durable
    summary = (f"{durable} samples written and durable ({before + durable} of {len(rows)} in "
               f"{args.out})")
    if error is not None:
        say(f"error: {error}")
        say(f"{summary}; {left} not written: fix the cause and rerun the same command, it "
            f"requests exactly those")
        return EXIT_ERROR
    if stop.event.is_set():
        say(f"interrupted by {stop.signal}: {summary}; {left} not written: rerun the same "
            f"command to request exactly those")
        return EXIT_INTERRUPTED
    say(f"{summary}; {len(failed)} failed (rerun to retry them: done rids are skipped)")
    return EXIT_INCOMPLETE if failed else EXIT_OK


def _check(sample: Any, row: Row) -> str | None:
    """Why ``sample`` must not be written for ``row`` (None: it is exactly what was asked)."""
    if sample.token_ids.tolist() != row.input_ids:
        return "its token ids differ from the request's"
    if row.loss_mask is not None:
        got = sample.fields.get("loss_mask")
        if got is None:
            return ("it arrived without its loss_mask: the server's hscapture hook did not "
                    "attach custom_params.hscapture_loss_mask (an older hscapture, or fields "
                    "turned off?)")
        if got.numpy().tobytes() != row.loss_mask:
            return "its loss_mask differs from the one sent"
    if row.meta:
        got_meta = sample.extra.get("meta")
        if got_meta is None:
            why = sample.extra.get("meta_error")
            return (f"it arrived without its metadata: the server's hook refused it ({why})"
                    if why else "it arrived without its metadata: the server's hscapture hook "
                    "did not attach custom_params.hscapture_meta (an older hscapture?)")
        if got_meta != row.meta:
            return f"its metadata {got_meta} differs from the one sent {row.meta}"
    return None


class Progress:
    """A tqdm bar on a terminal; otherwise one plain line each time samples become durable."""

    def __init__(self, total: int, out: Path) -> None:
        self.total, self.out, self.bar = total, out, None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="sample")
            except ImportError:  # pragma: no cover
                pass

    def __call__(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def durable(self, count: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix(durable=count)
        else:
            say(f"{count} samples durable in {self.out}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


if __name__ == "__main__":
    sys.exit(main())
