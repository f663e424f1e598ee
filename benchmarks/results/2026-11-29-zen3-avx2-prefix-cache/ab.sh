#!/usr/bin/env bash
# servers alternately without (--prefix-cache-mb 0) and with the prefix cache (the default, 256 MB), 2 starts each
cd /work/main
for round in 1 2; do
  for mb in 0 256; do
    (.venv/bin/verispec serve --port 8732 --prefix-cache-mb $mb --log-level warning > /tmp/serve_$mb.log 2>&1 &)
    for i in $(seq 1 240); do curl -sf localhost:8732/health >/dev/null && break; sleep 1; done
    echo "== round $round prefix-cache-mb $mb $(date -u +%H:%M:%S)"
    .venv/bin/python benchmarks/results/2026-11-29-zen3-avx2-prefix-cache/conv.py http://127.0.0.1:8732
    pkill -f "serve --port 8732"; sleep 3
  done
done
