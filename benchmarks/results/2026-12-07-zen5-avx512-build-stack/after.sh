#!/bin/bash
# run after the four sittings, one thing at a time
cd "$(dirname "$0")"
V=/work/main/.venv/bin
date -u  # times of each step
$V/python /work/main/benchmarks/profile_round.py --dtypes w4a8 --draft-vocab 65536 --strategies ar,auto \
    --gamma 6 --limit 3 --categories code_completion,code_instruct,code_edit > profile_round_code.md 2> profile_round.log
date -u  # times of each step
$V/verispec bench --strategies ar --categories code_completion --limit 1 --max-new-tokens 32 --costs --out costs > costs.log 2>&1
date -u  # times of each step
