cp .gpu/q15/tokenizer.json .gpu/q05/; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
L=$OUT/run9.log; V="python3 -m verispec.cli"; M="--target random:.gpu/q15 --device cuda --dtype bfloat16"
T="$V train-drafter $M --tokens 8192 --max-new-tokens 64 --corpus answers --depth 2 --out /tmp/tdr"
{ timeout 50 $T --budget 15s 2>&1 | grep -v "Warn\|it/s\]" | tail -3; timeout 35 $T --budget 20s 2>&1 | grep -v "Warn\|it/s\]" | tail -2
  G="$V generate $M --draft random:.gpu/q05 --draft-dtype bfloat16 --max-new-tokens 32 --json"
  for s in "ar" "eagle --drafter /tmp/tdr --gamma 3"; do timeout 25 $G --strategy $s "def f(x):" 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin); print('$s'.split()[0], len(r['token_ids']), hash(tuple(r['token_ids'])), r['metrics']['drafted_tokens'])"; done; } 2>&1 | tee $L
