#!/bin/bash
# a_batch.sh: runs of a_run.py over modes get/batch x zero_copy 0/1
cd /tmp/hunt-h20
for r in 1 2; do for m in get batch; do for z in 0 1; do
  NRID=500 RATE=120 timeout 300 /work/main/.venv/bin/python a_run.py $m $z 6
done; done; done
