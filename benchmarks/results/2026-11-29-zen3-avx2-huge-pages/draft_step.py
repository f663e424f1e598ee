"""The default draft's one-token forward (w4a8-4bit, head cut to 65536 rows, 300-token cache) beside its 97
matmuls alone, one after another with the same weights: how much of a draft step is outside the matmuls.

    python draft_step.py
"""
import time, torch, statistics, sys
from verispec.models.kernels import w4a8
from as_run import model_and_linears, weight_bytes
model, lin = model_and_linears(sys.argv[1] if len(sys.argv) > 1 else "draft")
nbytes = weight_bytes(lin)
other = sum(p.numel()*p.element_size() for n,p in model.named_parameters())
print("w4a8 bytes MB", nbytes/1e6, "linears", len(lin), "other param MB", other/1e6)
cache = model.new_cache(1024)
ids = torch.randint(0, 1000, (1, 300))
model.forward(ids, cache); cache.commit(300)
def step():
    x = torch.tensor([[5]])
    t = time.perf_counter(); model.forward(x, cache, last_n=1); el = time.perf_counter() - t

    return el
k = w4a8()
xs = {l: torch.randn(1, l.in_features) for l in lin}
def mm_all():
    t = time.perf_counter()
    for l in lin: k.w4a8_mm(xs[l], *l.operands())
    return time.perf_counter() - t
for _ in range(3): step(); mm_all()
for rep in range(3):
    a = [step() for _ in range(15)]; b = [mm_all() for _ in range(15)]
    print(f"forward {statistics.median(a)*1e3:.2f} ms   matmuls alone {statistics.median(b)*1e3:.2f} ms  -> {nbytes/statistics.median(b)/1e9:.1f} GB/s")
