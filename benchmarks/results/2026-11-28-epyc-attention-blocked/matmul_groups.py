import torch, time, statistics, collections
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models.quant import W4A8Linear
from verispec.models.kernels import w4a8, kernel_isa
default_threads()
m = load(DEFAULT_TARGET, dtype="w4a8").model
k = w4a8(); none = torch.empty(0)
ev = torch.ones(16 << 20)
groups = collections.defaultdict(list)
for n, mod in m.named_modules():
    if isinstance(mod, W4A8Linear):
        w, s, o = mod.operands()[:3]
        K = w.shape[1] * 8 if True else 0
        bits = 4
        # K from the known shapes
        for KK in (1536, 8960):
            if w.shape[1] == KK // 8: bits, K = 4, KK
            if w.shape[1] == 3 * KK // 16: bits, K = 6, KK
        groups[(n.split(".")[-1], bits)].append((w, s, o, K))
print(kernel_isa())
for M in (1, 5, 7):
    tot = 0
    row = []
    for key, lst in sorted(groups.items()):
        ts = []
        for rep in range(5):
            x = torch.randn(M, lst[0][3])
            t = time.perf_counter()
            for (w, s, o, K) in lst: k.w4a8_mm(x, w, s, o, none)
            ts.append(time.perf_counter() - t)
        t = statistics.median(ts); tot += t
        row.append(f"{key[0]}/{key[1]}b x{len(lst)}: {1e3*t:.2f}")
    print(M, f"total {1e3*tot:.1f} ms |", "; ".join(row))
