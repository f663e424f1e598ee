"""GB/s of each decoder matmul kind (q/k/v, output, gate/up, down) at one row, weights cold (all layers in turn, another
kind run between repetitions), with 2 threads then 1: python matmul_rates.py d|t (draft or target, as run by default).
"""
import statistics as st
import sys
import time

import torch

from common import matmul_kinds, model
from verispec.models.kernels import w4a8

k = w4a8()
kinds = matmul_kinds(model(sys.argv[1]), 1)


def run(kind: str) -> float:
    layers, x = kinds[kind]
    t = time.perf_counter()
    for ops in layers:
        k.w4a8_mm(x, *ops)
    return time.perf_counter() - t


for threads in (2, 1):
    torch.set_num_threads(threads)
    for kind, (layers, _) in kinds.items():
        other = "w13" if kind != "w13" else "w2"  # run between repetitions: this kind's weights leave the cache
        nbytes = sum(w.numel() + codes.numel() + units.numel() * 2 for w, codes, units, _ in layers)
        for _ in range(3):
            run(kind)
            run(other)
        ts = []
        for _ in range(15):
            run(other)
            ts.append(run(kind))
        med = st.median(ts)
        print(f"thr {threads} {kind}: {1e6 * med / len(layers):.1f} us/call, {nbytes / len(layers) / 1e3:.0f} KB, "
              f"{nbytes / med / 1e9:.1f} GB/s")
