import sys, time, torch, importlib
from torch.utils import cpp_extension
from pathlib import Path
from verispec.models import kernels
exp = int(sys.argv[1]); Ms = [int(m) for m in sys.argv[2].split(",")]
d = Path(kernels.__file__).parent
b = Path(f"/tmp/amxexp{exp}"); b.mkdir(exist_ok=True)
a = cpp_extension.load(name=f"amxexp{exp}", sources=[str(d / s) for s in kernels.SOURCES],
    extra_cflags=kernels.ISA_CFLAGS["amx"] + [f"-DAMX_EXP={exp}"], extra_ldflags=kernels.LDFLAGS, build_directory=str(b))
v = kernels.w4a8("avx512")
from verispec.models.quant import W4A8Linear
torch.manual_seed(0)
L = 28
def mk(k, n, bits=4):
    q = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits)
    return [(q.weight.clone(), q.codes.clone(), q.units.clone()) for _ in range(L)]
layers = list(zip(mk(1536, 2048), mk(1536, 1536), mk(1536, 17920), mk(8960, 1536)))
E = torch.empty(0)
def run(mod, M):
    xs = {192: torch.randn(M, 1536), 1120: torch.randn(M, 8960)}
    t = time.perf_counter()
    for ops in layers:
        for (w, c, u) in ops:
            mod.w4a8_mm(xs[w.shape[1]], w, c, u, E)
    return time.perf_counter() - t
for M in Ms:
    ta, tv = [], []
    for i in range(4 if M < 100 else 2):
        for mod, out in ((a, ta), (v, tv)) if i % 2 == 0 else ((v, tv), (a, ta)):
            out.append(run(mod, M))
    print(f"exp{exp} M={M:4d} avx512 {min(tv)*1e3:8.1f} ms  amx {min(ta)*1e3:8.1f} ms  amx/avx512 {min(ta)/min(tv):.3f}", flush=True)
