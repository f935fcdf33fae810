"""examples/extract_eagle3.py end to end against a stand-in /generate server (real capture
path, tiny model on CPU): every sample bit-exact, and a rerun resumes without duplicates."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import torch

from hscapture.demo import tiny_llama
from hscapture.shards import load_sample, read_index, verify_dir

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent


def test_the_extraction_example_writes_exact_shards_and_resumes(tmp_path):
    sock_dir = Path("/tmp") / f"hsc-ex-{uuid.uuid4().hex[:8]}"
    sock_dir.mkdir(mode=0o700)
    endpoint = f"ipc://{sock_dir}/standin.sock"
    server = subprocess.Popen([sys.executable, str(HERE / "generate_standin.py"), endpoint],
                              stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        port = int(server.stdout.readline().split()[1])
        g = torch.Generator().manual_seed(5)
        rows = [{"id": f"q{i}", "input_ids": torch.randint(0, 4096, (int(n),), generator=g).tolist()}
                for i, n in enumerate(torch.randint(3, 90, (12,), generator=g))]
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp_path / "out"
        cmd = [sys.executable, str(ROOT / "examples" / "extract_eagle3.py"), str(data), str(out),
               "--server", f"http://127.0.0.1:{port}", "--endpoint", endpoint,
               "--concurrency", "4", "--timeout", "60"]
        first = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
        assert first.returncode == 0, first.stderr
        index = read_index(out)
        assert sorted(index) == sorted(f"hscap-{r['id']}" for r in rows)
        assert verify_dir(out)["problems"] == []
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
        again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert "0 samples to extract" in again.stderr
        lines = (out / "index.jsonl").read_text().splitlines()
        assert len(lines) == len(rows), "the rerun wrote duplicates"
    finally:
        server.kill()
        server.wait(timeout=30)
        for f in sock_dir.iterdir():
            f.unlink()
        sock_dir.rmdir()
