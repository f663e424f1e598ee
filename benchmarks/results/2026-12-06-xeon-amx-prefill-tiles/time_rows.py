import sys, time, torch, statistics as st
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
torch.manual_seed(0); torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
a = kernels.w4a8("amx"); v = kernels.w4a8("avx512")
L = 28
def mk(k, n, bits=4):
    q = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits)
    return [(q.weight.clone(), q.codes.clone(), q.units.clone()) for _ in range(L)]
layers = list(zip(mk(1536, 2048), mk(1536, 1536), mk(1536, 17920), mk(8960, 1536)))
E = torch.empty(0)
def run(mod, M):
    xs = {1536: torch.randn(M, 1536), 8960: torch.randn(M, 8960)}
    t = time.perf_counter()
    for ops in layers:
        for (w, c, u) in ops:
            mod.w4a8_mm(xs[w.shape[1] * 8 // (1 if w.shape[1] else 1) if False else (w.shape[1]*8)], w, c, u, E)
    return time.perf_counter() - t
import sys
for M in [int(m) for m in sys.argv[1].split(",")]:
    ta, tv = [], []
    for i in range(5 if M < 100 else 2):
        for mod, out in ((a, ta), (v, tv)) if i % 2 == 0 else ((v, tv), (a, ta)):
            out.append(run(mod, M))
    print(f"M={M:4d} avx512 {min(tv)*1e3:8.1f} ms  amx {min(ta)*1e3:8.1f} ms  amx/avx512 {min(ta)/min(tv):.3f}", flush=True)
