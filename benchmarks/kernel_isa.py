"""Time the w4a8 kernel's builds (AVX-512 VNNI, AVX-VNNI, AVX2) side by side on this machine: ms per matmul.

    python benchmarks/kernel_isa.py [--shape 8960x1536] [--rows 1,5,9] [--bits 4,8] [--matrices 8]

The shape is out x in (8960x1536: Qwen2.5-1.5B's gate or up projection). A decoding step reads its weights from
memory, so the script cycles through --matrices copies (8 x 6.9 MB at 4 bits: more than a 32 MB L3) and a
matrix is not found in cache the next time round. Builds are interleaved, the median of --repeats is reported,
and their outputs are checked bit-identical first. On a shared machine the figures are noisy: compare builds
within one run, not across runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.models import kernels
from verispec.models.quant import W4A8Linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="8960x1536", help="out x in")
    ap.add_argument("--rows", default="1,5,9")
    ap.add_argument("--bits", default="4,8")
    ap.add_argument("--matrices", type=int, default=8, help="distinct weight copies cycled through")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="0: torch's default")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n, k = (int(v) for v in args.shape.split("x"))
    builds = {isa: kernels.w4a8(isa) for isa in kernels.available_isas()}
    flags = sorted(f for f in kernels.cpu_flags() if f.startswith(("avx512", "avx2", "avx_vnni", "fma", "f16c")))
    print(f"CPU flags: {' '.join(flags)}; threads {torch.get_num_threads()}; builds {', '.join(builds)}")
    print("bits | rows | " + " | ".join(f"{isa} ms" for isa in builds) + " | ratio (last / first)")
    torch.manual_seed(0)
    for bits in (int(b) for b in args.bits.split(",")):
        layers = [W4A8Linear(torch.nn.Linear(k, n, bias=False), bits=bits) for _ in range(args.matrices)]
        empty = torch.empty(0)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k)
            first = [b.w4a8_mm(x, *layers[0].operands()[:3], empty) for b in builds.values()]
            assert all(torch.equal(y, first[0]) for y in first), "builds differ"
            times: dict[str, list[float]] = {isa: [] for isa in builds}
            for _ in range(args.repeats):
                for isa, b in builds.items():  # interleaved, so drift in the machine's load hits both alike
                    t0 = time.perf_counter()
                    for q in layers:
                        b.w4a8_mm(x, *q.operands()[:3], empty)
                    times[isa].append((time.perf_counter() - t0) / len(layers) * 1e3)
            med = [statistics.median(times[isa]) for isa in builds]
            print(f"{bits} | {rows} | " + " | ".join(f"{m:.3f}" for m in med) + f" | {med[-1] / med[0]:.2f}")


if __name__ == "__main__":
    main()
