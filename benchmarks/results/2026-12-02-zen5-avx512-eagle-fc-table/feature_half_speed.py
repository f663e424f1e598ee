"""The input projection's feature half (1536 x 1536) of one row over weights from memory (12 copies cycled): Bf16Linear (bf16
weights, two rows), torch's bf16 linear of one row, float32, and the w4a8 kernel with 8-bit weights; medians of 108.

    python feature_half_speed.py            # feature_half_speed.txt
    python feature_half_speed.py bf16_mm    # and the compiled bf16_mm beside torch's bf16 linear (one row):
                                            # feature_half_speed_bf16_mm.txt; needs bf16_mm.diff applied (git apply
                                            # bf16_mm.diff at 32f1ead), the kernel was not kept
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from verispec.models.load import default_threads
from verispec.models.quant import W4A8Linear
from verispec.models.eagle import Bf16Linear
default_threads()
H = 1536
n = 12
lins = [torch.nn.Linear(H, H, bias=False) for _ in range(n)]
b16 = [Bf16Linear(l) for l in lins]
w16 = [l.weight.detach().to(torch.bfloat16) for l in lins]
w32 = [l.weight.detach() for l in lins]
q8 = [W4A8Linear(l, bits=8) for l in lins]
x = torch.randn(1, H)
x16 = x.to(torch.bfloat16)
def t(f, reps=120):
    ts = []
    for r in range(reps):
        i = r % n
        s = time.perf_counter(); f(i); ts.append(time.perf_counter() - s)
    return statistics.median(ts[12:]) * 1e3
for rep in range(3):
    a = t(lambda i: b16[i](x))
    b = t(lambda i: F.linear(x16, w16[i]).float())
    c = t(lambda i: F.linear(x, w32[i]))
    d = t(lambda i: q8[i](x))
    print(f"cold 1536x1536: Bf16Linear (2 rows) {a:.3f} ms, bf16 1 row {b:.3f}, float32 1 row {c:.3f}, w4a8 8-bit {d:.3f}")
if sys.argv[1:] == ["bf16_mm"]:
    from verispec.models.kernels import bf16_kernel

    k = bf16_kernel()
    for rep in range(3):
        a = t(lambda i: F.linear(x16, w16[i]).float())
        e = t(lambda i: k.bf16_mm(x, w16[i]))
        print(f"cold 1536x1536: torch bf16 1 row {a:.3f} ms, the kernel's bf16_mm {e:.3f} ms")
