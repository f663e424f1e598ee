import time, statistics, torch
from verispec.models.kernels import attention_kernel
from verispec.models.load import default_threads
default_threads()
k = attention_kernel()
S0 = 400
caches = [(torch.randn(1, 2, 1024, 128), torch.randn(1, 2, 1024, 128)) for _ in range(28)]
mask = torch.empty(0, dtype=torch.bool)
for T in (1, 2, 3, 5, 8):
    q = torch.randn(1, 12, T, 128)
    S = S0 + T
    ts = []
    for rep in range(15):
        t0 = time.perf_counter()
        for kc, vc in caches:
            k.attention(q, kc.narrow(2, 0, S), vc.narrow(2, 0, S), mask, 128 ** -0.5)
        ts.append((time.perf_counter() - t0) * 1e3)
    print(f"28 layers' attention, {T} queries over {S} keys: {statistics.median(ts):.2f} ms")
