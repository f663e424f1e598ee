"""A/B the compiled layer stack of kernel source dirs: python stack_ab.py t|d rows dirA dirB [dirC ...] [reps]"""
import sys, time, statistics as st, tempfile, shutil
from pathlib import Path
import torch
from torch.utils import cpp_extension
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "2026-11-27-epyc-avx512-prefill-share"))
from common import model
from verispec.models import kernels
from verispec.models.kernels import isa_cflags
isa = kernels.kernel_isa() if hasattr(kernels, "kernel_isa") else "avx2"
import os; isa = os.environ.get("VERISPEC_KERNEL_ISA", isa)
def build(d, tag):
    b = Path(tempfile.mkdtemp(prefix=f"sab-{tag}-"))
    for f in Path(d).iterdir(): shutil.copy(f, b / f.name)
    srcs = [str(b / n) for n in kernels.SOURCES]
    return cpp_extension.load(name=f"sab_{isa}_{tag}", sources=srcs, extra_cflags=[*isa_cflags(isa), f"-I{b}"],
                              extra_ldflags=kernels.LDFLAGS, build_directory=str(b))
which, R, dirs = sys.argv[1], int(sys.argv[2]), [a for a in sys.argv[3:] if not a.isdigit()]  # two or more dirs
reps = int(next((a for a in sys.argv[3:] if a.isdigit()), 30))
mods = [build(d, f"v{i}") for i, d in enumerate(dirs)]
m = model(which)
ops, eps = zip(*(b.stack_operands() for b in m.layers))
ops = [t for o in ops for t in o]; eps = [e for p in eps for e in p]
stacks = [mod.LayerStack(ops, eps, m.cfg.num_attention_heads, m.cfg.num_key_value_heads) for mod in mods]
ctx = int(os.environ.get("CTX", 250))
cache = m.new_cache(2048)
with torch.inference_mode():
    m.forward(torch.randint(0, 1000, (1, ctx)), cache, last_n=1); cache.commit(ctx)
    x = torch.randint(0, 1000, (1, R)); pos = ctx + torch.arange(R)
    mask = torch.ones(R, ctx + R, dtype=torch.bool).tril(ctx) if R > 1 else None
    plan = m.layer_plan(pos, torch.arange(ctx + R), mask, 1)
    xin = m.inputs(x, None)
    cos, sin, attend = plan[0]
    index, slots, read = attend.cache_plan(cache, 1, R)
    cos, sin = (c.reshape(-1, R, m.cfg.head_dim).contiguous() for c in (cos, sin))
    k, v = cache.buffers()
    rows = xin.reshape(R, -1).contiguous()
    outs = [s.run(len(m.layers), rows, cos, sin, k, v, index, slots, read, attend.mask, 0) for s in stacks]
    print("bit-identical:", all(torch.equal(outs[0], o) for o in outs[1:]))
    ts = [[] for _ in stacks]
    for rep in range(reps):
        order = range(len(stacks)) if rep % 2 else reversed(range(len(stacks)))
        for i in order:
            t = time.perf_counter(); stacks[i].run(len(m.layers), rows, cos, sin, k, v, index, slots, read, attend.mask, 0)
            ts[i].append(time.perf_counter() - t)
    med = [st.median(t) * 1e3 for t in ts]
    print(f"{which} R={R} ctx={ctx}: " + "  ".join(f"{d}: {v:.3f} ms ({v/med[0]:.3f}x)" for d, v in zip(dirs, med)))
