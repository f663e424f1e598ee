import time, torch, statistics, sys
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
default_threads()
t = load(DEFAULT_TARGET, dtype="w4a8", progress=False); m = t.model
cache = m.new_cache(800)
ids = torch.randint(0, 1000, (1, 300))
m.forward(ids, cache, last_n=1); cache.commit(300)
res = {}
for rep in range(3):
  for k in (1, 2, 3, 4, 5, 7, 9, 16):
    tok = torch.randint(0, 1000, (1, k))
    for _ in range(2): m.forward(tok, cache)
    ts=[]
    for _ in range(8):
        t0=time.perf_counter(); m.forward(tok, cache); ts.append(time.perf_counter()-t0)
    res.setdefault(k, []).append(statistics.median(ts))
one = statistics.median(res[1])
print(sys.argv[1], "1-token ms", round(1e3*one,1), {k: round(statistics.median(v)/one, 2) for k, v in res.items()})
