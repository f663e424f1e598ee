"""A/B of kernel source trees on whole forwards of the default pair: draft step, target step, 5-token target forward.

    python stack_ab.py DIR_A DIR_B [...] [--isa avx512] [--reps 15]

Each DIR holds w4a8.cpp, attention.cpp, layer.cpp, vec.h, tensor.h. Variants interleaved (order reversed every other
repetition); the logits of every case must be bit-identical across variants."""
import argparse, statistics, sys, tempfile, time, shutil
from pathlib import Path
import torch
from torch.utils import cpp_extension
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1] / '2026-11-27-epyc-avx512-prefill-share'))
import verispec.models.kernels as K
from common import model

ap = argparse.ArgumentParser()
ap.add_argument("dirs", nargs="+")
ap.add_argument("--isa", default="avx512")
ap.add_argument("--reps", type=int, default=15)
ap.add_argument("--context", type=int, default=300)
args = ap.parse_args()
mods = []
for i, d in enumerate(args.dirs):
    build = Path(tempfile.mkdtemp(prefix=f"stack-ab-{i}-"))
    for f in K.SOURCES + K.HEADERS:
        shutil.copy(Path(d) / f, build / f)
    mods.append(cpp_extension.load(name=f"stack_ab_{args.isa}_{i}", sources=[str(build / f) for f in K.SOURCES],
                                   extra_cflags=[*K.isa_cflags(args.isa), f"-I{build}"], extra_ldflags=K.LDFLAGS,
                                   build_directory=str(build)))
def use(m):
    K._chosen.clear(); K._attention.clear()
    K._chosen[None] = m; K._attention[None] = m
use(mods[0])
models = {"draft": model("d"), "target": model("t")}
gen = torch.Generator().manual_seed(0)
caches = {}
for name, m in models.items():
    c = m.new_cache(args.context + 32)
    m.forward(torch.randint(1000, (1, args.context), generator=gen), c, last_n=1)
    c.commit(args.context)
    caches[name] = c
cases = [("draft", 1), ("target", 1), ("target", 5)]
times = {(n, k, i): [] for n, k in cases for i in range(len(mods))}
for rep in range(args.reps + 2):
    for name, k in cases:
        x = torch.randint(1000, (1, k), generator=gen)
        outs = []
        for i in (range(len(mods)) if rep % 2 else reversed(range(len(mods)))):
            use(mods[i])
            models[name].forward(x, caches[name], last_n=k)  # rebuild the stack for this module
            t0 = time.perf_counter()
            out = models[name].forward(x, caches[name], last_n=k)
            dt = time.perf_counter() - t0
            outs.append(out)
            if rep >= 2:
                times[(name, k, i)].append(dt)
        assert all(torch.equal(outs[0], o) for o in outs[1:]), f"{name} {k}: variants differ"
print(f"isa {args.isa}, context {args.context}, {args.reps} reps, medians (min) ms")
for name, k in cases:
    ms = [1e3 * statistics.median(times[(name, k, i)]) for i in range(len(mods))]
    mn = [1e3 * min(times[(name, k, i)]) for i in range(len(mods))]
    print(f"{name} {k}: " + "  ".join(f"[{i}] {a:.2f} ({b:.2f})" for i, (a, b) in enumerate(zip(ms, mn)))
          + "  " + "  ".join(f"{i}/0 {ms[i] / ms[0]:.3f}" for i in range(1, len(mods))))
