"""A draft step (the 0.5B draft, w4a8-4bit, ids < 65536) at 300 tokens of context: the whole forward, its layer stack
(one compiled call) and its LM head, medians of 200.   [VERISPEC_KERNEL_ISA=avx2] python draft_step_parts.py"""
import time, statistics, torch
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT
from verispec.models.quant import truncate_head
from verispec.models.kernels import kernel_isa
default_threads()
draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(draft.model, 65536)
m = draft.model
cache = m.new_cache(600)
ids = torch.randint(0, 30000, (1, 300))
m.forward(ids, cache); cache.commit(300)
print(type(cache), cache.length, kernel_isa())
tok = torch.tensor([[123]])
T = {"fwd": [], "stack": [], "head": []}
def timeit(f, key):
    def g(*a, **k):
        t = time.perf_counter(); o = f(*a, **k); T[key].append(time.perf_counter() - t); return o
    return g
m.forward(tok, cache)  # commits nothing: every forward below runs at 300 tokens of context
st = m._stack[2]
head = m.lm_head
head.forward = timeit(head.forward, "head")
class W:
    def __init__(s, st): s.st = st
    def run(s, *a): 
        t = time.perf_counter(); o = s.st.run(*a); T["stack"].append(time.perf_counter() - t); return o
m._stack = (m._stack[0], m._stack[1], W(st))
for i in range(200):
    t = time.perf_counter(); m.forward(tok, cache); T["fwd"].append(time.perf_counter() - t)
for k, v in T.items(): print(k, f"{1e3*statistics.median(v):.2f} ms")
# weight bytes
nb = sum(p.numel()*p.element_size() for n,p in m.named_parameters()) + sum(b.numel()*b.element_size() for n,b in m.named_buffers())
print("param+buffer bytes", nb/1e6, "MB")
