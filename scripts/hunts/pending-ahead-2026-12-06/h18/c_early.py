"""c_early.py: C. poll()/samples()/get() with failures (aborts of half-sent samples) arriving while no
sample is ready; durable vs anonymous. Producer in a child process driven by stdin commands."""
import os, sys, json, time, subprocess, uuid, resource
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
from pathlib import Path
PROD = r'''
import os, sys, json, time, torch, hscapture
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
p = hscapture.Producer(sys.argv[1], producer_id=sys.argv[2], capacity=1 << 20, heartbeat_interval_s=0.05)
print("ready", flush=True)
x = [torch.ones(4, 32, dtype=torch.bfloat16)] * 2; ids = torch.arange(4); k = 0
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "abort":      # n aborts, every dt seconds: chunk 1 of 2, then abort
        n, dt = int(cmd[1]), float(cmd[2])
        for i in range(n):
            rid = "ab-%d" % k; k += 1
            p.capture(rid, x, layers=[0, 1], token_ids=ids, token_start=0, is_last_chunk=False); p.abort(rid, "test abort"); p.flush()
            time.sleep(dt)
    elif cmd[0] == "cap":
        p.capture(cmd[1], x, layers=[0, 1], token_ids=ids); p.flush()
    elif cmd[0] == "quit":
        break
    print("ok", flush=True)
p.close()
'''
import hscapture
def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
out = {}
for durable in (True, False):
    tag = uuid.uuid4().hex[:6]; d = Path("/tmp/hunt-h18/ep") / tag; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
    prod = subprocess.Popen([sys.executable, "-c", PROD, ep, f"h18-ce-{tag}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert prod.stdout.readline().strip() == "ready"
    sub = hscapture.Subscriber(ep, name=f"h18-ce{tag}" if durable else None)
    sub.wait_ready(timeout=20)
    def cmd(c, wait=True):
        prod.stdin.write(c + "\n"); prod.stdin.flush()
        if wait: assert prod.stdout.readline().strip() == "ok"
    # warm: one sample
    cmd("cap warm"); s = sub.poll(5); assert s is not None and s.rid == "warm"; s.release()
    k = "durable" if durable else "anon"; r = {}
    # C1: poll(5) while one abort arrives ~0.3 s into it and no sample
    cmd("abort 1 0.0", wait=False)
    t = time.monotonic(); c0 = cpu(); s = sub.poll(timeout=5); r["C1_poll5_one_abort"] = {"ret": None if s is None else s.rid, "s": round(time.monotonic() - t, 3), "cpu": round(cpu() - c0, 3), "fails": len(sub.failures())}
    prod.stdout.readline()
    if s is None and time.monotonic() - t < 5:
        pass
    # C1b: poll(2) with nothing coming at all
    t = time.monotonic(); c0 = cpu(); s = sub.poll(timeout=2); r["C1b_poll2_nothing"] = {"ret": None if s is None else s.rid, "s": round(time.monotonic() - t, 3), "cpu": round(cpu() - c0, 3)}
    # C3: samples(timeout=2) while aborts arrive every 0.05 s for 4 s and no sample: should end ~2 s (no new sample), CPU?
    cmd("abort 80 0.05", wait=False)
    t = time.monotonic(); c0 = cpu(); got = list(sub.samples(timeout=2)); r["C3_samples_t2_aborts"] = {"got": len(got), "s": round(time.monotonic() - t, 3), "cpu": round(cpu() - c0, 3), "fails": len(sub.failures())}
    prod.stdout.readline()
    sub.acknowledge_failures(len(sub.failures()))
    # C3b: samples(timeout=2) where a sample comes at 1.5 s amid aborts: must yield it
    cmd("abort 30 0.05", wait=False)
    t = time.monotonic(); time.sleep(0.0)
    import threading
    def later(): time.sleep(1.6); pass
    got = []; it = sub.samples(limit=1, timeout=3)
    threading.Timer(0.0, lambda: None).start()
    prod.stdout.readline()  # aborts done (~1.5 s)
    cmd("cap late")
    for s in it: got.append(s.rid); s.release()
    r["C3b_samples_gets_late_sample"] = {"got": got, "s": round(time.monotonic() - t, 3)}
    # C4: get(rid) while aborts arrive; rid captured after ~1 s of aborts
    cmd("abort 20 0.05", wait=False)
    t = time.monotonic(); prod.stdout.readline(); cmd("cap wanted")
    try:
        s = sub.get("wanted", timeout=5); r["C4_get_amid_aborts"] = {"ret": s.rid, "s": round(time.monotonic() - t, 3)}; s.release()
    except Exception as e:
        r["C4_get_amid_aborts"] = {"err": repr(e)[:200]}
    # C5: poll loop for 3 s while aborts every 0.01 s: how many early Nones, CPU
    cmd("abort 300 0.01", wait=False)
    t = time.monotonic(); c0 = cpu(); nn = 0
    while time.monotonic() - t < 3:
        s = sub.poll(timeout=1.0); nn += s is None
    r["C5_poll1_loop_3s_aborts_every_10ms"] = {"nones": nn, "cpu": round(cpu() - c0, 3), "fails": len(sub.failures())}
    prod.stdout.readline()
    sub.acknowledge_failures(len(sub.failures()))
    out[k] = r
    cmd("quit", wait=False); prod.wait(20)
    if durable: sub.unsubscribe()
    sub.close()
print(json.dumps(out, indent=1))
