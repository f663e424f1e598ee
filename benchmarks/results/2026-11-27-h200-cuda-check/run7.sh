cp .gpu/q15/tokenizer.json .gpu/q05/; set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
L=$OUT/run7.log; { nvidia-smi -L; python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name())"; } 2>&1 | tee $L
timeout 90 python3 benchmarks/results/2026-11-27-h200-cuda-check/make_drafters.py /tmp/gdr 2>&1 | tail -1 | tee -a $L
B="python3 -m verispec.cli bench --device cuda --dtype bfloat16 --draft-dtype bfloat16 --target random:.gpu/q15 --draft random:.gpu/q05 --drafter /tmp/gdr/eagle --drafter /tmp/gdr/medusa --categories code_completion,summarization --limit 1 --max-new-tokens 64"
timeout 150 $B --strategies ar,eagle,eagle+ngram,medusa --gamma 3 --temperature 0,0.7 --out /tmp/b1 2>&1 | grep -A8 "greedy: all prompts\|temperature 0.7: all prompts\|Traceback\|Error" | tee -a $L
timeout 100 $B --strategies ar,eagle --eagle-tree 2,3 --gamma 5 --temperature 0 --out /tmp/b2 2>&1 | grep -A6 "greedy: all prompts\|Traceback\|Error" | tee -a $L
cp /tmp/b1/report.md $OUT/run7-bench-chain.md; cp /tmp/b2/report.md $OUT/run7-bench-tree.md; echo done | tee -a $L
