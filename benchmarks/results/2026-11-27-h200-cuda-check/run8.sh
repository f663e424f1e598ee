cp .gpu/q15/tokenizer.json .gpu/q05/; set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
L=$OUT/run8.log; nvidia-smi -L | tee $L
V="python3 -m verispec.cli"; M="--target random:.gpu/q15 --device cuda --dtype bfloat16"
T="$V train-drafter $M --tokens 8192 --max-new-tokens 64"
{ echo "== eagle, answers, depth 2"; timeout 120 $T --corpus answers --budget 30s --depth 2 --out /tmp/tdr 2>&1 | grep -v "Warn\|it/s\]" | tail -4
  echo "== resume"; timeout 90 $T --corpus answers --budget 45s --depth 2 --out /tmp/tdr 2>&1 | grep -v "Warn\|it/s\]" | tail -3
  echo "== medusa on the same features"; timeout 90 $T --kind medusa --corpus answers --budget 15s --features /tmp/tdr/features --out /tmp/tmd 2>&1 | grep -v "Warn\|it/s\]" | tail -2
  echo "== eagle, stdlib corpus"; timeout 90 $T --corpus stdlib --budget 10s --out /tmp/tst 2>&1 | grep -v "Warn\|it/s\]" | tail -2
  G="$V generate $M --draft random:.gpu/q05 --draft-dtype bfloat16 --max-new-tokens 48 --json"
  for s in "ar" "eagle --drafter /tmp/tdr --gamma 3" "eagle --drafter /tmp/tdr --eagle-tree 2,3 --gamma 5" "medusa --drafter /tmp/tmd --gamma 3"; do
    timeout 60 $G --strategy $s "def quicksort(arr):" 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin); print('$s'.split()[0], len(r['token_ids']), hash(tuple(r['token_ids'])), r['metrics']['accepted_tokens'], r['metrics']['drafted_tokens'])"
  done; } 2>&1 | tee -a $L
echo done | tee -a $L
