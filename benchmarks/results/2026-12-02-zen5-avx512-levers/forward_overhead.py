"""What a one-token forward of the default draft (w4a8-4bit, ids < 65536) and of an EAGLE drafter spends outside its
compiled calls: the forward as the proposers call it (`Rows.forward`, 400-token cache) against its compiled pieces
called back to back with their arguments made once (so the caches are evicted alike), medians of 60.

    python forward_overhead.py [EAGLE_DIR]     # EAGLE_DIR: a drafter (`verispec train-drafter --kind eagle`)
"""
import statistics
import sys
import time

import torch

from verispec.batch import make_rows
from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head

default_threads()


def med(f, n=60):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def measure(name, m, features=None):
    rows = make_rows(m, 1, 1024, 16)
    H, D = m.cfg.hidden_size, m.cfg.head_dim
    feats = None if features is None else [torch.randn(400, H)]
    rows.forward([0], [list(range(1000, 1400))], last_only=True, features=feats)
    rows.commit(0, 400)
    one = None if features is None else [torch.randn(1, H)]
    rows.forward([0], [[1234]], last_only=True, features=one)  # builds the layer stack
    stack, row = m._stack[2], rows.cache.row(0)
    k, v = row.buffers()
    s = row.length
    cos, sin = (t[s:s + 1].reshape(-1, 1, D).contiguous() for t in (m.cos, m.sin))
    idx, slots, mask = torch.tensor([0]), torch.tensor([[s]]), torch.empty(0, dtype=torch.bool)
    x = torch.randn(1, H)

    def full():
        rows.forward([0], [[1234]], last_only=True, features=one, hidden=features is not None)

    def pieces():  # the input (the EAGLE drafter: its fc too), the layers, the final norm and head
        m.inputs(torch.tensor([[1234]]), None if one is None else one[0][None])
        y = stack.run(m.cfg.num_hidden_layers, x, cos, sin, k, v, idx, slots, s + 1, mask, 0)
        m.lm_head(m.norm(y.view(1, 1, H)))

    for rep in range(5):
        a, p = med(full), med(pieces)
        print(f"{name}: forward {a:.3f} ms, its compiled pieces back to back {p:.3f} ms, outside them {a - p:.3f} ms")


draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False).model
truncate_head(draft, 65536)
measure("draft 0.5B", draft)
if len(sys.argv) > 1:
    target = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
    measure("EAGLE drafter", load_drafter(sys.argv[1], target, quantize_kind="w4a8-4bit"), features=True)
