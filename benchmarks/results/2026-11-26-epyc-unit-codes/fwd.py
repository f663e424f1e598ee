"""Median ms of 1-token draft, 1/5-token target forwards over a 300-token cache; and torch.sum read bandwidth."""
import statistics, sys, time
import torch
from verispec.models.kernels import kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head

default_threads()
draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False).model
truncate_head(draft, 65536)
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
print("kernel build:", kernel_isa(), "threads", torch.get_num_threads())
big = torch.ones(256 * 2**20 // 4)  # 256 MB

def bw():
    ts = []
    for _ in range(10):
        t0 = time.perf_counter(); big.sum(); ts.append(time.perf_counter() - t0)
    return big.numel() * 4 / statistics.median(ts) / 1e9

def timed(model, t, n=20):
    cache = model.new_cache(600)
    model.forward(torch.randint(0, 1000, (1, 300)), cache, last_n=1)
    cache.commit(300)
    tok = torch.randint(0, 1000, (1, t))
    for _ in range(3):
        model.forward(tok, cache, last_n=t)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); model.forward(tok, cache, last_n=t); ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)

for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    out = [f"bw {bw():.1f} GB/s"]
    for name, m, t in (("draft1", draft, 1), ("target1", target, 1), ("target5", target, 5), ):
        out.append(f"{name} {timed(m, t):.2f}")
    print(f"round {r}: " + " | ".join(out), flush=True)
