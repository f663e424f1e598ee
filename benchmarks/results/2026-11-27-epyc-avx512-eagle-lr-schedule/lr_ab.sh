#!/bin/bash
cd /work/main
F=~/.cache/verispec/drafters/eagle-answers/features
for arm in ctl:constant cos:cosine; do
  d=${arm%%:*}; s=${arm##*:}
  echo "== $d $s $(date -u +%H:%M:%S)"
  .venv/bin/verispec train-drafter --kind eagle --corpus answers,chat --tokens 524288 --budget 132m --depth 3 \
    --features $F --out /tmp/s36/$d --lr-schedule $s > /tmp/s36/$d.stdout 2> /tmp/s36/$d.log
  echo "rc $? $(date -u +%H:%M:%S)"
done
