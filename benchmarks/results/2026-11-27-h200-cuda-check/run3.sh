cp .gpu/q15/tokenizer.json .gpu/q05/; set -o pipefail; export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
L=$OUT/call1.log; { nvidia-smi -L; python3 -c "import torch;print(torch.__version__,torch.cuda.get_device_name())"; } 2>&1 | tee $L
timeout 200 python3 benchmarks/cuda_check.py --target random:.gpu/q15 --draft random:.gpu/q05 --no-timing --no-identity --out $OUT/cuda_check_ways.json \
  --ways "as run,as run,math,flash,efficient,cudnn,deterministic,linear,linear&math,unfused-bias&math,linear+norm&math" 2>&1 | tee -a $L
timeout 90 python3 .gpu/ar_vs_ngram.py random:.gpu/q15 2>&1 | grep -v Warning | tee -a $L
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_server.py -k cuda 2>&1 | tail -15 | tee -a $L
echo done | tee -a $L
