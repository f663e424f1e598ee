import statistics, time, torch
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
torch.manual_seed(0)
m = kernels.w4a8()
for (n,k) in [(8960,1536),(1536,8960),(2048,1536)]:
    for bits in (4,6):
        mats=[W4A8Linear(torch.nn.Linear(k,n,bias=False),bits=bits) for _ in range(8)]
        nbytes=sum(t.numel()*t.element_size() for t in mats[0].operands()[:3])
        res={}
        xs={r:torch.randn(r,k) for r in range(1,9)}
        times={r:[] for r in xs}
        for rep in range(9):
            for r in (list(xs) if rep%2 else list(xs)[::-1]):
                t0=time.perf_counter()
                for q in mats: m.w4a8_mm(xs[r],*q.operands()[:3],torch.empty(0))
                times[r].append((time.perf_counter()-t0)/8*1e3)
        base=statistics.median(times[1])
        print(f"{n}x{k} {bits}-bit {nbytes/1e6:.1f} MB: 1 row {base:.3f} ms ({nbytes/base/1e6:.1f} GB/s); x1-row: " + " ".join(f"{r}:{statistics.median(times[r])/base:.2f}" for r in xs), flush=True)
