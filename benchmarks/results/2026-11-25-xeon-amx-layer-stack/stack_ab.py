"""One-token and 5-token forwards of the default pair with the decoder layers in one compiled call (the LayerStack)
and in one call per layer, alternated in one process: python stack_ab.py [rounds]."""
import statistics
import sys
import time

import torch

from verispec.models.kernels import kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head

default_threads()
draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False).model
truncate_head(draft, 65536)
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
print("kernel build:", kernel_isa())


def timed(model, t: int, stacked: bool, n: int = 40) -> float:
    """Median ms of n forwards of t tokens over a 300-token cache (the cache rolled back after each)."""
    if stacked:
        model.__dict__.pop("_layer_stack", None)
    else:
        model._layer_stack = lambda *a: None
    cache = model.new_cache(600)
    model.forward(torch.randint(0, 1000, (1, 300)), cache, last_n=1)
    cache.commit(300)
    tok = torch.randint(0, 1000, (1, t))
    for _ in range(5):
        model.forward(tok, cache, last_n=t)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        model.forward(tok, cache, last_n=t)
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


for r in range(rounds):
    for name, model, t in (("draft", draft, 1), ("target", target, 1), ("target", target, 5)):
        a, b = timed(model, t, False), timed(model, t, True)
        print(f"round {r}: {name} {t}-token forward ms: per layer {a:.2f} | stack {b:.2f} | saved {a - b:.2f} ({(a - b) / a:.1%})",
              flush=True)
