"""hunt-h9 harness: imports the test suite's fault_support (read-only) with a private subs dir."""
import os, sys, json, uuid, signal, time, random, shutil
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h9/subs"
os.makedirs(os.environ["HSCAPTURE_SUBS_DIR"], exist_ok=True)
os.environ["PYTHONUNBUFFERED"] = "1"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tests")); sys.path.insert(0, str(HERE.parents[2]))
from fault_support import (ProducerProc, check_exact, drain_report, durable_rids, index_rids,
                           reported_rids, requests, start_drain, verify_shards, wait_until)

def new_ep():
    d = Path("/tmp/hunt-h9/ep") / uuid.uuid4().hex[:8]
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
