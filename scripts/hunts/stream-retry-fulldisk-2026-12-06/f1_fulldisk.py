"""hscapture drain into a 2 MiB tmpfs that fills while a producer captures (drops, aborts);
then the tmpfs is grown (remount size=64m) and the SAME command rerun (up to 3 times) until the
producer is done. Every rid written once or named; nothing named twice; no false lost.
usage: python f1_fulldisk.py RUNS [SIZE_K]   (needs root)"""
import sys, signal, random, time, shutil, json, subprocess
from hd10 import *
RUNS = int(sys.argv[1]); import os; FILL = bool(os.environ.get("FILL")); SIZE = sys.argv[2] if len(sys.argv) > 2 else "2m"
MNT = Path("/tmp/hunt-h10/full")
H = 128

def failed(rep):
    return {r for k in ("dropped", "incomplete", "rejected") for r in (rep.get(k) or {})}

def one(seed):
    rng = random.Random(seed)
    MNT.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(MNT)], check=True)
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-h10/work") / f"f1-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    out = MNT / "out"
    reqs = requests(300, seed=seed, tokens=tuple(int(x) for x in os.environ.get("TOK", "6,20,48").split(",")), chunks=tuple(int(x) for x in os.environ.get("CHK", "4,16,64").split(",")))
    sizes = {r: t for r, t, _ in reqs}
    aborts = [r for i, (r, t, c) in enumerate(reqs) if t > c and i % int(os.environ.get("ABORT_EVERY", 6)) == 0]
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"h10f1-{seed}", "consumers": 1,
                      "rate": 120, "interleave": 4, "capacity": int(os.environ.get("CAPK", 512)) << 10, "hidden": H,
                      "policy": "drop", "close_on_stdin": True, "aborts": aborts}, tmp)
    per = []; codes = []; errs = []; hung = []
    try:
        p.wait_event("ready")
        d = start_drain(ep, out, "--flush-every", rng.choice(["8K", "64K", "1M"]), *(["--idle-timeout", "4"] if FILL else []))
        if FILL:
            time.sleep(float(os.environ.get("FILL_AFTER", 0)))
            if not os.environ.get("FILL_AFTER"):
                try: wait_until(lambda: len(set(durable_rids(out))) >= rng.randint(5, 60) or d.poll() is not None, 30, "progress")
                except AssertionError: pass
            subprocess.run(["dd", "if=/dev/zero", f"of={MNT}/filler", "bs=4k"], stderr=subprocess.DEVNULL)
            # keep the disk full while the drain meets it: failures keep coming (drops, aborts)
            try: rc, rep, err = drain_report(d, timeout=40)
            except subprocess.TimeoutExpired:
                hung.append("drain did not exit within 20s on a full disk")
                d.send_signal(signal.SIGINT); rc, rep, err = drain_report(d, timeout=60)
            (MNT / "filler").unlink()
        else:
            rc, rep, err = drain_report(d, timeout=120)
        codes.append(rc); per.append(rep); errs.append(err[-800:])
        (tmp / "d0.json").write_text(json.dumps({"rc": rc, "rep": rep, "err": err}, default=str))
        if not FILL: subprocess.run(["mount", "-o", "remount,size=64m", str(MNT)], check=True)
        for k in range(3):
            d = start_drain(ep, out, "--flush-every", "64K", "--idle-timeout", "2")
            rc, rep, err = drain_report(d, timeout=120)
            codes.append(rc); per.append(rep); errs.append(err[-800:])
            (tmp / f"d{k+1}.json").write_text(json.dumps({"rc": rc, "rep": rep, "err": err}, default=str))
            if p.poll_event("captured") is not None and rc in (0, 3): break
        cap = p.wait_event("captured", 60)
        rids = durable_rids(out); ws = set(rids)
        dups = sorted({r for r in rids if rids.count(r) > 1})
        named_per = [failed(r) | set(r.get("in_flight") or {}) for r in per]
        named = set().union(*named_per) | {d["rid"] for d in report_lines(out)}
        silent = sorted(r for r in sizes if r not in ws and r not in named)
        cnt = {}
        for dd in report_lines(out): cnt[dd["rid"]] = cnt.get(dd["rid"], 0) + 1
        twice_file = sorted(r for r, c in cnt.items() if c > 1)
        seen = {}; twice = set()
        for i, s in enumerate(named_per):
            for r in s & set().union(*[failed(per[i])]):
                if r in seen: twice.add(r)
                seen[r] = i
        w_and_named = sorted(ws & set().union(*[failed(r) for r in per]))
        losts = [l for r in per for l in (r.get("lost") or [])]
        bad = None
        try: verify_shards(out, sizes, hidden=H)
        except Exception as e: bad = None if not ws else repr(e)[:300]
        prob = bool(hung or dups or silent or twice_file or twice or w_and_named or losts or bad)
        print(json.dumps({"seed": seed, "problem": prob, "codes": codes, "written": len(ws),
                          "silent": silent[:10], "n_silent": len(silent), "dups": dups[:5],
                          "twice_in_file": twice_file[:10], "twice_reported": sorted(twice)[:10],
                          "written_and_named": w_and_named[:10], "lost": losts[:3], "bad": bad, "lines": sum(cnt.values()),
                          "hung": hung, "reports_err": ["reports" in e for e in errs], "first_err": errs[0][-300:], "dir": str(tmp),
                          "dropped_at_capture": len(cap["dropped"])}), flush=True)
        shutil.copytree(out, tmp / "out", dirs_exist_ok=True)
        return prob
    finally:
        p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)
        subprocess.run(["umount", str(MNT)])

bad = sum(one(6000 + s) for s in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
