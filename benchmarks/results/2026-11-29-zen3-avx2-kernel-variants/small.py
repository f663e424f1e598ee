"""One-row w4a8 matmuls of the draft's shapes called again and again (weights in the caches): the kernel's
arithmetic and per-call cost without the memory, on 2 threads and then 1.

    python small.py
"""
import statistics, time
import torch
from verispec.models import kernels
from verispec.models.load import default_threads
from verispec.models.quant import W4A8Linear


def hot_us(mod, n: int, k: int, calls: int) -> float:
    """Median µs of one call of an n x k 4-bit matmul on one row, over 7 runs of `calls` calls."""
    ops = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=4).operands()[:3]
    x, e = torch.randn(1, k), torch.empty(0)
    for _ in range(100):
        mod.w4a8_mm(x, *ops, e)
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            mod.w4a8_mm(x, *ops, e)
        ts.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(ts)


if __name__ == "__main__":
    default_threads()
    mod = kernels.w4a8()
    for threads in (torch.get_num_threads(), 1):
        torch.set_num_threads(threads)
        for n, k in [(1152, 896), (896, 896), (16, 896), (9728, 896)]:
            print(f"{threads} thread(s) {n}x{k} hot: {hot_us(mod, n, k, 2000):.1f} us")
