import time, statistics, torch
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.models.kernels import w4a8, kernel_isa
import sys
default_threads()
which = sys.argv[1]
M = int(sys.argv[2]) if len(sys.argv) > 2 else 1
mdl = load(DEFAULT_DRAFT if which == "draft" else DEFAULT_TARGET, dtype="w4a8-4bit" if which == "draft" else "w4a8")
if which == "draft": truncate_head(mdl.model, 65536)
k = w4a8()
ops = [b._operands() for b in mdl.model.layers]
none = torch.empty(0)
def one():
    for o in ops:
        for j, op in enumerate(o):
            w, s, of = op[:3]
            K = w.shape[1] * (8 if w.shape[1]*8 % 32 == 0 else 1)
            x = xs[(j, w.shape[1])]
            k.w4a8_mm(x, w, s, of, none)
xs = {}
for o in ops[:1]:
    for j, op in enumerate(o):
        w = op[0]
        for K in (896, 1536, 4864, 8960):
            for bits_per in (4, 6, 8):
                nb = {4: K // 8, 6: 3 * K // 16, 8: K // 4}[bits_per]
                if nb == w.shape[1]: xs[(j, w.shape[1])] = torch.randn(M, K)
for o in ops:
    for j, op in enumerate(o):
        w = op[0]
        if (j, w.shape[1]) not in xs:
            for K in (896, 1536, 4864, 8960):
                for bits_per in (4, 6, 8):
                    nb = {4: K // 8, 6: 3 * K // 16, 8: K // 4}[bits_per]
                    if nb == w.shape[1]: xs[(j, w.shape[1])] = torch.randn(M, K)
ts = []
for i in range(60):
    t = time.perf_counter(); one(); ts.append(time.perf_counter() - t)
nbytes = sum(sum(t.numel() * t.element_size() for t in op[:3]) for o in ops for op in o)
print(kernel_isa(), which, "M", M, f"matmuls of all layers: {1e3*statistics.median(ts):.2f} ms, {nbytes/1e6:.1f} MB, {nbytes/statistics.median(ts)/1e9:.1f} GB/s")
