# One call on a lent H200: the CUDA path re-checked at this session's code (random weights of the pair's shapes).
cp .gpu/q15/tokenizer.json .gpu/q05/; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
D=benchmarks/results/2026-11-28-h200-cuda-recheck; L=$OUT/run1.log
{ nvidia-smi -L; python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name())"
  python3 -c "import torch; from verispec.models import triton_attention as t; print('triton available:', t.available(torch.device('cuda')))"; } 2>&1 | tee $L
timeout 150 python3 benchmarks/cuda_check.py --target random:.gpu/q15 --draft random:.gpu/q05 --ways "as run" --prompts 4 --new-tokens 64 --out $OUT/cuda_check.json 2>&1 | grep -v Warn | tee -a $L
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_server.py tests/test_triton_attention.py -k "cuda or triton" 2>&1 | tail -3 | tee -a $L
B="python3 -m verispec.cli bench --device cuda --dtype bfloat16 --draft-dtype bfloat16 --target random:.gpu/q15 --draft random:.gpu/q05 --categories code_completion,summarization --limit 1"
timeout 150 $B --synthetic 0.2 --strategies ar,draft,tree,auto,ngram,lookahead --gamma 4 --max-new-tokens 128 --temperature 0 --out /tmp/b1 2>&1 | grep -A12 "greedy: all prompts\|Traceback\|Error" | tee -a $L
timeout 90 python3 benchmarks/results/2026-11-27-h200-cuda-check/make_drafters.py /tmp/gdr 2>&1 | tail -1 | tee -a $L
timeout 120 $B --drafter /tmp/gdr/eagle --drafter /tmp/gdr/medusa --strategies ar,eagle,eagle+ngram,medusa --gamma 3 --max-new-tokens 64 --temperature 0,0.7 --out /tmp/b2 2>&1 | grep -A8 "greedy: all prompts\|temperature 0.7: all prompts\|Traceback\|Error" | tee -a $L
cp /tmp/b1/report.md $OUT/bench-strategies.md; cp /tmp/b2/report.md $OUT/bench-drafters.md; echo done | tee -a $L
