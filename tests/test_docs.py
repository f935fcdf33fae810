"""Every ```python and ```bash block of README.md and docs/*.md runs, as written.

The blocks of one document run in order in one scratch directory, like a reader following it
(a later block may use what an earlier one wrote). The scratch directory links the checkout's
``examples/``, ``scripts/``, ``tests/`` and ``benchmarks/`` so relative paths work; ``python``
and ``hscapture`` are this test's interpreter and command; ``HSCAPTURE_SOCKET_DIR`` is private
to the run, so default endpoints never meet a real server's.

An HTML comment right before a fence changes how its block runs:

* ``<!-- doc-test: skip REASON -->``: not run (needs a GPU, a real SGLang server, or runs the
  whole suite); the reason is the skip message.
* ``<!-- doc-test: background -->``: started in the background; it must exit 0 once the next
  block has run (e.g. a drain that the next block's producer feeds).
* ``<!-- doc-test: fake-sglang -->``: a stand-in for SGLang's DP rank 0 producer runs while the
  block does: it binds the default endpoint ``sglang-dp0``, waits for a subscriber, and
  captures rid ``hscap-42`` (812 tokens) at the layer ids of the document's own launch command
  (``--return-aux-hidden-state-layer-ids``) plus ``final_norm``, so a snippet that reads other
  layers than the launch command captures fails here.

Excluded: docs/PROTOCOL.md and docs/ARCHITECTURE.md (contracts, not instructions).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXCLUDED = {"PROTOCOL.md", "ARCHITECTURE.md"}
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md")
                                    if p.name not in EXCLUDED)]
LINKED = ("examples", "scripts", "tests", "benchmarks")
_FENCE = re.compile(r"^```(python|bash)\s*$")
_MARK = re.compile(r"^<!--\s*doc-test:\s*(\S+)\s*(.*?)\s*-->\s*$")
_LAYERS = re.compile(r"--return-aux-hidden-state-layer-ids((?:\s+\d+)+)")


@dataclass
class Block:
    doc: Path
    line: int          # 1-based line of the opening fence
    lang: str
    code: str
    mode: str = "run"  # run | skip | background | fake-sglang
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def extract(doc: Path) -> list[Block]:
    """The runnable blocks of ``doc`` in order, with the mode their marker gives them."""
    lines = doc.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            if lines[i].startswith("```"):                       # another fence: skip over it
                i += 1
                while i < len(lines) and not lines[i].startswith("```"):
                    i += 1
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        block = Block(doc, start + 1, m.group(1), "\n".join(body) + "\n")
        prev = lines[start - 1] if start > 0 else ""
        mark = _MARK.match(prev)
        if mark:
            mode, rest = mark.group(1), mark.group(2)
            if mode not in ("skip", "background", "fake-sglang"):
                raise ValueError(f"{doc}:{start}: unknown doc-test marker {mode!r}")
            if mode == "skip" and not rest:
                raise ValueError(f"{doc}:{start}: a doc-test skip needs a reason")
            block.mode, block.reason = mode, rest
        blocks.append(block)
        i += 1
    return blocks


ALL = [b for doc in DOCS for b in extract(doc)]

_FAKE_SGLANG = """
import signal, sys, torch
from hscapture import Producer
layers = [int(x) for x in sys.argv[1].split(",")]
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
with Producer(producer_id="sglang-dp0", capacity=64 << 20, convention="sglang-eagle3-aux",
              model="doc-test-fake-sglang") as p:
    print("up", flush=True)
    if not p.wait_for_consumers(1, timeout_s=120):
        sys.exit("fake sglang: no subscriber attached")
    g = torch.Generator().manual_seed(0)
    n = 812
    tensors = [torch.randn(n, 64, generator=g).to(torch.bfloat16) for _ in range(len(layers) + 1)]
    p.capture("hscap-42", tensors, layers=layers + [max(layers) + 1],
              layer_kinds=["residual"] * len(layers) + ["final_norm"],
              token_ids=torch.arange(n, dtype=torch.int32))
    p.flush()
    signal.pause()
"""


class Workspace:
    """One document's scratch directory, environment and background processes."""

    def __init__(self, doc: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hsc-doc-"))
        self.sockets = Path("/tmp") / f"hsc-doc-{uuid.uuid4().hex[:8]}"
        self.sockets.mkdir(mode=0o700)
        for name in LINKED:
            (self.dir / name).symlink_to(ROOT / name)
        bindir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "HSCAPTURE_SOCKET_DIR": str(self.sockets),
                    "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
                    "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONUNBUFFERED": "1"}
        for var in ("HSCAPTURE_ENDPOINT", "HSCAPTURE_PRODUCER_ID", "HSCAPTURE_ENABLE"):
            self.env.pop(var, None)
        found = _LAYERS.search(doc.read_text())
        self.layers = found.group(1).split() if found else ["1", "2"]
        self.background: list[tuple[Block, subprocess.Popen]] = []

    def command(self, block: Block) -> list[str]:
        if block.lang == "bash":
            return ["bash", "-euo", "pipefail", "-c", block.code]
        path = self.dir / f"_doc_block_{block.line}.py"
        path.write_text(block.code)
        return [sys.executable, str(path)]

    def close(self) -> None:
        for _, proc in self.background:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


_WORKSPACES: dict[Path, Workspace] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_workspaces():
    yield
    for ws in _WORKSPACES.values():
        ws.close()
    _WORKSPACES.clear()


def test_every_document_has_blocks_and_every_skip_says_why():
    assert [b for b in ALL if b.doc.name == "README.md"], "README.md has no runnable blocks"
    for b in ALL:
        assert b.mode != "skip" or b.reason, b.id
    assert len([b for b in ALL if b.mode == "skip"]) <= len(ALL) // 2, \
        "most blocks are skipped: the docs would drift unchecked"


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_doc_block_runs_as_written(block: Block):
    if block.mode == "skip":
        pytest.skip(f"{block.id}: {block.reason}")
    ws = _WORKSPACES.get(block.doc) or _WORKSPACES.setdefault(block.doc, Workspace(block.doc))
    if block.mode == "background":
        ws.background.append((block, subprocess.Popen(
            ws.command(block), cwd=ws.dir, env=ws.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)))
        return
    fake = None
    if block.mode == "fake-sglang":
        fake = subprocess.Popen([sys.executable, "-c", _FAKE_SGLANG, ",".join(ws.layers)],
                                cwd=ws.dir, env=ws.env, stdout=subprocess.PIPE, text=True)
        assert fake.stdout.readline().strip() == "up", "the fake SGLang producer did not start"
    try:
        res = subprocess.run(ws.command(block), cwd=ws.dir, env=ws.env, capture_output=True,
                             text=True, timeout=300)
    finally:
        if fake is not None:
            fake.terminate()
            fake.wait(timeout=60)
    assert res.returncode == 0, (f"{block.id} ({block.lang}) exited {res.returncode}\n"
                                 f"--- block ---\n{block.code}--- stdout ---\n{res.stdout}"
                                 f"--- stderr ---\n{res.stderr}")
    pending, ws.background = ws.background, []
    for bg, proc in pending:
        try:
            out = proc.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        assert proc.returncode == 0, (f"background block {bg.id} exited {proc.returncode}\n"
                                      f"--- block ---\n{bg.code}--- output ---\n{out}")
