#!/bin/bash
# b_batch.sh: modes x seeds, KILL_ON_UNPIN on even seeds
cd /tmp/hunt-h19
for seed in 2 3 4; do for mode in periodic never get; do
  if [ $((seed % 2)) = 0 ]; then K=1; else K=; fi
  SEED=$seed MODE=$mode KILL_ON_UNPIN=$K KILLS=4 env -u PYTHONPATH timeout 300 /work/main/.venv/bin/python b_run.py 2>&1 | tail -1
done; done
