"""Target forward over k tokens on a 512-token cache, k interleaved, medians of R."""
import sys, time, statistics, torch
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models.kernels import kernel_isa
default_threads()
ks = [int(k) for k in sys.argv[1].split(",")]; R = int(sys.argv[2]) if len(sys.argv) > 2 else 7
model = load(DEFAULT_TARGET, dtype="w4a8").model
g = torch.Generator().manual_seed(0)
cache = model.new_cache(512 + max(ks) + 1)
model.forward(torch.randint(151000, (1, 512), generator=g), cache, last_n=1); cache.commit(512)
xs = {k: torch.randint(151000, (1, k), generator=g) for k in ks}
for k in ks: model.forward(xs[k], cache)
t = {k: [] for k in ks}
for _ in range(R):
    for k in ks:
        t0 = time.perf_counter(); model.forward(xs[k], cache); t[k].append(time.perf_counter() - t0)
b = statistics.median(t[1])
print(kernel_isa(), " ".join(f"{k}:{1e3*statistics.median(t[k]):.1f}ms({statistics.median(t[k])/b:.2f}x)" for k in ks))
