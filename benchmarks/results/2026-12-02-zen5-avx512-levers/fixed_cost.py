"""One w4a8_mm call of one row: a 16-column matrix (the fixed cost of a call), and 256 / 2048 / 8960 x 1536 4-bit
matrices with their weights in the caches (one copy) and from memory (copies cycled past 64 MB), medians of 180."""
import time, statistics, torch
from verispec.models.kernels import w4a8
from verispec.models.quant import W4A8Linear
from verispec.models.load import default_threads
default_threads()
k = w4a8()
def mk(n, kk, bits=4):
    return W4A8Linear(torch.nn.Linear(kk, n, bias=False), bits=bits)
def timeit(lins, x, reps=200):
    ops = [l.operands() for l in lins]
    ts = []
    for r in range(reps):
        o = ops[r % len(ops)]
        t = time.perf_counter(); k.w4a8_mm(x, *o); ts.append(time.perf_counter() - t)
    return statistics.median(ts[20:]) * 1e6
x = torch.randn(1, 1536)
tiny = [mk(16, 1536)]
print(f"16x1536 (hot): {timeit(tiny, x):.1f} us")
for n in (256, 2048, 8960):
    hot = [mk(n, 1536)]
    cold = [mk(n, 1536) for _ in range(max(8, 64 * 2**20 // (n * 1536 // 2)))]
    mb = n * 1536 * 4.625 / 8 / 1e6
    th, tc = timeit(hot, x), timeit(cold, x)
    print(f"{n}x1536: {mb:.2f} MB hot {th:.1f} us ({mb/th*1e3:.0f} GB/s), cold {tc:.1f} us ({mb/tc*1e3:.0f} GB/s)")
torch.set_num_threads(1)
print("1 thread:")
print(f"16x1536 (hot): {timeit(tiny, x):.1f} us")
for n in (256, 2048):
    hot = [mk(n, 1536)]
    cold = [mk(n, 1536) for _ in range(max(8, 64 * 2**20 // (n * 1536 // 2)))]
    mb = n * 1536 * 4.625 / 8 / 1e6
    th, tc = timeit(hot, x), timeit(cold, x)
    print(f"{n}x1536: {mb:.2f} MB hot {th:.1f} us ({mb/th*1e3:.0f} GB/s), cold {tc:.1f} us ({mb/tc*1e3:.0f} GB/s)")
