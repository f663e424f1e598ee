"""The w4a8 kernel before (an fp16 step and offset per group of 32) and after (8-bit codes on a bf16 unit per 8
groups), each with its own layout of the same weights, interleaved: python kernel_ab.py OLD.cpp [--isa avx512|avx2]
(OLD.cpp: `git show e19acf3:verispec/models/kernels/w4a8.cpp`). Median ms of 15 passes over 8 copies."""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

from verispec.models import kernels
from verispec.models.quant import W4A8Linear, affine_groups

ap = argparse.ArgumentParser()
ap.add_argument("old")
ap.add_argument("--isa", default="avx512")
ap.add_argument("--shapes", default="17920x1536,1536x8960,2048x1536,151936x1536")
args = ap.parse_args()
here = Path(kernels.__file__).parent
mods = {}
for tag, src in (("old", Path(args.old)), ("new", here / "w4a8.cpp")):
    build = Path(tempfile.mkdtemp(prefix=f"unit-ab-{tag}-"))
    (build / f"w4a8_{tag}.cpp").write_text(src.read_text())
    mods[tag] = cpp_extension.load(name=f"unit_ab_{args.isa}_{tag}", sources=[str(build / f"w4a8_{tag}.cpp"), str(here / "attention.cpp"), str(here / "layer.cpp")],
                                   extra_cflags=[*kernels.ISA_CFLAGS[args.isa], f"-I{here}"], extra_ldflags=kernels.LDFLAGS,
                                   build_directory=str(build))


def old_layout(q: W4A8Linear, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    _, s, o = affine_groups(w, 2**q.bits - 1)
    n, k = w.shape
    s, o = (t.reshape(n // 16, 16, k // 32).transpose(1, 2).contiguous() for t in (s, o))
    return q.weight, s, o


torch.manual_seed(0)
for shape in args.shapes.split(","):
    n, k = (int(v) for v in shape.split("x"))
    for bits in ((6,) if n > 100000 else (4, 6)):
        copies = 2 if n > 100000 else 8
        lins = [torch.nn.Linear(k, n, bias=False) for _ in range(copies)]
        new = [W4A8Linear(l, bits=bits) for l in lins]
        old = [old_layout(q, l.weight.detach().float()) for q, l in zip(new, lins)]
        ops = {"old": old, "new": [q.operands()[:3] for q in new]}
        nbytes = {t: sum(x.numel() * x.element_size() for x in ops[t][0]) for t in ops}
        for rows in (1, 5):
            x = torch.randn(rows, k)
            times = {"old": [], "new": []}
            for rep in range(15):
                for tag in ("old", "new") if rep % 2 else ("new", "old"):
                    t0 = time.perf_counter()
                    for o in ops[tag]:
                        mods[tag].w4a8_mm(x, *o, torch.empty(0))
                    times[tag].append((time.perf_counter() - t0) / len(ops[tag]) * 1e3)
            a, b = statistics.median(times["old"]), statistics.median(times["new"])
            print(f"{args.isa} {n}x{k} {bits}-bit {rows} row(s): old {a:.3f} ms ({nbytes['old'] / 1e6:.1f} MB, "
                  f"{nbytes['old'] / a / 1e6:.1f} GB/s) | new {b:.3f} ms ({nbytes['new'] / 1e6:.1f} MB, "
                  f"{nbytes['new'] / b / 1e6:.1f} GB/s) | new/old {b / a:.3f}", flush=True)
