#!/usr/bin/env bash
# alternate servers: old (HEAD: one prefill a request) and new (working tree: admitted together), 3 rounds each
cd /work/main
for round in 1 2 3; do
  for which in old new; do
    if [ $which = old ]; then tree=/tmp/oldtree; else tree=/work/main; fi
    (cd $tree && PYTHONPATH=$tree /work/main/.venv/bin/python -m verispec.cli serve --port 8731 --log-level warning > benchmarks/results/2026-11-29-zen3-avx2-server-admission/serve_$which.log 2>&1 &)
    for i in $(seq 1 240); do curl -sf localhost:8731/health >/dev/null && break; sleep 1; done
    echo "== round $round $which $(date -u +%H:%M:%S)"
    /work/main/.venv/bin/python benchmarks/results/2026-11-29-zen3-avx2-server-admission/burst.py http://127.0.0.1:8731 3
    pkill -f "verispec.cli serve --port 8731"; sleep 3
  done
done
