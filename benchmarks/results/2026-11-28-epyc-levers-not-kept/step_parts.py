import sys, time, torch, statistics
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1] / '2026-11-27-epyc-avx512-prefill-share'))
from common import model
import verispec.models.llama as L
m = model(sys.argv[1])
cache = m.new_cache(340)
m.forward(torch.randint(1000, (1, 300)), cache, last_n=1)
cache.commit(300)
x = torch.randint(1000, (1, 1))
# wrap stack.run and lm_head to time them
rec = {"run": [], "head": []}
stack = m._layer_stack(m.inputs(x, None), m.layer_plan(torch.tensor([300]), torch.arange(301), None, 1), len(m.layers))
orig_run = type(stack).run
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
