"""A 300-token prefill of the target in a loop for 12 s (for perf): VERISPEC_KERNEL_ISA=avx2 perf record -D 4000 python prefill_loop.py"""
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "2026-11-27-epyc-avx512-prefill-share"))
from common import model
m = model("t")
x = torch.randint(0, 10000, (1, 300))
cache = m.new_cache(2048)
with torch.inference_mode():
    m.forward(x, cache, last_n=1)
    t = time.time(); n = 0
    while time.time() - t < 12:
        cache.length = 0
        m.forward(x, cache, last_n=1); n += 1
print("ms per 300-token prefill", 12e3 / n)
