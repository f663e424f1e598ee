"""An EAGLE drafter's one-token step with its input projection whole (bf16 weights where the CPU has bf16, as
until 2026-12-02) against it split (TokenTableFc), in alternation, and the target's one-token step in between:
c = drafter step / target step for each, medians of 40 per rep, 400-token caches.

    python fc_ab.py DRAFTER_DIR [REPS]
"""
import statistics
import sys
import time

import torch

from verispec.batch import make_rows
from verispec.models.eagle import Bf16Linear, TokenTableFc, load_drafter
from verispec.models.kernels import cpu_flags
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET

default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
t0 = time.perf_counter()
drafter = load_drafter(sys.argv[1], target, quantize_kind="w4a8-4bit")
print(f"load_drafter (the table built) {time.perf_counter() - t0:.2f} s")
split = drafter.fc
assert isinstance(split, TokenTableFc)
whole = load_drafter(sys.argv[1], target).fc  # the float layer as trained
if "avx512_bf16" in cpu_flags():
    whole = Bf16Linear(whole)
H = drafter.eagle.hidden_size
rows = make_rows(drafter, 1, 1024, 16)
prompt = list(range(1000, 1400))
rows.forward([0], [prompt], last_only=True, features=[torch.randn(400, H)])
rows.commit(0, 400)
trows = make_rows(target, 1, 1024, 16)
trows.forward([0], [prompt], last_only=True)
trows.commit(0, 400)
feat = [torch.randn(1, H)]


def med(f, n=40):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def dstep():  # a drafting step: one pair, the drafter's features returned, as draft_steps asks
    rows.forward([0], [[1234]], last_only=True, features=feat, hidden=True)


def tstep():
    trows.forward([0], [[1234]], last_only=True)


ratios = []
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 6):
    order = [("whole", whole), ("split", split)][:: 1 if rep % 2 == 0 else -1]
    got = {}
    for name, fc in order:
        drafter.fc = fc
        got[name] = med(dstep)
    tt = med(tstep)
    ratios.append(got["split"] / got["whole"])
    print(f"rep {rep}: target step {tt:.2f} ms; drafter step, fc whole {got['whole']:.3f} ms (c {got['whole'] / tt:.3f}), "
          f"split {got['split']:.3f} ms (c {got['split'] / tt:.3f}); split / whole {ratios[-1]:.3f}")
print(f"split / whole, geometric mean over reps: {statistics.geometric_mean(ratios):.3f}")
