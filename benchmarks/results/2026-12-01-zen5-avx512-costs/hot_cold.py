# w4a8_mm over weights kept in the caches (one matrix called again and again) against weights from memory (copies
# cycled past the L3), AVX-512 build, 1/2/5/8 rows: medians of 9 passes, weight bytes over time
import statistics, time, torch
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
torch.manual_seed(0)
m = kernels.w4a8()
print("isa", m.isa(), "threads", torch.get_num_threads())
for (n, k, bits, copies_cold) in [(2048, 1536, 4, 64), (8960, 1536, 4, 12), (2048, 1536, 6, 64)]:
    mats = [W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits) for _ in range(copies_cold)]
    nbytes = sum(t.numel() * t.element_size() for t in mats[0].operands()[:3])
    for mode in ("hot", "cold"):
        use = mats[:1] * copies_cold if mode == "hot" else mats
        out = []
        for r in (1, 2, 5, 8):
            x = torch.randn(r, k)
            ts = []
            for rep in range(9):
                t0 = time.perf_counter()
                for q in use: m.w4a8_mm(x, *q.operands()[:3], torch.empty(0))
                ts.append((time.perf_counter() - t0) / len(use))
            t = statistics.median(ts)
            out.append(f"{r}: {t*1e6:.0f} us {nbytes/t/1e9:.0f} GB/s")
        print(f"{n}x{k} {bits}-bit {nbytes/1e6:.2f} MB {mode}: " + " | ".join(out), flush=True)
