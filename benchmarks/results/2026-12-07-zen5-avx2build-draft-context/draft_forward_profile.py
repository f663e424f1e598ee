"""The draft's one-token forward at a 100-token context, split (forward, layer stack, norm + head, layer_plan) and under
torch.profiler: VERISPEC_KERNEL_ISA=avx2 python draft_forward_profile.py."""
import sys, time, statistics as st
import torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1] / '2026-11-27-epyc-avx512-prefill-share'))
from common import model
m = model("d")
cache = m.new_cache(2048)
m.forward(torch.randint(0, 1000, (1, 100)), cache, last_n=1)
cache.commit(100)
x1 = torch.tensor([[42]])
def step():
    out = m.forward(x1, cache, last_n=1)
    return out
for _ in range(20): step()
ts=[]
for _ in range(100):
    t=time.perf_counter(); step(); ts.append(time.perf_counter()-t)
print("forward median ms", 1e3*st.median(ts))
plan = m.layer_plan(torch.tensor([100]), torch.arange(101), None, 1)
xin = m.inputs(x1, None)
ts=[]
for _ in range(100):
    t=time.perf_counter(); m.run_layers(xin, cache, plan); ts.append(time.perf_counter()-t)
print("stack median ms", 1e3*st.median(ts))
h = torch.randn(1,1,m.cfg.hidden_size)
ts=[]
for _ in range(100):
    t=time.perf_counter(); m.lm_head(m.norm(h)); ts.append(time.perf_counter()-t)
print("norm+head median ms", 1e3*st.median(ts))
ts=[]
for _ in range(100):
    t=time.perf_counter(); m.layer_plan(torch.tensor([100]), torch.arange(101), None, 1); ts.append(time.perf_counter()-t)
print("layer_plan median ms", 1e3*st.median(ts))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(20): step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
