"""An anonymous Subscriber dropped without close() (del + gc) while its producer is live and
paused after K requests (all committed, some drops in backlog with ZC): each of the first K
rids must be delivered or named in the hscapture log warnings. usage: d1_dropped_sub.py RUNS"""
import sys, os, gc, random, time, json, shutil, logging, io
from pathlib import Path
from hd9 import *
from hscapture import Subscriber
buf = io.StringIO(); h = logging.StreamHandler(buf); logging.getLogger("hscapture").addHandler(h)
RUNS = int(sys.argv[1]); K = 120
import faulthandler; faulthandler.dump_traceback_later(50, exit=True)
def one(seed):
    tmp = Path("/tmp/hunt-h9/work") / f"d1-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    ep, epd = new_ep()
    reqs = requests(300, seed=seed, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"h9d1-{seed}", "consumers": 1,
                      "rate": 400, "interleave": 4, "capacity": 128 << 10, "policy": "drop",
                      "pause_after": K, "close_on_stdin": True}, tmp)
    try:
        p.wait_event("ready")
        sub = Subscriber(ep, zero_copy=True)
        got = []; held = []
        while len(got) < 30 and not (p.poll_event("paused") and time.sleep(0.3) is None and sub.poll(timeout=0.2) is None):
            s = sub.poll(timeout=0.05)
            if s is not None:
                got.append(s.rid)
                if len(held) < 8: held.append(s)
                else: s.release()
        p.wait_event("paused", timeout=60)
        buf.seek(0); buf.truncate()
        before = {k: set(sub.stats()[k]) for k in ("dropped", "incomplete")}
        t0 = time.monotonic(); held.clear()
        if os.environ.get("CONTROL"):
            sub.close(); st = sub.stats(); after = {k: set(st[k]) for k in ("dropped", "incomplete")}; lostc = st["lost"]
        else:
            after = None; lostc = None
        del sub; gc.collect(); dt = time.monotonic() - t0
        time.sleep(0.5)
        log = buf.getvalue()
        want = [r for r, _, _ in reqs[:K]]
        silent = [r for r in want if r not in got and f"'{r}'" not in log and f'"{r}"' not in log and f" {r}," not in log and f" {r} " not in log and not log.count(r)]
        prob = bool(silent)
        print(json.dumps({"seed": seed, "prob": prob, "got": len(got), "del_s": round(dt, 3), "n_silent": len(silent),
                          "silent": silent[:8], "silent_in_stats_before_del": len([r for r in silent if any(r in v for v in before.values())]), "silent_named_only_by_close": (len([r for r in silent if any(r in v for v in after.values()) and not any(r in v for v in before.values())]) if after else None), "close_lost": lostc, "log": log[:600]}), flush=True)
        return prob
    finally:
        p.send(); p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)
bad = sum(one(4000 + s) for s in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
