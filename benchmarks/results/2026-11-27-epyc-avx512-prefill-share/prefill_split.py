"""A prefill's time against its matmuls alone (same shapes, same kernel, all layers): python prefill_split.py t|d TOKENS.
"""
import sys
import time

import torch

from common import matmul_kinds, model
from verispec.models.kernels import w4a8

k = w4a8()
T = int(sys.argv[2]) if len(sys.argv) > 2 else 300
m = model(sys.argv[1])
tot = prods = 0
for kind, (layers, x) in matmul_kinds(m, T).items():
    t = time.perf_counter()
    for ops in layers:
        k.w4a8_mm(x, *ops)
    dt = time.perf_counter() - t
    p = sum(w.shape[0] * 16 for w, *_ in layers) * x.shape[1] * T
    tot, prods = tot + dt, prods + p
    print(f"{kind}: {dt * 1e3:.1f} ms  {p / dt / 1e9:.0f} G products/s  bits {layers[-1][0].shape[1] * 8 / x.shape[1] * 4:.0f}")
print(f"matmuls total {tot * 1e3:.0f} ms for {T} tokens: {tot / T * 1e3:.2f} ms/token, {prods / tot / 1e9:.0f} GOPS")
toks = torch.randint(0, 1000, (1, T))
for rep in range(2):
    cache = m.new_cache(T + 16)
    t = time.perf_counter()
    m.forward(toks, cache, last_n=1)
    print(f"prefill forward {T} tokens: {(time.perf_counter() - t) * 1e3:.0f} ms")
