"""The w4a8 matmul on each kernel build this CPU runs, interleaved: ms and GB/s of weights read per shape, bits and
rows, so a build's slower step can be traced to the matrices (and bit widths) that cost it.

    python benchmarks/isa_mm.py [--isas avx512,avxvnni,avx2] [--shapes 8960x1536,1536x8960] [--bits 4,6]
        [--rows 1,5] [--reps 15]

Weights in enough copies, cycled, to pass 64 MB (at least 8; kernel_ab.weight_copies): more than most L3s,
but where the L3 is larger (480 MB on the Intel Xeon VMs) the copies stay in it and the GB/s are the L3's, which
times the builds' arithmetic rather than memory. Medians, the builds' order reversed every other repetition. Every
build's output is checked bit-identical to the first's.
"""

from __future__ import annotations

import argparse

import torch
from kernel_ab import median_ms, weight_copies

from verispec.models import kernels
from verispec.models.load import default_threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isas", default="avx512,avxvnni,avx2", help="kernel builds, the first the baseline")
    ap.add_argument("--shapes", default="8960x1536,1536x8960",
                    help="out x in, comma list (the LM head, 151936x1536, builds 8 float copies: ~7.5 GB)")
    ap.add_argument("--bits", default="4,6", help="weight bits, comma list (3, 4, 6, 8)")
    ap.add_argument("--rows", default="1,5", help="rows (tokens) of x, comma list")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    default_threads()
    isas = args.isas.split(",")
    mods = {isa: kernels.w4a8(isa) for isa in isas}
    torch.manual_seed(0)
    print(f"{kernels.cpu_model()}; builds {', '.join(isas)}; {torch.get_num_threads()} threads; medians of {args.reps}\n")
    print("| matrix | bits | rows | MB | " + " | ".join(f"{i} ms" for i in isas) + " | "
          + " | ".join(f"{i} GB/s" for i in isas) + " | " + " | ".join(f"{i} / {isas[0]}" for i in isas[1:]) + " |")
    print("|" + "---|" * (4 + 3 * len(isas) - 1))
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for bits in (int(b) for b in args.bits.split(",")):
            mats = weight_copies(n, k, bits)
            nbytes = sum(t.numel() * t.element_size() for t in mats[0].operands()[:3])
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k)
                outs = [mods[i].w4a8_mm(x, *mats[0].operands()[:3], torch.empty(0)) for i in isas]
                assert all(torch.equal(outs[0], o) for o in outs[1:]), "the builds' outputs differ"
                ms = median_ms(lambda i, q: mods[i].w4a8_mm(x, *q.operands()[:3], torch.empty(0)), isas, mats,
                               args.reps)
                print(f"| {n}x{k} | {bits} | {rows} | {nbytes / 1e6:.1f} | " + " | ".join(f"{ms[i]:.3f}" for i in isas)
                      + " | " + " | ".join(f"{nbytes / ms[i] / 1e6:.1f}" for i in isas) + " | "
                      + " | ".join(f"{ms[i] / ms[isas[0]]:.2f}×" for i in isas[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
