#!/bin/bash
cd /work/main
common="--kind eagle --corpus answers,chat --tokens 262144 --features /tmp/eagle/gen/features --budget 20m"
for arm in B A; do
  init=random; [ $arm = B ] && init=last-block
  echo "== arm $arm (--init $init) $(date -u)"
  .venv/bin/verispec train-drafter $common --init $init --out /tmp/eagle/$arm 2>&1
done
echo "== done $(date -u)"
