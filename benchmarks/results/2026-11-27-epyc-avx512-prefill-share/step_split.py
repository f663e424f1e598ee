"""One decoding step at a 250-token context: the forward, its compiled layer stack, and the stack's matmuls alone:
python step_split.py d|t.
"""
import statistics as st
import sys
import time

import torch

from common import matmul_kinds, model
from verispec.models.kernels import w4a8

k = w4a8()
m = model(sys.argv[1])
cache = m.new_cache(2048)
m.forward(torch.randint(0, 1000, (1, 250)), cache, last_n=1)
cache.commit(250)
x1 = torch.tensor([[42]])
plan = m.layer_plan(torch.tensor([250]), torch.arange(251), None, 1)
xin = m.inputs(x1, None)
kinds = list(matmul_kinds(m, 1).values())


def timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def matmuls() -> None:
    for i in range(len(m.layers)):
        for layers, x in kinds:
            k.w4a8_mm(x, *layers[i])


calls = {"stack": lambda: m.run_layers(xin, cache, plan), "its matmuls alone": matmuls,
         "forward": lambda: m.forward(x1, cache, last_n=1)}
for _ in range(5):
    for f in calls.values():
        f()
times = {name: [] for name in calls}
for _ in range(40):
    for name, f in calls.items():
        times[name].append(timed(f))
print(f"{sys.argv[1]}: " + ", ".join(f"{name} {1e3 * st.median(ts):.2f} ms" for name, ts in times.items()))
