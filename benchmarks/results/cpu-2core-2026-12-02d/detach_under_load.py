# Sample.detach's copy: torch clone vs a numpy copy of an 8 MB bf16 tensor, idle and with both cores
# of the CPU machine busy (2 spinning processes). python benchmarks/results/cpu-2core-2026-12-02d/detach_under_load.py
import time, torch, numpy as np, multiprocessing as mp, sys
def hog():
    x = 0
    while True: x += 1
if __name__ == "__main__":
    a = torch.randn(4096, 1024).bfloat16()  # 8 MB
    def t_clone(): return a.clone()
    def t_np():
        return torch.from_numpy(np.array(a.view(torch.uint8).numpy(), copy=True)).view(torch.bfloat16)
    for load in (0, 2):
        ps = [mp.Process(target=hog, daemon=True) for _ in range(load)]
        [p.start() for p in ps]
        time.sleep(0.5)
        for name, f in (("clone", t_clone), ("numpy", t_np)):
            ts = []
            for _ in range(30):
                t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
            ts.sort(); print(load, name, "p50 %.2f ms p90 %.2f max %.2f" % (ts[15]*1e3, ts[27]*1e3, ts[-1]*1e3), "threads", torch.get_num_threads())
        [p.terminate() for p in ps]
