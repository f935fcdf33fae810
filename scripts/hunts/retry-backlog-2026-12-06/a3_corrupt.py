"""Area 3: corrupt a committed ring entry (data byte / meta length) while the durable drain is away, then resume.
usage: python a3_corrupt.py WHAT RUNS   WHAT: data | meta"""
import sys, struct, signal, time
from hd10 import *
import subprocess as _sp, threading as _th, glob
WHAT, RUNS = sys.argv[1], int(sys.argv[2])
def one(k):
    ep, epd = new_ep(); tmp = Path("/tmp/hunt-h11/work") / f"a3-{WHAT}-{k}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True); out = tmp / "out"
    pid = f"h11a3-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONPATH="/work/main")
    pp = _sp.Popen([sys.executable, "a3_prod.py", json.dumps({"endpoint": ep, "pid": pid})], stdin=_sp.PIPE, stdout=_sp.PIPE, stderr=open(tmp / "prod.err", "w"), text=True, env=env)
    assert json.loads(pp.stdout.readline())["event"] == "ready"
    d = start_drain(ep, out); 
    wait_until(lambda: any(Path(os.environ["HSCAPTURE_SUBS_DIR"]).rglob("*")), 10, "name recorded")
    time.sleep(1.0)  # attach (not a conclusion)
    d.send_signal(signal.SIGKILL); drain_report(d)
    pp.stdin.write("go\n"); pp.stdin.flush(); assert json.loads(pp.stdout.readline())["event"] == "captured"
    seg = [f for f in glob.glob(f"/dev/shm/*{pid.replace('-', '_')}*") + glob.glob(f"/dev/shm/*{pid}*")][0]
    buf = bytearray(open(seg, "rb").read())
    data_off = struct.unpack_from("<Q", buf, 32)[0]
    target = None; pos = data_off
    i = buf.find(b"c-3", data_off)
    rec = buf.rfind(struct.pack("<I", 0x44524352), data_off, i) - 4
    plen = struct.unpack_from("<Q", buf, rec + 24)[0]; pay = rec + 64
    mlen = struct.unpack_from("<I", buf, pay)[0]
    with open(seg, "r+b") as f:
        if WHAT == "data":
            at = pay + ((4 + mlen + 63) // 64) * 64 + 1   # first block, first bf16's high byte
            f.seek(at); f.write(bytes([buf[at] ^ 0x40]))
        else:
            f.seek(pay); f.write(struct.pack("<I", 0xFFFFFF))
    d2 = start_drain(ep, out, "--idle-timeout", "2")
    rc, rep, err = drain_report(d2)
    pp.stdin.write("x\n"); pp.stdin.flush(); pp.wait(10)
    ws = durable_rids(out)
    try: verify_shards(out, {f"c-{i}": 8 for i in range(10)}); bad = None
    except Exception as e: bad = str(e)[:200]
    named = reported_rids(rep); lost = rep.get("lost")
    missing = [f"c-{i}" for i in range(10) if f"c-{i}" not in ws and f"c-{i}" not in named]
    prob = bool(bad) or (not lost and missing != []) or ("c-3" in ws and bad is not None)
    print(json.dumps({"k": k, "what": WHAT, "problem": prob, "rc": rc, "written": sorted(set(ws)), "bad_bytes": bad,
                      "named": sorted(named), "lost": lost, "silent_missing": missing, "err": err[-300:], "dir": str(tmp)}), flush=True)
    shutil.rmtree(epd, ignore_errors=True)
    return prob
n = sum(one(k) for k in range(RUNS)); print(f"RESULT {n}/{RUNS} runs with problems")
