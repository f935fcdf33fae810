"""Pure pyzmq check of the mechanism behind s2: a SUB whose PUB peer restarts (same ipc path)
while the SUB's thread makes no zmq call receives nothing the new PUB sends meanwhile."""
import zmq, time, os, threading, sys
path = "/tmp/hunt-d7-zmqtest.sock"
os.makedirs(os.path.dirname(path), exist_ok=True)
ep = "ipc://" + path
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB); sub.setsockopt(zmq.RCVHWM, 0); sub.setsockopt(zmq.SUBSCRIBE, b"")
pub = ctx.socket(zmq.PUB); pub.bind(ep)
sub.connect(ep); time.sleep(0.3)
pub.send(b"inc1"); time.sleep(0.1)
print("got", sub.recv(zmq.NOBLOCK))
touch = len(sys.argv) > 1
pub.close(0); time.sleep(0.3)
pub2 = ctx.socket(zmq.PUB); pub2.bind(ep)
for i in range(20):          # inc2 lives 2 s, sending every 0.1 s
    pub2.send(b"inc2-%d" % i); time.sleep(0.1)
    if touch: sub.getsockopt(zmq.EVENTS)   # any zmq call on the SUB processes its commands
n = 0
while True:
    try: sub.recv(zmq.NOBLOCK); n += 1
    except zmq.Again: break
print("touch" if touch else "idle", "received of inc2:", n, "of 20")
pub2.close(0); sub.close(0); ctx.term()
