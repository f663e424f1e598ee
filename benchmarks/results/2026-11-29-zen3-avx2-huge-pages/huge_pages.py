"""A one-token (or T-token) forward of the default draft or target, w4a8, over a 300-token cache, with its weights in
three places, interleaved rep by rep: the cache file mapped as verispec maps it ("file"), the same file mapped
read-only with MADV_HUGEPAGE ("fileRO"), and a private anonymous copy with MADV_HUGEPAGE ("anon2m", 2 MB pages).
An earlier version ran an anonymous copy without the advice ("anon4k") in fileRO's place.

    python huge_pages.py draft|target [T] [reps]
"""
import time, torch, statistics, sys, mmap
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from as_run import model_and_linears
which = sys.argv[1]
model, lin = model_and_linears(which)
cache = model.new_cache(1024)
model.forward(torch.randint(0, 1000, (1, 300)), cache); cache.commit(300)
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1
def step():
    t = time.perf_counter(); model.forward(torch.tensor([[5] * T]), cache, last_n=1); return time.perf_counter() - t
tensors = [(l, n) for l in lin for n in ("weight", "codes", "units")]
orig = {k: getattr(*k) for k in tensors}
def arena(huge):
    HP = 2 << 20
    sizes = [(getattr(l, n).numel() * getattr(l, n).element_size() + 63) // 64 * 64 for l, n in tensors]
    mm = mmap.mmap(-1, sum(sizes) + HP, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge: mm.madvise(mmap.MADV_HUGEPAGE)
    base = torch.frombuffer(mm, dtype=torch.uint8)
    off = (-base.data_ptr()) % HP
    views = {}
    for (l, n), s in zip(tensors, sizes):
        t = orig[(l, n)]
        v = base[off: off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        v.copy_(t); views[(l, n)] = v; off += s
    return mm, views
def file_ro():
    import json, warnings
    from verispec.models.load import resolve
    from verispec.models.quant import cache_file
    path = resolve(DEFAULT_DRAFT if which == "draft" else DEFAULT_TARGET) / cache_file("w4a8-4bit" if which == "draft" else "w4a8")
    keyof = {v.data_ptr(): k for k, v in model.state_dict().items()}
    f = open(path, "rb"); n = int.from_bytes(f.read(8), "little"); header = json.loads(f.read(n))
    mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    mm.madvise(mmap.MADV_HUGEPAGE)
    views = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for (l, nm), t in orig.items():
            key = keyof.get(t.data_ptr())
            if key is None or key not in header or header[key]["data_offsets"][1] - header[key]["data_offsets"][0] != t.numel() * t.element_size():
                views[(l, nm)] = t; continue
            a, b = header[key]["data_offsets"]
            views[(l, nm)] = torch.frombuffer(mm, dtype=torch.uint8, offset=8 + n + a, count=b - a).view(t.dtype).view(t.shape)
    return mm, views
sets = {"file": (None, orig), "fileRO": file_ro(), "anon2m": arena(True)}
print([l for l in open("/proc/self/smaps_rollup").read().splitlines() if "Huge" in l or "Pmd" in l])
print(open("/proc/meminfo").read().split("AnonHugePages:")[1].split("\n")[0].strip())
def use(name):
    for (l, n), v in sets[name][1].items(): setattr(l, n, v)
    model._stack = None
res = {k: [] for k in sets}
for rep in range(int(sys.argv[3]) if len(sys.argv) > 3 else 8):
    for name in sets:
        use(name); step(); step()
        res[name].append(statistics.median([step() for _ in range(8)]))
for name, v in res.items():
    print(f"{which} T={T} {name}: median {statistics.median(v)*1e3:.2f} ms  min {min(v)*1e3:.2f}  all {' '.join(f'{x*1e3:.1f}' for x in v)}")
b = [a / c for a, c in zip(res["fileRO"], res["anon2m"])]
print("fileRO/anon2m per rep:", " ".join(f"{x:.3f}" for x in b), "geo", f"{statistics.geometric_mean(b):.3f}")
b = [a / c for a, c in zip(res["file"], res["anon2m"])]
print("file/anon2m per rep:", " ".join(f"{x:.3f}" for x in b), "geo", f"{statistics.geometric_mean(b):.3f}")
