"""The w4a8 kernel alone over each shape of the draft's (or target's) linears, 1 token, 2 then 1 threads: time and
bytes read per second (each group's matrices in turn, 7 times; the draft's 33 MB head, repeated, is partly in the
32 MB L3).

    python per_shape.py draft|target
"""
import time, torch, statistics, sys
from verispec.models.kernels import w4a8
from as_run import model_and_linears, weight_bytes
which = sys.argv[1]
model, lin = model_and_linears(which)
k = w4a8()
groups = {}
for l in lin: groups.setdefault((l.in_features, l.out_features, l.bits), []).append(l)
xs = {l: torch.randn(1, l.in_features) for l in lin}
for th in (2, 1):
    torch.set_num_threads(th)
    for key, ls in groups.items():
        nb = weight_bytes(ls)
        ts = []
        for rep in range(7):
            t = time.perf_counter()
            for l in ls: k.w4a8_mm(xs[l], *l.operands())
            ts.append(time.perf_counter() - t)
        t = statistics.median(ts)
        print(f"threads {th} {key} x{len(ls)}: {t*1e3:.2f} ms  {nb/t/1e9:.1f} GB/s  {t/len(ls)*1e6:.0f} us/call")
