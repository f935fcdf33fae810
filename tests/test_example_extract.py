"""examples/extract_eagle3.py end to end, as real processes, against the stand-in /generate
server (tests/generate_standin.py: the real capture path, a tiny model on the CPU): samples and
loss masks arrive bit-exact, a stop by SIGTERM/SIGINT finishes the open shard and exits 130
without a traceback, a SIGKILL keeps every flushed sample, and a rerun requests exactly the
rids not yet in the output directory."""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from hscapture.demo import tiny_llama
from hscapture.shard_check import verify_dir
from hscapture.shards import ShardWriter, load_sample, read_index

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
EXAMPLE = ROOT / "examples" / "extract_eagle3.py"


class StandIn:
    """One stand-in server process with its own ipc endpoint and request log."""

    def __init__(self, tmp_path: Path, name: str, delay_s: float = 0.0, *extra: str) -> None:
        self.sock_dir = Path(tempfile.mkdtemp(prefix="hsc-ex-", dir="/tmp"))
        self.endpoint = f"ipc://{self.sock_dir}/standin.sock"
        self.log = tmp_path / f"{name}.requests"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "generate_standin.py"), self.endpoint,
             "--delay-s", str(delay_s), "--request-log", str(self.log), *extra],
            stdout=subprocess.PIPE, text=True, cwd=tmp_path)
        self._port: int | None = None

    @property
    def url(self) -> str:
        if self._port is None:      # the server prints "PORT <n>" once it serves
            line = self.proc.stdout.readline()
            assert line.startswith("PORT "), f"the stand-in did not start: {line!r}"
            self._port = int(line.split()[1])
        return f"http://127.0.0.1:{self._port}"

    def requested(self) -> list[str]:
        """The rids it received, in order (each request is logged once when computed)."""
        return self.log.read_text().split() if self.log.exists() else []

    def close(self) -> None:
        self.proc.terminate()       # the stand-in closes its producer (and ring) on SIGTERM
        self.wait()

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.sock_dir, ignore_errors=True)


@pytest.fixture
def standins(tmp_path):
    made: list[StandIn] = []

    def start(name: str, delay_s: float = 0.0, *extra: str) -> StandIn:
        made.append(StandIn(tmp_path, name, delay_s, *extra))
        return made[-1]
    yield start
    for s in made:                  # all at once: each takes a moment to close its producer
        s.proc.terminate()
    for s in made:
        s.wait()


class Running:
    """The example as a running process; its stderr is collected line by line."""

    DURABLE = re.compile(r"(\d+) samples durable in ")

    def __init__(self, cmd: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.eof = False
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def durable(self) -> int:
        found = [int(m.group(1)) for m in map(self.DURABLE.search, self.lines) if m]
        return max(found, default=0)

    def wait_durable(self, count: int, timeout: float = 60.0) -> int:
        """Block until the example reports at least ``count`` samples durable."""
        with self.cond:
            self.cond.wait_for(lambda: self.eof or self.durable() >= count, timeout)
            assert self.durable() >= count, "".join(self.lines)
            assert not self.eof, "the example finished before it could be stopped"
            return self.durable()

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=timeout)
        return rc, "".join(self.lines)


def make_rows(n: int, seed: int, *, masks: bool = True) -> list[dict]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        length = rnd.randint(3, 40)
        row = {"id": f"q{i}", "input_ids": [rnd.randrange(4096) for _ in range(length)]}
        if masks and i % 3 != 2:       # every third row without a mask
            row["loss_mask"] = [rnd.randint(0, 1) for _ in range(length)]
        rows.append(row)
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def example_cmd(data: Path, out: Path, server: StandIn, *extra: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), str(data), str(out), "--server", server.url,
            "--endpoint", server.endpoint, "--concurrency", "4", "--timeout", "60", *extra]


def index_lines(out: Path) -> list[str]:
    return [json.loads(line)["rid"] for line in (out / "index.jsonl").read_text().splitlines()]


def assert_exact(out: Path, rows: list[dict]) -> None:
    """Every row is in ``out`` exactly once, bit for bit as the model computes it, with its
    loss mask (and no mask where the row had none); the directory verifies clean."""
    rids = index_lines(out)
    assert sorted(rids) == sorted(f"hscap-{r['id']}" for r in rows), "missing or duplicated"
    assert verify_dir(out)["problems"] == []
    assert not list(out.glob("*.tmp")) and not list(out.glob("*.journal")), \
        "the open shard was left unfinished"
    model = tiny_llama(seed=3, layers=3, hidden=64)
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["input_ids"]])
            hs = model(ids, output_hidden_states=True).hidden_states
            got = load_sample(out, f"hscap-{r['id']}")
            assert torch.equal(got["layer_0"], hs[1][0])
            assert torch.equal(got["layer_1"], hs[2][0])
            assert torch.equal(got["final_norm"], hs[3][0])
            assert got["token_ids"].tolist() == r["input_ids"]
            if "loss_mask" in r:
                assert got["field.loss_mask"].dtype == torch.uint8
                assert got["field.loss_mask"].tolist() == r["loss_mask"], r["id"]
            else:
                assert "field.loss_mask" not in got


