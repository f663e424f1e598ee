"""A one-token step of the default target (w4a8, 400-token cache) against its 113 matmuls alone, medians of 40.

    NT=2 python step.py            # threads: $NT, else verispec's default (the CPUs this process may run on)

Run it in alternation with and without OMP_PROC_BIND/OMP_PLACES (pinning.sh): with GOMP_CPU_AFFINITY or
OMP_PROC_BIND alone the main thread is bound to CPU 0 before verispec counts its CPUs, so NT must be given.
"""
import os
import statistics
import sys
import time

import torch

from verispec.batch import make_rows
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models.quant import W4A8Linear

default_threads()
torch.set_num_threads(int(os.environ.get("NT", torch.get_num_threads())))
model = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
rows = make_rows(model, 1, 1024, 16)
prompt = list(range(1000, 1400))
rows.forward([0], [prompt], last_only=True)
rows.commit(0, len(prompt))
lins = [m for m in model.modules() if isinstance(m, W4A8Linear)]
xs = {id(l): torch.randn(1, l.in_features) for l in lins}


def med(f, n=40):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def step():
    rows.forward([0], [[1234]], last_only=True)


def mats():
    for l in lins:
        l(xs[id(l)])


print(f"threads {torch.get_num_threads()}, OMP_PROC_BIND={os.environ.get('OMP_PROC_BIND', '')} "
      f"OMP_PLACES={os.environ.get('OMP_PLACES', '')}")
for rep in range(3):
    a, b = med(step), med(mats)
    print(f"rep {rep}: step {a:.2f} ms, its {len(lins)} matmuls alone {b:.2f} ms")
