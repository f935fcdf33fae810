"""A second Ctrl-C that lands after the drain marked reports.jsonl "reported" but before its
report was printed: the failures the drain read (aborted samples here) are named by no report,
and the next drain into the directory treats them as already reported.

usage: python s1b_double_ctrl_c.py RUNS [DELAY_S]
  DELAY_S unset: the second SIGINT is sent as soon as reports.jsonl ends with a "reported"
  line (watching the file); else DELAY_S after the first SIGINT (a human double Ctrl-C).
"""
import sys, signal, time, shutil, json
from pathlib import Path
from hd7 import *

RUNS = int(sys.argv[1]); DELAY = float(sys.argv[2]) if len(sys.argv) > 2 else None

def one(i):
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-d7-work") / f"s1b-{i}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    out = tmp / "out"
    # 40 requests of 20 tokens in 4-token chunks; 10 of them aborted after the first chunk
    reqs = [[f"r-{k}", 20, 4] for k in range(40)]
    aborts = [f"r-{k}" for k in range(0, 40, 4)]
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"hd7-s1b-{i}",
                      "consumers": 1, "interleave": 4, "capacity": 4 << 20, "policy": "drop",
                      "close_on_stdin": True, "aborts": aborts}, tmp)
    try:
        p.wait_event("ready")
        d = start_drain(ep, out)
        p.wait_event("captured", timeout=30)
        wait_until(lambda: len(set(durable_rids(out))) >= 30, 20, "30 written")
        time.sleep(1.5)   # the drain records the failures (reports.jsonl) at its next flush
        d.send_signal(signal.SIGINT)
        rj = out / "reports.jsonl"
        if DELAY is None:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:
                if rj.exists() and '"reported"' in rj.read_text().strip().splitlines()[-1]:
                    break
                time.sleep(0.0005)
        else:
            time.sleep(DELAY)
        if d.poll() is None:
            d.send_signal(signal.SIGINT)
        rc1, rep1, err1 = drain_report(d)
        d2 = start_drain(ep, out, "--idle-timeout", "1.5")
        rc2, rep2, err2 = drain_report(d2)
        named = reported_rids(rep1) | reported_rids(rep2)
        written = set(durable_rids(out))
        silent = sorted(set(aborts) - named - written)
        res = {"run": i, "first_rc": rc1, "first_printed_report": bool(rep1),
               "first_stderr_tail": err1.strip().splitlines()[-1:] if err1 else [],
               "second_rc": rc2, "second_reported_from_earlier": rep2.get("reported_from_earlier_drain"),
               "written": len(written), "aborted": len(aborts),
               "named_by_a_report": len(set(aborts) & named), "silent": silent,
               "in_reports_jsonl": sorted(set(silent) & reports_jsonl(out))}
        print(json.dumps(res), flush=True)
        return bool(silent)
    finally:
        p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)

bad = sum(one(i) for i in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
