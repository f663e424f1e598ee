"""A decoding step's forward split into its compiled layer stack, its LM head and the Python around them (400
steps on a 300-token cache, medians of the last 350): python step_parts.py d|t"""
import sys, time, torch, statistics
from steploop import stepping
m, cache, x = stepping(sys.argv[1])
rec = {"run": [], "head": []}  # seconds of each call of the layer stack and of the LM head
stack = m._layer_stack(m.inputs(x, None), m.layer_plan(torch.tensor([300]), torch.arange(301), None, 1), len(m.layers))
class Wrap:
    def __init__(self, s): self.s = s
    def run(self, *a):
        t = time.perf_counter(); r = self.s.run(*a); rec["run"].append(time.perf_counter() - t); return r
w = Wrap(stack)
m._layer_stack = lambda *a, **k: w
head = m.lm_head
class H(torch.nn.Module):
    def __init__(s): super().__init__(); s.h = head
    def forward(s, v):
        t = time.perf_counter(); r = s.h(v); rec["head"].append(time.perf_counter() - t); return r
m.lm_head = H()
tot = []
for i in range(400):
    t = time.perf_counter(); m.forward(x, cache, last_n=1); tot.append(time.perf_counter() - t)
f = lambda v: 1e3 * statistics.median(v[50:])
print(f"forward {f(tot):.3f} ms, run {f(rec['run']):.3f}, head {f(rec['head']):.3f}, rest {f(tot) - f(rec['run']) - f(rec['head']):.3f}")
