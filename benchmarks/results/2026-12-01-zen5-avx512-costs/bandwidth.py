"""Read bandwidth as torch sees it on 2 threads: the median of 9 sums over a 1 GiB int8 buffer (bytes / second)."""
import statistics, time
import torch
torch.set_num_threads(2)
x = torch.ones(1 << 30, dtype=torch.int8)
times = []
for _ in range(9):
    t0 = time.perf_counter(); x.view(torch.int64).sum(); times.append(time.perf_counter() - t0)
print(f"read {x.numel() / statistics.median(times) / 1e9:.1f} GB/s (median of 9; min {x.numel() / max(times) / 1e9:.1f}, max {x.numel() / min(times) / 1e9:.1f})")
