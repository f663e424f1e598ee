"""Time a prefill of N tokens on the w4a8 target (the forward alone), and its matmuls' shapes alone on the kernel."""
import sys, time, statistics, torch
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models import kernels
default_threads()
m = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
model = m.model
print(type(model).__name__, torch.get_num_threads(), "threads", kernels.w4a8().isa())
n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
ids = torch.randint(100, 30000, (1, n))
ts = []
for rep in range(5):
    cache = model.new_cache(n + 8)
    t0 = time.perf_counter()
    model(ids, cache, last_n=1)
    ts.append(time.perf_counter() - t0)
print(f"prefill {n}: median {statistics.median(ts)*1e3:.0f} ms (all {[round(t*1e3) for t in ts]}), {n/statistics.median(ts):.0f} tok/s")
# the matmuls alone: every W4A8Linear in the layers
from verispec.models.quant import W4A8Linear
mods = [mod for mod in model.layers.modules() if isinstance(mod, W4A8Linear)]
x: dict[int, torch.Tensor] = {}  # one random input per width
k = kernels.w4a8()
tot = []
for rep in range(3):
    t0 = time.perf_counter()
    for q in mods:
        xin = x.setdefault(q.in_features, torch.randn(n, q.in_features))
        k.w4a8_mm(xin, *q.operands()[:3], torch.empty(0))
    tot.append(time.perf_counter() - t0)
print(f"{len(mods)} matmuls at {n} rows: median {statistics.median(tot)*1e3:.0f} ms")
