# torch's float32 sum on 2 threads over one 1 GiB buffer and over smaller buffers cycled past the L3: best and median of 7
import torch, time, statistics
torch.set_num_threads(2)
for mb in (1024, 16, 8, 0.6):
    n = int(mb * 2**20 / 4)
    copies = max(1, int(128 / mb)) if mb < 1024 else 1
    bufs = [torch.ones(n) for _ in range(copies)]
    for b in bufs: b.sum()
    ts = []
    for rep in range(7):
        t0 = time.perf_counter()
        for b in bufs: b.sum()
        ts.append((time.perf_counter() - t0) / copies)
    t = min(ts); tm = statistics.median(ts)
    print(f"{mb} MB x{copies}: best {n*4/t/1e9:.1f} GB/s, median {n*4/tm/1e9:.1f} GB/s, {tm*1e6:.0f} us a sum")
