"""hunt-h9 harness: imports the test suite's fault_support (read-only) with a private subs dir."""
import os, sys, json, uuid, signal, time, random, shutil
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h14/subs"
os.makedirs(os.environ["HSCAPTURE_SUBS_DIR"], exist_ok=True)
os.environ["PYTHONUNBUFFERED"] = "1"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path("/work/main") / "tests")); sys.path.insert(0, str(Path("/work/main")))
from fault_support import (ProducerProc, check_exact, drain_report, durable_rids, index_rids,
                           reported_rids, requests, start_drain, verify_shards, wait_until)

def new_ep():
    d = Path("/tmp/hunt-h14/ep") / uuid.uuid4().hex[:8]
    d.mkdir(parents=True, mode=0o700)
    return f"ipc://{d}/p.sock", d

def reports_jsonl(out):
    p = Path(out) / "reports.jsonl"
    rids = {}; lost = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "rid" in d:
                rids[d["rid"]] = rids.get(d["rid"], 0) + 1
            elif "count" in d or "first" in d:
                lost.append(d)
    return rids, lost

import subprocess as _sp, threading as _th
class RetryProc(ProducerProc):
    """ProducerProc running prod.py beside this file (retries, cached prefixes)."""
    def __init__(self, spec, cwd):
        self.spec = spec
        f = Path(cwd) / f"spec-{uuid.uuid4().hex[:8]}.json"; f.write_text(json.dumps(spec))
        env = dict(os.environ); env["PYTHONPATH"] = str(Path("/work/main"))
        self.proc = _sp.Popen([sys.executable, str(HERE / "prod.py"), "@" + str(f)], cwd=cwd,
                              stdin=_sp.PIPE, stdout=_sp.PIPE, stderr=_sp.PIPE, text=True, env=env)
        self.events = []; self._cond = _th.Condition(); self._eof = False
        self._reader = _th.Thread(target=self._read, daemon=True); self._reader.start()

def report_lines(out):
    p = Path(out) / "reports.jsonl"; res = []
    if p.exists():
        for line in p.read_text().splitlines():
            try: d = json.loads(line)
            except ValueError: continue
            if "rid" in d: res.append(d)
    return res
