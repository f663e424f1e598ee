import sys, time, statistics, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from kernel_ab import build_version
from verispec.models.kernels import attention_kernel
from verispec.models.load import default_threads
default_threads()
old = attention_kernel()
new = build_version(sys.argv[1] if len(sys.argv) > 1 else "/tmp/attfma/attention_fma.cpp", "avx2", "fma", replaces="attention.cpp")
caches = [(torch.randn(1, 2, 1024, 128), torch.randn(1, 2, 1024, 128)) for _ in range(28)]
mask = torch.empty(0, dtype=torch.bool)
for T in (1, 5):
    q = torch.randn(1, 12, T, 128); S = 400 + T
    a = old.attention(q, caches[0][0].narrow(2, 0, S), caches[0][1].narrow(2, 0, S), mask, 128 ** -0.5)
    b = new.attention(q, caches[0][0].narrow(2, 0, S), caches[0][1].narrow(2, 0, S), mask, 128 ** -0.5)
    print("max diff", float((a - b).abs().max()))
    ts = {"old": [], "new": []}
    for rep in range(15):
        for name, mod in (("old", old), ("new", new)) if rep % 2 else (("new", new), ("old", old)):
            t0 = time.perf_counter()
            for kc, vc in caches:
                mod.attention(q, kc.narrow(2, 0, S), vc.narrow(2, 0, S), mask, 128 ** -0.5)
            ts[name].append((time.perf_counter() - t0) * 1e3)
    print(T, {k: round(statistics.median(v), 2) for k, v in ts.items()})
