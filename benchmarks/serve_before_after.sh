#!/usr/bin/env bash
# Server throughput of two checkouts in one sitting, interleaved: for each round and each checkout, start
# `verispec serve` with the same flags, run benchmarks/serve_load.py at 1, 4 and 8 clients, stop it.
#   benchmarks/serve_before_after.sh BEFORE_DIR AFTER_DIR OUT_DIR [ROUNDS] [serve flags...]
# Each checkout runs with PYTHONPATH pointing at it (same venv, same model cache). Prints one JSON line per run.
set -euo pipefail
before=$1; after=$2; out=$3; rounds=${4:-2}; shift 4 || true
flags=("$@")
py=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
load=$(cd "$(dirname "$0")" && pwd)/serve_load.py
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for label in before after; do
    dir=$before; [ "$label" = after ] && dir=$after
    port=$((8100 + r))
    (cd "$dir" && PYTHONPATH="$dir" exec "$py" -m verispec.cli serve --port "$port" --log-level warning "${flags[@]}") \
      > "$out/server-$label-$r.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
    for clients in 1 4 8; do
      line=$("$py" "$load" --url "http://127.0.0.1:$port" --clients "$clients" --requests 2 --max-tokens 64 --json)
      echo "{\"code\": \"$label\", \"round\": $r, \"clients\": $clients, \"result\": $line}" | tee -a "$out/runs.jsonl"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
