# Run 2: where run 1's one differing prompt parts (diag.py).
cp .gpu/q15/tokenizer.json .gpu/q05/; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 230 python3 benchmarks/results/2026-11-28-h200-cuda-recheck/diag.py 2>&1 | grep -v Warn | tee $OUT/run2.log
