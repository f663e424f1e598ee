"""Per-kind time of the target's (or draft's) w4a8 matmuls at one row, walking the layers in order as a forward does."""
import statistics, sys, time, torch
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.kernels import w4a8
from verispec.models.quant import truncate_head
default_threads()
which = sys.argv[1]; rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if which == "draft":
    m = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False).model; truncate_head(m, 65536)
else:
    m = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
k = w4a8()
kinds = {}
for b in m.layers:
    for name in ("wqkv", "wo", "w13", "w2"):
        ops = getattr(b, name).operands()
        kinds.setdefault(name, []).append(ops[:4] if name == "wqkv" else (*ops[:3], torch.empty(0)))
head = m.lm_head.operands() if hasattr(m.lm_head, "operands") else None
print("head type", type(m.lm_head).__name__)
tot = {n: [] for n in kinds}; tot["head"] = []
for rep in range(7):
    acc = {n: 0.0 for n in tot}
    for i in range(len(m.layers)):
        for n in ("wqkv", "wo", "w13", "w2"):
            w, s, o, bias = kinds[n][i]
            x = torch.randn(rows, w.shape[1] * (8 if w.shape[1] * 8 == s.shape[1] * 32 else 1) if False else s.shape[1] * 32)
            t0 = time.perf_counter(); k.w4a8_mm(x, w, s, o, bias); acc[n] += time.perf_counter() - t0
    if head is not None:
        w, s, o = head[:3]
        x = torch.randn(rows, s.shape[1] * 32)
        t0 = time.perf_counter(); k.w4a8_mm(x, w, s, o, torch.empty(0)); acc["head"] += time.perf_counter() - t0
    for n in tot: tot[n].append(acc[n])
nbytes = {}
for n in kinds:
    nbytes[n] = sum(w.numel() + s.numel() * 4 for w, s, o, _ in kinds[n])
if head is not None: nbytes["head"] = head[0].numel() + head[1].numel() * 4
allms = 0
for n in tot:
    ms = statistics.median(tot[n]) * 1e3; allms += ms
    print(f"{n}: {ms:.2f} ms, {nbytes.get(n, 0)/1e6:.0f} MB, {nbytes.get(n,0)/ms/1e6:.1f} GB/s")
print(f"all matmuls {allms:.2f} ms, {sum(nbytes.values())/1e6:.0f} MB")
