#!/bin/bash
# runs once the training process has exited; one thing at a time
cd /work/main
while pgrep -f "verispec train-drafter" >/dev/null; do sleep 20; done
date -u > /tmp/eagle2x/t_ab_start
D=~/.cache/verispec/drafters
.venv/bin/python benchmarks/drafter_ab.py $D/eagle-zen5-786k $D/eagle-zen5 code_completion,code_instruct,code_edit,math 10 2,3 > /tmp/eagle2x/ab.txt 2>&1
date -u > /tmp/eagle2x/t_sweep_start
.venv/bin/python benchmarks/drafter_ab.py - $D/eagle-zen5 code_completion,code_instruct,code_edit,math 5 2,3,4~0.5,6~0.5,8~0.5 > /tmp/eagle2x/sweep.txt 2>&1
date -u > /tmp/eagle2x/t_bench_start
best=$(grep "^B " /tmp/eagle2x/sweep.txt | sed -E 's/.*gamma ([0-9~.]+): ([0-9.]+) tok.*/\2 \1/' | sort -rn | head -1 | awk '{print $2}')
g=${best%%~*}
echo "best $best" > /tmp/eagle2x/best.txt
conf=""; [[ "$best" == *~* ]] && conf="--draft-confidence ${best##*~}"
.venv/bin/verispec bench --strategies ar,auto,eagle --gamma 6,eagle:$g $conf --drafter $D/eagle-zen5 \
    --temperature 0,0.7 --limit 5 --max-new-tokens 128 --out /tmp/eagle2x/half > /tmp/eagle2x/bench.log 2>&1
date -u > /tmp/eagle2x/t_done
