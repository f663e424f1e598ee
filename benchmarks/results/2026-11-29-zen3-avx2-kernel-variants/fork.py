"""A one-row call on one column block (16 columns: no second thread) against two or more blocks (both threads),
over cached weights; and the Python call floor.

    python fork.py
"""
import statistics, time
import torch
from verispec.models import kernels
from verispec.models.load import default_threads
from small import hot_us

default_threads()
mod = kernels.w4a8()
for n, k in [(16, 896), (32, 896), (64, 896), (128, 896), (896, 896)]:
    print(f"{n}x{k} hot: {hot_us(mod, n, k, 5000):.2f} us")
ts = []
for _ in range(7):
    t0 = time.perf_counter()
    for _ in range(5000):
        torch.empty(0)
    ts.append((time.perf_counter() - t0) / 5000 * 1e6)
print(f"python call floor (torch.empty): {statistics.median(ts):.2f} us")
