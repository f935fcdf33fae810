"""hunt-d7 harness: imports the test suite's fault_support (read-only) with a private subs dir."""
import os, sys, json, uuid, signal, time, random, shutil
from pathlib import Path
HERE = Path(__file__).resolve().parent
os.environ.setdefault("HSCAPTURE_SUBS_DIR", "/tmp/hunt-d7-subs")
os.makedirs(os.environ["HSCAPTURE_SUBS_DIR"], exist_ok=True)
os.environ["PYTHONUNBUFFERED"] = "1"
sys.path.insert(0, str(HERE.parents[2] / "tests")); sys.path.insert(0, str(HERE.parents[2]))
from fault_support import (ProducerProc, check_exact, drain_report, durable_rids, index_rids,
                           reported_rids, requests, start_drain, verify_shards, wait_until)

def new_ep():
    d = Path("/tmp/hunt-d7-ep") / uuid.uuid4().hex[:8]
    d.mkdir(parents=True, mode=0o700)
    return f"ipc://{d}/p.sock", d

def reports_jsonl(out):
    p = Path(out) / "reports.jsonl"
    rids = set()
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "rid" in d:
                rids.add(d["rid"])
    return rids
