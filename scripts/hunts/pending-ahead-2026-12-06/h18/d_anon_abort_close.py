"""d_anon_abort_close.py: an anonymous Subscriber closes with an aborted sample's first chunk and its abort
entry unread (or read): is the aborted rid named 'undelivered' (a committed sample never handed out)?"""
import os, sys, json, time, uuid, logging
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
from pathlib import Path
import torch, hscapture
logging.basicConfig(level=logging.WARNING)
res = {}
for case in ("unread", "read_abort_first"):
    tag = uuid.uuid4().hex[:6]; d = Path("/tmp/hunt-h18/ep") / tag; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
    p = hscapture.Producer(ep, producer_id=f"h18-dac-{tag}", capacity=1 << 20, heartbeat_interval_s=0.05)
    s = hscapture.Subscriber(ep); s.wait_ready(timeout=20)
    x = [torch.ones(4, 32, dtype=torch.bfloat16)] * 2; ids = torch.arange(4)
    p.capture("whole-1", x, layers=[0, 1], token_ids=ids)
    p.capture("ab-1", x, layers=[0, 1], token_ids=ids, token_start=0, is_last_chunk=False)
    p.abort("ab-1", "test abort"); p.capture("whole-2", x, layers=[0, 1], token_ids=ids); p.flush(); time.sleep(0.3)
    got = []
    if case == "read_abort_first":
        for _ in range(40):
            smp = s.poll(0.05)
            if smp is not None: got.append(smp.rid); smp.release()
    skim = s.skim_unread() if case == "unread" else None
    st = s.stats()
    res[case] = {"got": got, "skim_unread": skim, "failures": [f[:2] for f in s.failures()], "dropped": st["dropped"], "incomplete": st["incomplete"], "undelivered_before_close": st["undelivered"]}
    s.close(); st = s.stats() if False else None
    res[case]["undelivered_after_close"] = list(s._undelivered)
    p.close()
print(json.dumps(res, indent=1))
