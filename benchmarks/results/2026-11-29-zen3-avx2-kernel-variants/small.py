import time, torch, statistics
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
from verispec.models.load import default_threads
default_threads()
mod = kernels.w4a8()
for n, k in [(1152, 896), (896, 896), (16, 896), (9728, 896)]:
    q = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=4)
    ops = q.operands()[:3]
    x = torch.randn(1, k)
    e = torch.empty(0)
    for _ in range(100): mod.w4a8_mm(x, *ops, e)
    ts = []
    for r in range(7):
        t0 = time.perf_counter()
        for _ in range(2000): mod.w4a8_mm(x, *ops, e)
        ts.append((time.perf_counter() - t0) / 2000 * 1e6)
    print(f"{n}x{k} hot: {statistics.median(ts):.1f} us")
torch.set_num_threads(1)
for n, k in [(1152, 896), (896, 896), (16, 896), (9728, 896)]:
    q = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=4)
    ops = q.operands()[:3]
    x = torch.randn(1, k)
    e = torch.empty(0)
    for _ in range(100): mod.w4a8_mm(x, *ops, e)
    ts = []
    for r in range(7):
        t0 = time.perf_counter()
        for _ in range(2000): mod.w4a8_mm(x, *ops, e)
        ts.append((time.perf_counter() - t0) / 2000 * 1e6)
    print(f"1 thread {n}x{k} hot: {statistics.median(ts):.1f} us")
