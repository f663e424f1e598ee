import time, torch, sys
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
isa = sys.argv[1]
mod = kernels.w4a8(isa)
torch.manual_seed(0)
for n, k in [(1536, 1536), (8960, 1536), (1536, 8960)]:
    for bits in (4, 6):
        q = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits)
        ops = q.operands()[:3]
        cold = [W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits).operands()[:3] for _ in range(6)] if n*k > 3e6 else None
        line = []
        for rows in (1, 2, 3, 4, 5, 6, 8):
            x = torch.randn(rows, k)
            for _ in range(3): mod.w4a8_mm(x, *ops, torch.empty(0))
            ts = []
            for _ in range(20):
                t = time.perf_counter(); mod.w4a8_mm(x, *ops, torch.empty(0)); ts.append(time.perf_counter() - t)
            warm = sorted(ts)[10]
            c = ""
            if cold:
                ts = []
                for i in range(18):
                    o = cold[i % 6]; t = time.perf_counter(); mod.w4a8_mm(x, *o, torch.empty(0)); ts.append(time.perf_counter() - t)
                c = f"/{sorted(ts)[9]*1e3:.3f}"
            gmac = rows * n * k / warm / 1e9
            line.append(f"r{rows}:{warm*1e3:.3f}{c}ms {gmac:.0f}G")
        print(isa, f"{n}x{k} b{bits}", " ".join(line), flush=True)