def test_the_example_writes_exact_samples_with_their_loss_masks_and_a_rerun_requests_nothing(
        tmp_path, standins):
    server = standins("a")
    rows = make_rows(12, seed=5)
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    first = subprocess.run(example_cmd(data, out, server), cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert_exact(out, rows)
    assert sorted(server.requested()) == sorted(f"hscap-{r['id']}" for r in rows)
    again = subprocess.run(example_cmd(data, out, server), cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "0 samples to extract (12 already in" in again.stderr
    assert len(server.requested()) == len(rows), "the rerun requested samples it already had"
    assert len(index_lines(out)) == len(rows)


def _stop_then_resume(tmp_path: Path, standins, how: signal.Signals, n: int = 150) -> None:
    """Stop a run with ``how`` once some samples are durable, rerun against a second server,
    and check that the rerun requested exactly the rids the first run did not make durable."""
    slow, fresh = standins("first", delay_s=0.02), standins("rerun")
    rows = make_rows(n, seed=11)
    everything = {f"hscap-{r['id']}" for r in rows}
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    run = Running(example_cmd(data, out, slow, "--flush-every", "10"), tmp_path)
    reported = run.wait_durable(30)
    run.proc.send_signal(how)
    rc, err = run.finish()
    assert "Traceback" not in err, err
    if how == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        ShardWriter(out).close()    # what the rerun's writer does first: recover the journal
    else:
        assert rc == 130, err
        assert f"interrupted by {how.name}" in err, err
        assert not list(out.glob("*.tmp")), "the open shard was not finished"
    assert verify_dir(out)["problems"] == []
    kept = set(read_index(out))
    assert len(kept) == len(index_lines(out)), "a rid was written twice"
    assert reported <= len(kept) < n, "a flushed sample was lost"
    assert kept <= set(slow.requested())

    again = subprocess.run(example_cmd(data, out, fresh), cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"{n - len(kept)} samples to extract ({len(kept)} already in" in again.stderr
    asked = fresh.requested()
    assert len(asked) == len(set(asked)), "the rerun requested a rid twice"
    assert set(asked) == everything - kept, "the rerun did not request exactly the rest"
    assert_exact(out, rows)


def test_sigterm_finishes_the_open_shard_exits_130_and_the_rerun_requests_exactly_the_rest(
        tmp_path, standins):
    _stop_then_resume(tmp_path, standins, signal.SIGTERM)


def test_sigkill_keeps_every_flushed_sample_and_the_rerun_requests_exactly_the_rest(
        tmp_path, standins):
    _stop_then_resume(tmp_path, standins, signal.SIGKILL)


def test_ctrl_c_exits_130_without_a_traceback_and_keeps_what_was_written(tmp_path, standins):
    server = standins("a", delay_s=0.01)
    rows = make_rows(300, seed=13)
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    run = Running(example_cmd(data, out, server, "--flush-every", "5"), tmp_path)
    reported = run.wait_durable(10)
    run.proc.send_signal(signal.SIGINT)
    rc, err = run.finish()
    assert rc == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted by SIGINT" in err and "rerun the same command" in err, err
    kept = index_lines(out)
    assert reported <= len(kept) == len(set(kept)) < len(rows)
    assert verify_dir(out)["problems"] == []
    assert not list(out.glob("*.tmp"))


def test_a_sample_whose_loss_mask_did_not_arrive_is_reported_never_written(tmp_path, standins):
    server = standins("a", 0.0, "--no-fields")     # a server that drops the masks
    rows = make_rows(3, seed=17)                   # q0, q1 with a mask, q2 without
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    res = subprocess.run(example_cmd(data, out, server), cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 3, res.stderr
    for rid in ("hscap-q0", "hscap-q1"):
        assert f"FAILED {rid}: it arrived without its loss_mask" in res.stderr, res.stderr
    assert index_lines(out) == ["hscap-q2"]
    assert_exact(out, rows[2:])


def test_a_loss_mask_that_does_not_fit_its_tokens_is_refused_before_anything_is_sent(tmp_path):
    rows = [{"id": "ok", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
            {"id": "bad", "input_ids": [1, 2, 3], "loss_mask": [0, 1]}]
    data = write_rows(tmp_path / "data.jsonl", rows)
    res = subprocess.run([sys.executable, str(EXAMPLE), str(data), str(tmp_path / "out"),
                          "--server", "http://127.0.0.1:9", "--endpoint",
                          f"ipc://{tmp_path}/none.sock"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert f"{data}:2: loss_mask: expected 3 values of 0 or 1" in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def _tiny_chat_tokenizer(path: Path) -> None:
    """A word-level fast tokenizer with a chat template, written to ``path`` (no download)."""
    tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers package")
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    special = ["<unk>", "<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    words = ["be", "brief", "hi", "there", "hello", "you", "how", "are", "fine", "thanks"]
    vocab = {w: i for i, w in enumerate(special + words)}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(special)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                bos_token="<s>")
    fast.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
        "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")
    fast.save_pretrained(path)


def test_chat_template_spans_mask_exactly_the_assistant_tokens(tmp_path, standins):
    tok_dir = tmp_path / "tokenizer"
    _tiny_chat_tokenizer(tok_dir)
    server = standins("a")
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi there"},
                {"role": "assistant", "content": "hello you"},
                {"role": "user", "content": "how are you"},
                {"role": "assistant", "content": "fine thanks"}]
    data = write_rows(tmp_path / "data.jsonl", [{"id": "c0", "messages": messages},
                                                {"id": "t1", "input_ids": [7, 8, 9]}])
    out = tmp_path / "out"
    res = subprocess.run(example_cmd(data, out, server, "--chat-template", str(tok_dir)),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    # <s> <|system|> be brief <|end|> <|user|> hi there <|end|>
    #   <|assistant|> hello you <|end|> <|user|> how are you <|end|> <|assistant|> fine thanks <|end|>
    want_ids = [1, 2, 6, 7, 5, 3, 8, 9, 5, 4, 10, 11, 5, 3, 12, 13, 11, 5, 4, 14, 15, 5]
    want_mask = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    got = load_sample(out, "hscap-c0")
    assert got["token_ids"].tolist() == want_ids
    assert got["field.loss_mask"].tolist() == want_mask
    assert "field.loss_mask" not in load_sample(out, "hscap-t1")
    assert verify_dir(out)["problems"] == []


def test_the_row_number_and_the_meta_fields_travel_with_each_sample_to_the_reader(
        tmp_path, standins):
    from hscapture.reader import open_shards

    server = standins("a")
    rows = make_rows(6, seed=23)
    for i, r in enumerate(rows):
        if i != 4:
            r["split"] = "eval" if i % 3 == 0 else "train"   # row 4 has no split
        r["source"] = {"not": "sent"}                        # a key not named: not sent
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    res = subprocess.run(example_cmd(data, out, server, "--meta-fields", "id, split"),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert_exact(out, rows)
    want = {f"hscap-{r['id']}": {"row": i, "id": r["id"],
                                 **({"split": r["split"]} if "split" in r else {})}
            for i, r in enumerate(rows)}
    with open_shards(out) as ss:
        assert {s.rid: s.extra.get("meta") for s in ss} == want
    # without --meta-fields every sample still says which line it came from
    out2 = tmp_path / "out2"
    res = subprocess.run(example_cmd(data, out2, server), cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    with open_shards(out2) as ss:
        assert {s.rid: s.extra.get("meta") for s in ss} == {
            f"hscap-{r['id']}": {"row": i} for i, r in enumerate(rows)}


def test_a_sample_whose_meta_did_not_arrive_is_reported_never_written(tmp_path, standins):
    server = standins("a", 0.0, "--no-meta")       # a server that ignores hscapture_meta
    rows = make_rows(2, seed=29)
    data = write_rows(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    res = subprocess.run(example_cmd(data, out, server), cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 3, res.stderr
    for r in rows:
        assert f"FAILED hscap-{r['id']}: it arrived without its metadata" in res.stderr
    assert not (out / "index.jsonl").exists() or index_lines(out) == []


@pytest.mark.parametrize("rows, fields, message", [
    ([{"id": "a", "input_ids": [1, 2], "tags": ["x"]}], "tags",
     r"data.jsonl:1: --meta-fields: hscapture_meta\['tags'\]: expected str, int, float, bool "
     r"or None, found list"),
    ([{"id": "a", "input_ids": [1, 2]}], "id,spilt",
     r"--meta-fields spilt: expected in some row, found in none"),
    ([{"id": "a", "input_ids": [1, 2]}], "row", r"--meta-fields: 'row' is always sent"),
], ids=["nested-value", "unknown-field", "reserved"])
def test_meta_fields_that_break_the_meta_rule_are_refused_before_anything_is_sent(
        tmp_path, rows, fields, message):
    data = write_rows(tmp_path / "data.jsonl", rows)
    res = subprocess.run([sys.executable, str(EXAMPLE), str(data), str(tmp_path / "out"),
                          "--server", "http://127.0.0.1:9", "--endpoint",
                          f"ipc://{tmp_path}/none.sock", "--meta-fields", fields],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert re.search(message, res.stderr), res.stderr
    assert not (tmp_path / "out").exists()
