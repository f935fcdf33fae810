"""u1: captures made before the first subscriber whose 'unheard' entry is larger than the ring.
usage: python u1_unheard_big.py RUNS [N] [CAP_KIB] [RIDLEN]
Expected: every pre-attach rid written or named by the drain's report (row 2); a lost range would at least count them."""
import sys, json, time, shutil, subprocess as sp, threading as th
from pathlib import Path as _P
sys.path.insert(0, str(_P(__file__).resolve().parent.parent / "retry-backlog-2026-12-06"))  # its harness
from hd10 import *
RUNS = int(sys.argv[1]); N = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
CAP = int(sys.argv[3]) if len(sys.argv) > 3 else 64; RL = int(sys.argv[4]) if len(sys.argv) > 4 else 40
def lines_of(proc, evs):
    for line in proc.stdout:
        try: evs.append(json.loads(line))
        except ValueError: pass
def ev(evs, name, timeout=60):
    return wait_until(lambda: next((e for e in evs if e.get("event") == name), None), timeout, name)
def one(k):
    ep, epd = new_ep(); tmp = Path("/tmp/hunt-h13/work") / f"u1-{k}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    out = tmp / "out"
    prefix = ("u" * max(1, RL - 14))[:RL - 14] + uuid.uuid4().hex[:3]
    spec = {"endpoint": ep, "pid": f"h13u1-{uuid.uuid4().hex[:6]}", "cap": CAP << 10, "n": N, "m": 20, "prefix": prefix}
    env = dict(os.environ, PYTHONPATH="/work/main")
    pp = sp.Popen([sys.executable, "u1_prod.py", json.dumps(spec)], stdin=sp.PIPE, stdout=sp.PIPE,
                  stderr=open(tmp / "prod.err", "w"), text=True, env=env)
    pe = []; th.Thread(target=lines_of, args=(pp, pe), daemon=True).start()
    pre = ev(pe, "pre")
    d = start_drain(ep, out, "--idle-timeout", "3")
    post = ev(pe, "post")
    pp.stdin.write("\n"); pp.stdin.flush(); ev(pe, "done"); pp.wait(10)
    rc, rep, err = drain_report(d, 120)
    (tmp / "drain.json").write_text(json.dumps({"rc": rc, "rep": rep, "err": err[-4000:]}, default=str))
    ws = set(durable_rids(out)); named = reported_rids(rep) | {x["rid"] for x in report_lines(out)}
    pre_ok = [r for r, ok in pre["oks"].items() if ok]
    silent = sorted(r for r in pre_ok if r not in ws and r not in named)
    post_missing = sorted(r for r, ok in post["oks"].items() if ok and r not in ws)
    lost = rep.get("lost"); perr = (tmp / "prod.err").read_text()
    prob = bool(silent or post_missing)
    print(json.dumps({"k": k, "problem": prob, "pre_captured": len(pre_ok), "written": len(ws), "named": len(named),
                      "silent": len(silent), "silent_ex": silent[:3], "post_missing": post_missing[:5], "lost": lost,
                      "rc": rc, "prod_err_tail": perr[-600:], "dir": str(tmp)}, default=str), flush=True)
    shutil.rmtree(epd, ignore_errors=True)
    return prob
bad = sum(one(k) for k in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
