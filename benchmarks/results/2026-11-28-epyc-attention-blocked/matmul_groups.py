"""The target's w4a8 matmuls by tensor and bits, summed over its layers, for 1, 5 and 7 rows (medians of 5).

    [VERISPEC_KERNEL_ISA=avx2] python matmul_groups.py
"""
import collections
import statistics
import time

import torch

from verispec.models.kernels import kernel_isa, w4a8
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models.quant import W4A8Linear

default_threads()
model = load(DEFAULT_TARGET, dtype="w4a8").model
k, none = w4a8(), torch.empty(0)
groups = collections.defaultdict(list)  # (name, bits) -> the linears
for name, m in model.named_modules():
    if isinstance(m, W4A8Linear):
        groups[(name.split(".")[-1], m.bits)].append(m)
print(kernel_isa())
for M in (1, 5, 7):
    total, row = 0.0, []
    for (name, bits), mods in sorted(groups.items()):
        ops = [m.operands()[:3] for m in mods]
        ts = []
        for _ in range(5):
            x = torch.randn(M, mods[0].in_features)
            t = time.perf_counter()
            for w, s, o in ops:
                k.w4a8_mm(x, w, s, o, none)
            ts.append(time.perf_counter() - t)
        t = statistics.median(ts)
        total += t
        row.append(f"{name}/{bits}b x{len(mods)}: {1e3 * t:.2f}")
    print(M, f"total {1e3 * total:.1f} ms |", "; ".join(row))
