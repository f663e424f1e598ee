cp .gpu/q15/tokenizer.json .gpu/q05/; set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
L=$OUT/run6.log; { nvidia-smi -L; python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name())"; } 2>&1 | tee $L
python3 -c "import torch; from verispec.models import triton_attention as t; print('available:', t.available(torch.device('cuda')))" 2>&1 | tail -2 | tee -a $L
timeout 130 python3 benchmarks/cuda_check.py --target random:.gpu/q15 --draft random:.gpu/q05 --ways "as run,one-query-calls" --prompts 2 --new-tokens 48 --out $OUT/run6-cuda_check_bf16.json 2>&1 | grep -v Warn | tee -a $L
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_server.py -k cuda 2>&1 | tail -3 | tee -a $L
timeout 110 python3 -m verispec.cli bench --device cuda --dtype bfloat16 --draft-dtype bfloat16 --target random:.gpu/q15 --draft random:.gpu/q05 --synthetic 0.2 --strategies ar,draft,tree,auto,ngram,lookahead --gamma 4 --categories code_completion,summarization --limit 1 --max-new-tokens 128 --temperature 0 --out /tmp/bench 2>&1 | grep -A12 "greedy: all prompts" | tee -a $L
cp /tmp/bench/report.json $OUT/run6-bench-report.json; cp /tmp/bench/report.md $OUT/run6-bench-report.md; echo done | tee -a $L
