"""The draft's one-token forward in a loop for 10 s (for perf): VERISPEC_KERNEL_ISA=avx2 perf record -D 5000 python draft_loop.py"""
import sys, time
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "2026-11-27-epyc-avx512-prefill-share"))
from common import model
m = model("d")
cache = m.new_cache(2048)
m.forward(torch.randint(0, 1000, (1, 100)), cache, last_n=1); cache.commit(100)
x1 = torch.tensor([[42]])
for _ in range(20): m.forward(x1, cache, last_n=1)
t = time.time(); n = 0
while time.time() - t < 10: m.forward(x1, cache, last_n=1); n += 1
print("ms per forward", 10e3 / n)
