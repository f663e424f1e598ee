"""The target's one-token step beside the machine's read bandwidth, measured in alternation (issue 15: a step within
1.2x the time its weights take to stream at that bandwidth). Each pair: the best of 5 sums over a 1 GiB buffer
(bytes / s, 2 threads), then the median of 15 one-token steps of the default target (w4a8) at a 400-token cache.

    python step_vs_bandwidth.py [pairs]
"""
import statistics, sys, time
import torch
from verispec.bench.costs import weight_bytes_per_token
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET

default_threads()
model = load(DEFAULT_TARGET, dtype="w4a8", progress=False).model
nbytes = weight_bytes_per_token(model)
cache = model.new_cache(1024)
model.forward(torch.randint(0, 1000, (1, 400)), cache)
cache.commit(400)
buf = torch.ones(2**30 // 4, dtype=torch.float32)
buf.sum()


def bandwidth() -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter(); buf.sum(); best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best


def step_ms() -> float:
    times = []
    for _ in range(15):
        t0 = time.perf_counter(); model.forward(torch.tensor([[5]]), cache); times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


print(f"weights read a step: {nbytes / 1e6:.1f} MB")
ratios = []
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    bw = bandwidth(); ms = step_ms()
    limit = 1000 * nbytes / bw
    ratios.append(ms / limit)
    print(f"pair {i}: {bw / 1e9:.1f} GB/s -> limit {limit:.1f} ms; step {ms:.1f} ms; step / limit {ms / limit:.2f}", flush=True)
print(f"step / limit: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
