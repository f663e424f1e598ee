"""The draft's one-token forward through Rows (as draft_steps runs it) against the same kernel calls with no Python between
them (embedding row, rope rows by slice, stack.run, norm, head), bit-identity first, then interleaved 100-forward timings:
VERISPEC_KERNEL_ISA=avx2 python lean_forward_ab.py d"""
import sys, time, torch, statistics as st
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "2026-11-27-epyc-avx512-prefill-share"))
from common import model
from verispec.batch import make_rows
from verispec.models.kernels import w4a8
m = model(sys.argv[1])
rows = make_rows(m, 1, 1024, 8)
rows.forward([0], [list(range(100, 300))]); rows.commit(0, 200)
def fwd(): return rows.forward([0], [[42]], last_only=True)[0]
stack = m._stack[2]; kern = w4a8()
E = m.embed.weight; cos, sin = m.cos, m.sin
print(E.dtype, cos.dtype, cos.shape, m.norm.weight.dtype)
ops = m.lm_head.operands(); nw = m.norm.weight; eps = m.norm.eps
empty_mask = torch.empty(0, dtype=torch.bool)
cache = rows.cache
def lean():
    p = cache.lengths[0]
    x = E[42:43].float() if E.dtype != torch.float32 else E[42:43]
    c, s = cos[p:p+1].reshape(1,1,-1), sin[p:p+1].reshape(1,1,-1)
    idx = torch.tensor([0]); slots = torch.tensor([[p]])
    k, v = cache.k, cache.v
    y = stack.run(len(m.layers), x, c, s, k, v, idx, slots, p + 1, empty_mask, 0)
    y = m.norm(y)
    return kern.w4a8_mm(y, *ops)
a = fwd(); b = lean()
print("same:", torch.equal(a.reshape(-1)[:b.shape[-1]], b.reshape(-1)), a.shape, b.shape)
for _ in range(20): fwd(); lean()
for rep in range(5):
    r = {}
    for name, f in (("cur", fwd), ("lean", lean)) if rep % 2 == 0 else (("lean", lean), ("cur", fwd)):
        t = time.perf_counter()
        for _ in range(100): f()
        r[name] = (time.perf_counter() - t) * 10
    print("cur %.3f lean %.3f diff %.3f ms" % (r["cur"], r["lean"], r["cur"] - r["lean"]))
rc = cache.row(0)
tok = torch.tensor([[42]])
def mf(): return m.forward(tok, rc, last_n=1)
def rl():
    p = cache.lengths[0]
    pos = p + torch.arange(1)
    x = m.inputs(tok, None)
    y, _ = m.run_layers(x, rc, m.layer_plan(pos, torch.cat([torch.arange(p), pos]), None, 1))
    return m.lm_head(m.norm(y[:, -1:]))
fs = {"cur": fwd, "lean": lean, "m.forward": mf, "run_layers": rl}
res = {k: [] for k in fs}
names = list(fs)
for rep in range(8):
    order = names[rep % 4:] + names[:rep % 4]
    for name in order:
        t = time.perf_counter()
        for _ in range(100): fs[name]()
        res[name].append((time.perf_counter() - t) * 10)
for k, v in res.items(): print(k, "median %.3f ms" % st.median(v), " ".join("%.2f" % x for x in v))
