import statistics, sys, time, torch
from verispec.models.kernels import kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
default_threads()
draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False).model
truncate_head(draft, 65536)
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
def timed(model, t, n=40):
    cache = model.new_cache(600)
    model.forward(torch.randint(0, 1000, (1, 300)), cache, last_n=1); cache.commit(300)
    tok = torch.randint(0, 1000, (1, t))
    for _ in range(5): model.forward(tok, cache, last_n=t)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); model.forward(tok, cache, last_n=t); ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)
out = [f"{timed(draft, 1):.2f}", f"{timed(target, 1):.2f}", f"{timed(target, 5):.2f}"]
print(sys.argv[1], kernel_isa(), "draft1 target1 target5 ms:", *out, flush=True)
