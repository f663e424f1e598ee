#!/bin/bash
# Alternated processes, 8 rounds: the kernel before (HEAD_TREE: a checkout of 0d85633), with the vector activation
# quantization (QUANT_TREE: fabc0be), and with the 8-bit step/offset codes as well (this checkout, 12d9d30).
# Each prints one line of fwd.py (read bandwidth, then median ms of draft / target forwards over a 300-token cache).
here="$(cd "$(dirname "$0")" && pwd)"; repo="$(cd "$here/../../.." && pwd)"
for i in 1 2 3 4 5 6 7 8; do
  echo -n "head:  "; (cd /tmp && PYTHONPATH="$HEAD_TREE" "$repo/.venv/bin/python" "$here/fwd.py" 1 2>&1 | tail -1)
  echo -n "quant: "; (cd /tmp && PYTHONPATH="$QUANT_TREE" "$repo/.venv/bin/python" "$here/fwd.py" 1 2>&1 | tail -1)
  echo -n "units: "; (cd "$repo" && .venv/bin/python "$here/fwd.py" 1 2>&1 | tail -1)
done
