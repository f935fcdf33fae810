"""Area 4: many Subscribers created and closed (and one closed from another thread); count threads and fds."""
import sys, threading, gc
from he8 import *
from hscapture import Subscriber, Producer
ep, epd = new_ep()
p = Producer(ep, producer_id="he8-a4leak", capacity=1 << 20)
def nfd(): return len(os.listdir("/proc/self/fd"))
base = (threading.active_count(), nfd())
for i in range(150):
    s = Subscriber(ep); s.wait_ready(5); s.close()
after_close = (threading.active_count(), nfd())
for i in range(50):
    s = Subscriber(ep); s.wait_ready(5); del s
gc.collect(); time.sleep(0.5)
after_gc = (threading.active_count(), nfd())
# used from one thread, closed from another
box = {}
t = threading.Thread(target=lambda: box.setdefault("s", Subscriber(ep)).wait_ready(5)); t.start(); t.join()
tensors, ids = source("x1", 8)
p.capture("x1", tensors, layers=[0, 1], token_ids=ids); p.flush()
got = box["s"].get("x1", timeout=5)
t2 = threading.Thread(target=box["s"].close); t2.start(); t2.join(10)
print(json.dumps({"base": base, "after_150_close": after_close, "after_50_gc": after_gc,
                  "cross_thread_close_done": not t2.is_alive(), "got": got.rid,
                  "final": (threading.active_count(), nfd())}))
p.close(); shutil.rmtree(epd, ignore_errors=True)
