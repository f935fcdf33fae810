"""c_ro.py: HSCAPTURE_SUBS_DIR on a private tmpfs (/tmp/hunt-h19/ro). A durable b_sub.py (periodic mode, ACK_S=30:
records+acknowledges effectively never) is SIGSTOPped 3 s under a drop ring, the tmpfs is remounted read-only
(MODE=ro) or filled (MODE=full), SIGCONT: holds are given back while the pending file cannot be written;
then SIGKILL after the give-back; remount rw / free space; final resumer until idle.
Checks: tracebacks, the error naming rids, producer stall, silent rids vs rids named in the error."""
import os, sys, json, time, signal, subprocess, uuid, random, threading, collections, re
from pathlib import Path
MODE = os.environ.get("MODE", "ro"); seed = int(os.environ.get("SEED", 1)); rng = random.Random(seed)
RO = "/tmp/hunt-h19/ro"
subprocess.run(["umount", RO], stderr=subprocess.DEVNULL); os.makedirs(RO, exist_ok=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k" if MODE in ("full", "nearfull") else "size=4m", "tmpfs", RO], check=True)
env = dict(os.environ); env.pop("PYTHONPATH", None); env["HSCAPTURE_SUBS_DIR"] = RO
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
tag = uuid.uuid4().hex[:6]
d = Path("/tmp/hunt-h19/ep") / tag; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
w = Path("/tmp/hunt-h19/work") / f"c-{MODE}-{seed}-{tag}"; w.mkdir(parents=True); (w / "got.txt").touch()
spec = {"ep": ep, "pid": f"h19-c-{tag}", "cap": 256 << 10, "rate": 1500.0, "dur": 12.0}
prod = subprocess.Popen([py, str(here / "c_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(w / "prod.err", "w"), text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
name = f"h19-c{tag}"
def start(*extra, ack="30"):
    e = dict(env); e["ACK_S"] = ack
    return subprocess.Popen([py, str(here / "b_sub.py"), ep, name, str(w), "periodic", *extra], stdout=open(w / "sub.out", "a"), stderr=open(w / "sub.err", "a"), env=e)
def unpins(): p = w / "unpin.log"; return p.read_text().count("UNPIN") if p.exists() else 0
done = {}; t_start = time.monotonic(); threading.Thread(target=lambda: (done.update(json.loads(prod.stdout.readline())), done.update(t_done=time.monotonic() - t_start)), daemon=True).start()
s = start(); time.sleep(1.0)
s.send_signal(signal.SIGSTOP); time.sleep(3.0)
if MODE == "ro":
    subprocess.run(["mount", "-o", "remount,ro", RO], check=True)
else:
    subprocess.run(["dd", "if=/dev/zero", f"of={RO}/filler", "bs=4k", "count=1000"], stderr=subprocess.DEVNULL)
    if MODE == "nearfull":   # leave FREE bytes (pages) free: a spill larger than that is a short write
        sz = os.path.getsize(f"{RO}/filler"); os.truncate(f"{RO}/filler", sz - int(os.environ.get("FREE", 8192)))
s.send_signal(signal.SIGCONT); n0 = unpins(); t0 = time.monotonic()
while time.monotonic() - t0 < 4 and unpins() <= n0: time.sleep(0.005)
time.sleep(1.0)
alive = s.poll() is None
s.send_signal(signal.SIGKILL); s.wait()
import shutil
for x in os.listdir(RO):
    if x.startswith("hscapture.pending") and not x.endswith(".lock"): shutil.copy(f"{RO}/{x}", w / "pending_after_kill")
if MODE == "ro": subprocess.run(["mount", "-o", "remount,rw", RO], check=True)
else: os.unlink(f"{RO}/filler")
while not done: time.sleep(0.1)
final = start("4", ack="0.1"); final.wait(120)
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(30)
res = done["res"]
got = collections.Counter(l.split()[0] for l in (w / "got.txt").read_text().split("\n") if l)
fails = [json.loads(l) for l in (w / "fails.jsonl").read_text().split("\n") if l] if (w / "fails.jsonl").exists() else []
named = {f["rid"] for f in fails if f["kind"] != "ended"}
err = (w / "sub.err").read_text()
logged = set(re.findall(r"'(s-\d+)'", "\n".join(l for l in err.splitlines() if "cannot record" in l)))
silent = sorted((r for r in res if r not in got and r not in named), key=lambda r: int(r[2:]))
pl = [l for l in (w / "sub.err").read_text().splitlines()]
print(json.dumps({"mode": MODE, "pending_file_at_end": (open(f"{RO}/" + [x for x in os.listdir(RO) if x.startswith("hscapture.pending")][0], "rb").read()[-300:].decode("latin1") if any(x.startswith("hscapture.pending") for x in os.listdir(RO)) else None), "n": done["n"], "t_done": round(done["t_done"], 2), "sub_alive_at_kill": alive, "unpins": unpins(),
                  "delivered": len(got), "named": len(named), "silent": len(silent), "silent_rids": silent[:8],
                  "silent_not_logged": sorted(set(silent) - logged, key=lambda r: int(r[2:]))[:8], "n_silent_not_logged": len(set(silent) - logged),
                  "logged_rids": len(logged), "tracebacks": err.count("Traceback"), "err_lines": [l[:300] for l in err.splitlines() if "hscapture" in l][:6],
                  "prod_err": (w / "prod.err").read_text()[-600:], "dir": str(w)}), flush=True)
subprocess.run(["umount", RO])
