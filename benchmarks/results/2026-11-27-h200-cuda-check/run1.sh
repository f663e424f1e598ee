set -o pipefail; export PYTHONUNBUFFERED=1; cp .gpu/q15/tokenizer.json .gpu/q05/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
L=$OUT/run.log; { nvidia-smi -L; python3 -c "import torch,transformers;print(torch.__version__,transformers.__version__,torch.cuda.get_device_name())"; } 2>&1 | tee $L
timeout 90 python3 -m pytest -q -p no:cacheprovider -x tests/test_server.py -k cuda 2>&1 | tail -15 | tee -a $L
timeout 170 python3 benchmarks/cuda_check.py --target random:.gpu/q15 --draft random:.gpu/q05 --out $OUT/cuda_check_bf16.json 2>&1 | tee -a $L
timeout 70 python3 benchmarks/cuda_check.py --dtype float32 --prompts 2 --target random:.gpu/q15 --draft random:.gpu/q05 --out $OUT/cuda_check_f32.json 2>&1 | tee -a $L
timeout 170 python3 -m verispec.cli bench --device cuda --dtype bfloat16 --draft-dtype bfloat16 --target random:.gpu/q15 --draft random:.gpu/q05 --synthetic 0.2 --strategies ar,draft,tree,auto,ngram,lookahead --gamma 4 --categories code_completion,summarization --limit 1 --max-new-tokens 128 --temperature 0 --costs --out /tmp/bench 2>&1 | tail -45 | tee -a $L
cp /tmp/bench/report.json /tmp/bench/report.md $OUT/ 2>/dev/null; echo done | tee -a $L
