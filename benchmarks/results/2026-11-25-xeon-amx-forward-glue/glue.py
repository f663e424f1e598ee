import time, torch, statistics, sys
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
import verispec.models.kernels as K
default_threads()
which = sys.argv[1]
m = load(DEFAULT_DRAFT if which == "draft" else DEFAULT_TARGET, dtype="w4a8-4bit" if which == "draft" else "w4a8", progress=False).model
if which == "draft": truncate_head(m, 65536)
cache = m.new_cache(600)
m.forward(torch.randint(0, 1000, (1, 300)), cache, last_n=1); cache.commit(300)
tok = torch.randint(0, 1000, (1, 1))
real = K.layer_kernel()
acc = [0.0]
class Wrap:
    def __getattr__(self, n):
        f = getattr(real, n)
        def g(*a):
            t0 = time.perf_counter(); r = f(*a); acc[0] += time.perf_counter() - t0; return r
        return g
w = Wrap()
import verispec.models.llama as L
orig = K.layer_kernel
for _ in range(5): m.forward(tok, cache, last_n=1)
ts = []
for _ in range(40):
    t0 = time.perf_counter(); m.forward(tok, cache, last_n=1); ts.append(time.perf_counter() - t0)
base = statistics.median(ts)
K.layer_kernel = lambda: w
K.w4a8 = lambda isa=None: w
for _ in range(3): m.forward(tok, cache, last_n=1)
acc[0] = 0; n = 40; t0 = time.perf_counter()
for _ in range(n): m.forward(tok, cache, last_n=1)
tot = (time.perf_counter() - t0) / n
print(which, "forward ms", round(1e3*base, 2), "| wrapped run: total", round(1e3*tot, 2), "in layer kernels", round(1e3*acc[0]/n, 2), "outside", round(1e3*(tot - acc[0]/n), 2))
