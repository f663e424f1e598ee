#!/bin/bash
# Run after the four 45-prompt sittings, one thing at a time: a round's profile on 9 code prompts, then the cost curve.
set -e
cd "$(dirname "$0")"
ROOT=../../..
date -u
python "$ROOT/benchmarks/profile_round.py" --dtypes w4a8 --draft-vocab 65536 --strategies ar,auto \
    --gamma 6 --limit 3 --categories code_completion,code_instruct,code_edit > profile_round_code.md 2> profile_round.log
date -u
verispec bench --strategies ar --categories code_completion --limit 1 --max-new-tokens 32 --costs --out costs > costs.log 2>&1
date -u
