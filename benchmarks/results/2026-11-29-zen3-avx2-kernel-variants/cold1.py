import time, torch, statistics
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
mod = kernels.w4a8()
for n, k in [(896, 896), (1152, 896), (9728, 896)]:
    copies = max(8, int(96e6 // (n * k // 2)))
    mats = [W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=4).operands()[:3] for _ in range(copies)]
    x = torch.randn(1, k); e = torch.empty(0)
    nbytes = sum(t.numel() * t.element_size() for t in mats[0])
    res = {}
    for rep in range(6):
        for th in (1, 2):
            torch.set_num_threads(th)
            t0 = time.perf_counter()
            for ops in mats: mod.w4a8_mm(x, *ops, e)
            res.setdefault(th, []).append((time.perf_counter() - t0) / copies)
    for th in (1, 2):
        t = statistics.median(res[th])
        print(f"{n}x{k} cold, {th} thread(s): {t*1e6:.1f} us, {nbytes/t/1e9:.1f} GB/s")
