"""The layers' w4a8 matmuls of the draft or the target alone, back to back over their own weights (medians of 60).

    [VERISPEC_KERNEL_ISA=avx2] python matmuls_alone.py draft|target [ROWS]
"""
import statistics
import sys
import time

import torch

from verispec.models.kernels import kernel_isa, w4a8
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import W4A8Linear

default_threads()
which = sys.argv[1]
M = int(sys.argv[2]) if len(sys.argv) > 2 else 1
model = load(DEFAULT_DRAFT if which == "draft" else DEFAULT_TARGET,
             dtype="w4a8-4bit" if which == "draft" else "w4a8").model
linears = [m for m in model.layers.modules() if isinstance(m, W4A8Linear)]  # the layers' four, not the head
ops = [m.operands()[:3] for m in linears]
xs = {k: torch.randn(M, k) for k in {m.in_features for m in linears}}
k, none = w4a8(), torch.empty(0)
ts = []
for _ in range(60):
    t = time.perf_counter()
    for m, (w, s, o) in zip(linears, ops):
        k.w4a8_mm(xs[m.in_features], w, s, o, none)
    ts.append(time.perf_counter() - t)
nbytes = sum(t.numel() * t.element_size() for op in ops for t in op)
t = statistics.median(ts)
print(kernel_isa(), which, "M", M, f"matmuls of all layers: {1e3 * t:.2f} ms, {nbytes / 1e6:.1f} MB, "
      f"{nbytes / t / 1e9:.1f} GB/s")
