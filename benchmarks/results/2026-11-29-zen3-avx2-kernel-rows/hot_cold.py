# hot (cache-resident) vs cold (8 copies cycled past the L3) w4a8_mm, AVX2 build, 1..6 rows
import statistics, time, torch
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
torch.manual_seed(0)
m = kernels.w4a8()
print("isa", m.isa(), "threads", torch.get_num_threads())
GHZ = 2.45
for (n, k, copies_cold) in [(1024, 1024, 40), (8960, 1536, 8)]:
    bits = 4
    mats = [W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits) for _ in range(copies_cold)]
    nbytes = sum(t.numel() * t.element_size() for t in mats[0].operands()[:3])
    for mode in ("hot", "cold"):
        use = mats[:1] * copies_cold if mode == "hot" else mats
        out = []
        for r in range(1, 7):
            x = torch.randn(r, k)
            ts = []
            for rep in range(7):
                t0 = time.perf_counter()
                for q in use: m.w4a8_mm(x, *q.operands()[:3], torch.empty(0))
                ts.append((time.perf_counter() - t0) / len(use))
            t = statistics.median(ts)
            steps_per_core = nbytes / 32 / 2
            out.append(f"{r}:{t*1e3:.3f}ms/{t*GHZ*1e9/steps_per_core:.1f}cyc")
        print(f"{n}x{k} {nbytes/1e6:.2f} MB {mode}: " + " ".join(out), flush=True)
