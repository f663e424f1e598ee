"""Each of the draft's matmuls timed alone, in forward order (weights cold: 241 MB cycled)."""
import sys, time, statistics, collections, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "2026-11-29-zen3-avx2-huge-pages"))
from verispec.models.kernels import w4a8
from as_run import model_and_linears
model, lin = model_and_linears(sys.argv[1] if len(sys.argv) > 1 else "draft")
k = w4a8()
xs = {l: torch.randn(1, l.in_features) for l in lin}
per = collections.defaultdict(list)
for rep in range(12):
    for i, l in enumerate(lin):
        ops = l.operands()
        t = time.perf_counter(); k.w4a8_mm(xs[l], *ops); per[i].append(time.perf_counter() - t)
byshape = collections.defaultdict(lambda: [0.0, 0, 0])
for i, l in enumerate(lin):
    ops = l.operands()
    nb = sum(t.numel() * t.element_size() for t in ops[:3])
    key = (l.out_features, l.in_features, ops[0].shape[1] * 8 // l.in_features * 0 + (4 if ops[0].shape[1] == l.in_features // 8 else 6 if ops[0].shape[1] == 3 * l.in_features // 16 else 8))
    s = byshape[key]; s[0] += statistics.median(per[i][2:]); s[1] += nb; s[2] += 1
tot_t = sum(v[0] for v in byshape.values()); tot_b = sum(v[1] for v in byshape.values())
for key, (t, b, n) in sorted(byshape.items(), key=lambda kv: -kv[1][0]):
    print(f"{key[0]}x{key[1]} {key[2]}-bit x{n}: {t*1e3:.2f} ms, {b/1e6:.1f} MB, {b/t/1e9:.1f} GB/s, {t/n*1e6:.0f} us a call")
print(f"all: {tot_t*1e3:.2f} ms, {tot_b/1e6:.1f} MB, {tot_b/tot_t/1e9:.1f} GB/s")
