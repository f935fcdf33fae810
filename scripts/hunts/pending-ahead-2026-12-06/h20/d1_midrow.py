"""d1_midrow.py: deterministic. Producer rows: A chunk0 (seq0), B whole (seq1), A chunk1 (seq2), A last (seq3).
Durable subscriber #1 takes A with get('A') and releases it (out of queue order: B queued before it, untouched),
then SIGKILLs itself. Resumer #2 polls until idle: does it report A (delivered and acknowledged) incomplete?"""
import os, sys, json, time, signal, subprocess, uuid
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h20/subs"
env = dict(os.environ); env.pop("PYTHONPATH", None)
py = "/work/main/.venv/bin/python"
if len(sys.argv) > 1 and sys.argv[1] == "prod":
    import torch, hscapture
    p = hscapture.Producer(sys.argv[2], producer_id=sys.argv[3], capacity=1 << 20, full_policy="drop", heartbeat_interval_s=0.05)
    print("ready", flush=True); p.wait_for_consumers(1, timeout_s=60)
    t = lambda v: [torch.full((2, 16), float(v)), torch.full((2, 16), float(v))]
    ids = torch.arange(2)
    zc = len(sys.argv) > 4
    p.capture("A", t(1), layers=[0, 1], token_start=0, is_last_chunk=False, token_ids=ids)
    p.capture("B", t(2), layers=[0, 1], token_start=0, is_last_chunk=True, token_ids=ids)
    p.capture("A", t(3), layers=[0, 1], token_start=2, is_last_chunk=False, token_ids=ids)
    p.capture("A", t(4), layers=[0, 1], token_start=4, is_last_chunk=True, token_ids=ids)
    p.flush(); print("done", flush=True); sys.stdin.readline(); p.close(); sys.exit()
if len(sys.argv) > 2:
    import hscapture
    sub = hscapture.Subscriber(sys.argv[2], name=sys.argv[3], zero_copy=sys.argv[4] == "1")
    if sys.argv[1] == "first":
        s = sub.get("A", timeout=20); print("took", s.rid, s.num_tokens, flush=True)
        while not sub._delivery.ready: sub.pump(0.05)
        print("queued:", [x.rid for x in sub._delivery.ready], flush=True)
        s.release(); print("released A", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    got = []; last = time.monotonic()
    while time.monotonic() - last < 2:
        s = sub.poll(timeout=0.2)
        if s is not None: got.append((s.rid, s.num_tokens)); s.release(); last = time.monotonic()
    print("resumer got:", got, "failures:", sub.failures(), flush=True); sub.close(); sys.exit()
zc = sys.argv[1] if len(sys.argv) > 1 else "0"
for trial in range(int(os.environ.get("N", 3))):
    tag = uuid.uuid4().hex[:6]; dd = Path("/tmp/hunt-h20/ep") / tag; dd.mkdir(parents=True, mode=0o700); ep = f"ipc://{dd}/p.sock"
    name = f"h20-mid{tag}"
    prod = subprocess.Popen([py, __file__, "prod", ep, f"h20-m-{tag}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert prod.stdout.readline().strip() == "ready"
    a = subprocess.run([py, __file__, "first", ep, name, zc], env=env, capture_output=True, text=True, timeout=60)
    print(trial, "first:", a.stdout.strip().replace("\n", " | "), "rc", a.returncode)
    b = subprocess.run([py, __file__, "second", ep, name, zc], env=env, capture_output=True, text=True, timeout=60)
    print(trial, "second:", b.stdout.strip(), b.stderr[-300:])
    prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(20)
