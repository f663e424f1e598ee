"""A/B of the attention kernel: an older attention.cpp against the package's, in one process, bit for bit and timed.

    python benchmarks/attention_ab.py OLD_attention.cpp [--isa avx512|avxvnni|avx2] [--reps 30]

Builds OLD in place of the package's attention.cpp (kernel_ab.build_version), checks that both give the same bits
on the shapes of the packaged pair's forwards (a decoding step, a 7-token verification, a 300-token prefill, a token
tree's mask, a head size that is not a multiple of 16), then times each shape, the two versions alternated, over
keys and values evicted from the caches as a forward's weights evict them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from kernel_ab import build_version

from verispec.models.kernels import ISA_CFLAGS, cpu_model, w4a8

# (name, query heads, key heads, head size, keys, queries): the 0.5B draft (14 / 2 heads of 64), the 1.5B target
# (12 / 2 of 128)
SHAPES = [("draft step", 14, 2, 64, 300, 1), ("target step", 12, 2, 128, 300, 1),
          ("target 7-token verification", 12, 2, 128, 300, 7), ("target 300-token prefill", 12, 2, 128, 300, 300),
          ("target step, 1000 keys", 12, 2, 128, 1000, 1)]


def check(old, new) -> int:
    """Both versions' outputs on random shapes and masks; returns the number of cases."""
    g = torch.Generator().manual_seed(0)
    cases = 0
    for h, kv, d, s, t in [(14, 2, 64, 37, 1), (12, 2, 128, 300, 7), (4, 2, 80, 19, 19), (6, 3, 16, 5, 2),
                           (8, 1, 64, 1, 1), (12, 2, 128, 65, 33), (2, 2, 48, 200, 3)]:
        for b in (1, 2):
            q, k, v = (torch.randn(*shape, generator=g) for shape in ((b, h, t, d), (b, kv, s, d), (b, kv, s, d)))
            masks = [torch.empty(0, dtype=torch.bool),
                     torch.rand(b, t, s, generator=g) < 0.6,  # a tree's: keys with gaps, some queries see none
                     torch.zeros(b, t, s, dtype=torch.bool)]
            for mask in masks:
                a, z = old.attention(q, k, v, mask, d ** -0.5), new.attention(q, k, v, mask, d ** -0.5)
                if not torch.equal(a.view(torch.int32), z.view(torch.int32)):
                    raise SystemExit(f"bits differ: {(b, h, kv, d, s, t)}, mask {tuple(mask.shape)}: "
                                     f"max |diff| {(a - z).abs().max().item():.3g}")
                cases += 1
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", help="the older attention.cpp")
    ap.add_argument("--isa", default="avx512", choices=list(ISA_CFLAGS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--hot", action="store_true", help="keys and values left in the caches between calls")
    args = ap.parse_args()
    old, new = build_version(args.old, args.isa, "old", replaces="attention.cpp"), w4a8(args.isa)
    print(f"{cpu_model()}, kernel build {args.isa}, {torch.get_num_threads()} threads")
    print(f"same bits in {check(old, new)} cases (causal, tree-like and empty masks; 1-2 rows)\n")
    evict = torch.ones(16 << 20)  # 64 MB read between calls, clean lines as weights leave them: keys, values in memory
    print("| shape | old µs | new µs | new / old |\n|---|---|---|---|")
    for name, h, kv, d, s, t in SHAPES:
        q, k, v = torch.randn(1, h, t, d), torch.randn(1, kv, s, d), torch.randn(1, kv, s, d)
        mask = torch.empty(0, dtype=torch.bool)
        times: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(args.reps):
            for tag, mod in (("old", old), ("new", new)) if i % 2 else (("new", new), ("old", old)):
                if not args.hot:
                    evict.sum()
                t0 = time.perf_counter()
                mod.attention(q, k, v, mask, d ** -0.5)
                times[tag].append(time.perf_counter() - t0)
        a, z = (statistics.median(times[x]) for x in ("old", "new"))
        shape = f"{name} ({h}/{kv} heads of {d}, {s} keys, {t} queries)"
        print(f"| {shape} | {1e6 * a:.1f} | {1e6 * z:.1f} | {z / a:.2f} |")


if __name__ == "__main__":
    main()
