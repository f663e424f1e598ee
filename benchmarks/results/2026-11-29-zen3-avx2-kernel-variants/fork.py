import time, torch, statistics
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
from verispec.models.load import default_threads
default_threads()
mod = kernels.w4a8()
for n, k in [(16, 896), (32, 896), (64, 896), (128, 896), (896, 896)]:
    q = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=4)
    ops = q.operands()[:3]; x = torch.randn(1, k); e = torch.empty(0)
    for _ in range(100): mod.w4a8_mm(x, *ops, e)
    ts = []
    for r in range(7):
        t0 = time.perf_counter()
        for _ in range(5000): mod.w4a8_mm(x, *ops, e)
        ts.append((time.perf_counter() - t0) / 5000 * 1e6)
    print(f"{n}x{k} hot: {statistics.median(ts):.2f} us")
x = torch.randn(1, 896)
ts = []
for r in range(7):
    t0 = time.perf_counter()
    for _ in range(5000): torch.empty(0)
    ts.append((time.perf_counter() - t0) / 5000 * 1e6)
print(f"python call floor (torch.empty): {statistics.median(ts):.2f} us")
