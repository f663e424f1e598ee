"""The draft's 24 gate/up matrices: 24 calls, one call over them concatenated, and 24 calls over views of that
concatenation, 2 then 1 threads (9 reps each, twice).

    python concat.py
"""
import time, torch, statistics
from verispec.models.kernels import w4a8
from as_run import model_and_linears, weight_bytes
_, lin = model_and_linears("draft")
k = w4a8()
gu = [l for l in lin if l.out_features == 9728]
W = torch.cat([l.weight for l in gu]); C = torch.cat([l.codes for l in gu]); U = torch.cat([l.units for l in gu])
x = torch.randn(1, 896); e = torch.empty(0)
nb = weight_bytes(gu)
def sep():
    t = time.perf_counter()
    for l in gu: k.w4a8_mm(x, l.weight, l.codes, l.units, e)
    return time.perf_counter() - t
def one():
    t = time.perf_counter(); k.w4a8_mm(x, W, C, U, e); return time.perf_counter() - t
# also: separate matrices but copied into one contiguous allocation (views)
Wv = W.view(24, -1, W.shape[1], 64); Cv = C.view(24, -1, C.shape[1], 32); Uv = U.view(24, -1, U.shape[1], 32)
def views():
    t = time.perf_counter()
    for i in range(24): k.w4a8_mm(x, Wv[i], Cv[i], Uv[i], e)
    return time.perf_counter() - t
for th in (2,1):
    torch.set_num_threads(th)
    for f in (sep, one, views, sep, one, views):
        ts = [f() for _ in range(9)]; t = statistics.median(ts)
        print(th, f.__name__, f"{t*1e3:.2f} ms {nb/t/1e9:.1f} GB/s")
