#!/bin/bash
cd /work/main
for arm in constant cosine; do
  echo "== $arm $(date -u +%H:%M:%S)"
  rm -rf /tmp/s36/fresh-$arm
  .venv/bin/verispec train-drafter --kind eagle --corpus answers --tokens 262144 --budget 12m \
    --features /tmp/s35/feat1 --out /tmp/s36/fresh-$arm --lr-schedule $arm > /tmp/s36/fresh-$arm.stdout 2> /tmp/s36/fresh-$arm.log
  echo "rc $? $(date -u +%H:%M:%S)"
done
