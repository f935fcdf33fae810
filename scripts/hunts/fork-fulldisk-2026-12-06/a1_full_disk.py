"""Area 1: `hscapture drain` into a small tmpfs that fills while a producer keeps capturing.
usage: python a1_full_disk.py RUNS POLICY(wait|drop) SIZE(e.g. 3m) FREE(remount|rmfiller) [ABORTS 0/1] [STILLFULL 0/1]
Drain #1 runs until the disk is full (expect exit 1). Optionally drain #2 while still full.
Then space is freed (remount bigger, or rm a filler file) and a final drain runs to idle.
Check: every requested rid is in the shards exactly once and bit-exact, or named by some
drain's --json report (dropped/incomplete/rejected/in_flight)."""
import sys, subprocess, signal
from he8 import *

RUNS = int(sys.argv[1]); POLICY = sys.argv[2]; SIZE = sys.argv[3]; FREE = sys.argv[4]
ABORTS = int(sys.argv[5]) if len(sys.argv) > 5 else 1
STILLFULL = int(sys.argv[6]) if len(sys.argv) > 6 else 1

def one(seed):
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-e8-work") / f"a1-{POLICY}-{SIZE}-{FREE}-{seed}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    fs = tmp / "fs"; fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(fs)], check=True)
    out = fs / "out"
    if FREE == "rmfiller":
        # leave ~3 MiB of room: the rest is a filler file we delete later
        tot = os.statvfs(fs).f_blocks * os.statvfs(fs).f_frsize
        subprocess.run(["dd", "if=/dev/zero", f"of={fs}/filler", "bs=64k",
                        f"count={max(0, (tot - (3 << 20)) // 65536)}"], capture_output=True)
    reqs = requests(500, seed=seed, tokens=(8, 32, 64), chunks=(8, 16, 64))
    sizes = {r: t for r, t, _ in reqs}
    aborts = [r for i, (r, t, c) in enumerate(reqs) if t > c and i % 7 == 0] if ABORTS else []
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"he8-a1-{seed}",
                      "consumers": 1, "rate": 300, "hidden": 128, "interleave": 4,
                      "capacity": (1 << 20) if POLICY == "drop" else (2 << 20),
                      "policy": POLICY, "wait_timeout_s": 30.0 if POLICY == "wait" else 0.0,
                      "close_on_stdin": True, "aborts": aborts, "seed": seed}, tmp)
    reported = set(); codes = []; errs = []
    try:
        p.wait_event("ready")
        rc, rep, err = drain_report(start_drain(ep, out, "--flush-every", "32K", "--shard-size", "64M", "--idle-timeout", "4"), timeout=120)
        codes.append(rc); reported |= reported_rids(rep); errs.append(err[-600:])
        (tmp / "drain1.txt").write_text(json.dumps({"rc": rc, "rep": rep, "err": err}, default=str))
        if STILLFULL:
            time.sleep(0.5)
            rc, rep, err = drain_report(start_drain(ep, out, "--flush-every", "32K", "--shard-size", "64M", "--idle-timeout", "4"), timeout=120)
            codes.append(rc); reported |= reported_rids(rep); errs.append(err[-600:])
            (tmp / "drain2.txt").write_text(json.dumps({"rc": rc, "rep": rep, "err": err}, default=str))
        if FREE == "remount":
            subprocess.run(["mount", "-o", "remount,size=256m", str(fs)], check=True)
        else:
            os.unlink(fs / "filler")
        final = start_drain(ep, out, "--idle-timeout", "3")
        p.wait_event("captured", timeout=120)
        rc, rep, err = drain_report(final, timeout=120)
        codes.append(rc); reported |= reported_rids(rep); errs.append(err[-600:])
        (tmp / "drainF.txt").write_text(json.dumps({"rc": rc, "rep": rep, "err": err}, default=str))
        rids = durable_rids(out)
        dups = sorted({r for r in rids if rids.count(r) > 1})
        missing = set(sizes) - set(rids)
        silent = sorted(missing - reported)
        written_aborted = sorted(set(aborts) & set(rids))
        bad = None
        try:
            verify_shards(out, sizes, hidden=128)
        except Exception as e:
            bad = repr(e)[:300]
        prob = bool(dups or silent or written_aborted or bad)
        print(json.dumps({"seed": seed, "problem": prob, "written": len(set(rids)), "missing": len(missing),
                          "reported": len(reported & missing), "silent": silent[:20], "n_silent": len(silent),
                          "silent_in_reports_jsonl": sorted(set(silent) & reports_jsonl(out))[:10],
                          "dups": dups[:10], "written_aborted": written_aborted[:10], "bad": bad,
                          "codes": codes, "errs_first": [e.strip().splitlines()[-1] if e.strip() else "" for e in errs],
                          "dropped_at_capture": len(p.poll_event('captured')['dropped']), "tmp": str(tmp)}), flush=True)
        return prob
    finally:
        p.send(); p.stop()
        subprocess.run(["umount", "-l", str(fs)], capture_output=True)
        shutil.rmtree(epd, ignore_errors=True)

bad = 0
for s in range(RUNS):
    bad += one(2000 + s)
print(f"RESULT {bad}/{RUNS} runs with problems")
