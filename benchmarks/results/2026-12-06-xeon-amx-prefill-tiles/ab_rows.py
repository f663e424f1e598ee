import sys, time, torch, statistics as st
from verispec.models import kernels
from verispec.models.quant import W4A8Linear
torch.manual_seed(0)
mods = {"avx512": kernels.w4a8("avx512"), "amx": kernels.w4a8("amx")}
shapes = [(1536, 17920), (8960, 1536)]
ws = {}
for k, n in shapes:
    q = W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=4)
    ws[k] = [(q.weight.clone(), q.codes.clone(), q.units.clone()) for _ in range(4)]
E = torch.empty(0)
for M in [int(m) for m in sys.argv[1].split(",")]:
    xs = {k: torch.randn(M, k) for k, _ in shapes}
    t = {name: [] for name in mods}
    for rep in range(int(sys.argv[2])):
        for name in (list(mods) if rep % 2 == 0 else list(mods)[::-1]):
            t0 = time.perf_counter()
            for k in xs:
                for w, c, u in ws[k]: mods[name].w4a8_mm(xs[k], w, c, u, E)
            t[name].append((time.perf_counter() - t0) / 4)
    r = [a / b for a, b in zip(t["amx"], t["avx512"])]
    print(f"M={M:4d} gate/up+down: avx512 {st.median(t['avx512'])*1e3:7.2f} ms  amx {st.median(t['amx'])*1e3:7.2f} ms  "
          f"ratio median {st.median(r):.3f} (min {min(r):.3f} max {max(r):.3f})", flush=True)
