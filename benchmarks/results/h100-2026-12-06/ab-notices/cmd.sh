python3 benchmarks/bench_delivery.py --entries 1500 --reps 5 2>&1 | tail -1
timeout 100 python3 benchmarks/bench_gpu.py notices --notices 30000 --paced-seconds 0.5 --out-dir /tmp/nt-$$ 2>&1 | grep -E "goal|burst|error|Error" | head -12
