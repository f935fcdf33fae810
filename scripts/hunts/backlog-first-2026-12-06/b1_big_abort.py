"""b1: an abort larger than the ring (a long reason) waits at the backlog's head forever.
usage: python b1_big_abort.py RUNS [CAP_KIB] [REASON_LEN]"""
import sys, json, shutil, subprocess as sp, threading as th
from pathlib import Path as _P
sys.path.insert(0, str(_P(__file__).resolve().parent.parent / "retry-backlog-2026-12-06"))  # its harness
from hd10 import *
RUNS = int(sys.argv[1]); CAP = int(sys.argv[2]) if len(sys.argv) > 2 else 256; RLEN = int(sys.argv[3]) if len(sys.argv) > 3 else 300000
def lines_of(proc, evs):
    for line in proc.stdout:
        try: evs.append(json.loads(line))
        except ValueError: pass
def ev(evs, name, timeout=60):
    return wait_until(lambda: next((e for e in evs if e.get("event") == name), None), timeout, name)
def one(k):
    ep, epd = new_ep(); tmp = Path("/tmp/hunt-h13/work") / f"b1-{k}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True); out = tmp / "out"
    spec = {"endpoint": ep, "pid": f"h13b1-{uuid.uuid4().hex[:6]}", "cap": CAP << 10, "reason_len": RLEN}
    env = dict(os.environ, PYTHONPATH="/work/main")
    pp = sp.Popen([sys.executable, "b1_prod.py", json.dumps(spec)], stdin=sp.PIPE, stdout=sp.PIPE, stderr=open(tmp / "prod.err", "w"), text=True, env=env)
    pe = []; th.Thread(target=lines_of, args=(pp, pe), daemon=True).start()
    ev(pe, "ready"); d = start_drain(ep, out, "--idle-timeout", "3")
    r = ev(pe, "res"); pp.stdin.write("\n"); pp.stdin.flush(); dn = ev(pe, "done", 60); pp.wait(10)
    rc, rep, err = drain_report(d, 120)
    (tmp / "drain.json").write_text(json.dumps({"rc": rc, "rep": rep, "err": err[-4000:]}, default=str))
    ws = set(durable_rids(out)); named = reported_rids(rep) | {x["rid"] for x in report_lines(out)}
    res = r["res"]
    raised = [k for k, v in res.items() if v is not True]
    a_named = "a-0" in named
    prob = bool(raised) or not a_named
    print(json.dumps({"k": k, "problem": prob, "res": res, "written": sorted(ws), "a0_named": a_named, "named": sorted(named),
                      "lost": rep.get("lost"), "rc": rc, "close": dn, "stats": {x: r["stats"].get(x) for x in ("backlog", "dropped", "aborted", "next_seq")}, "dir": str(tmp)}, default=str), flush=True)
    shutil.rmtree(epd, ignore_errors=True); return prob
bad = sum(one(k) for k in range(RUNS)); print(f"RESULT {bad}/{RUNS} runs with problems")
