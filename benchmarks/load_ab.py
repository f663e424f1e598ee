"""A/B of where the weights live, interleaved: mapped from the quantized cache file (page cache, what
`load` does) against copied into anonymous allocations (what it did before), for the default pair as run.

    python benchmarks/load_ab.py [--context 400] [--reps 15]

Prints the median ms of a target forward of 1 and 5 new tokens and of a draft step on a `--context`-token cache,
both placements alternating within each repetition. A mapping must not make decoding slower.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from step_ab import filled_caches  # benchmarks/ is on sys.path when this runs as a script
from verispec.models.kernels import cpu_flags, kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    default_threads()
    mapped = {"target": load(DEFAULT_TARGET, dtype="w4a8").model, "draft": load(DEFAULT_DRAFT, dtype="w4a8-4bit").model}
    models = {(name, "mapped"): m for name, m in mapped.items()}
    models.update({(name, "copied"): copy.deepcopy(m) for name, m in mapped.items()})
    gen = torch.Generator().manual_seed(0)
    caches = filled_caches(models, args.context, gen)
    cases = [("target", 1), ("target", 5), ("draft", 1)]
    times: dict[tuple[str, int, str], list[float]] = {(n, k, p): [] for n, k in cases for p in ("mapped", "copied")}
    for rep in range(args.reps + 2):  # the first two are warm-up
        for name, k in cases:
            x = torch.randint(1000, (1, k), generator=gen)
            for place in (("mapped", "copied") if rep % 2 else ("copied", "mapped")):
                t0 = time.perf_counter()
                models[(name, place)].forward(x, caches[(name, place)], last_n=k)  # commits nothing
                if rep >= 2:
                    times[(name, k, place)].append(time.perf_counter() - t0)
    vnni = "avx512_vnni" if "avx512_vnni" in cpu_flags() else "no avx512_vnni"
    print(f"{vnni}, kernel build {kernel_isa()}, {torch.get_num_threads()} threads; context {args.context}; "
          f"{args.reps} repetitions, interleaved; median ms\n")
    print("| forward | tokens | mapped ms | copied ms | mapped / copied |")
    print("|---|---|---|---|---|")
    for name, k in cases:
        a, b = (1000 * statistics.median(times[(name, k, p)]) for p in ("mapped", "copied"))
        print(f"| {name} | {k} | {a:.1f} | {b:.1f} | {a / b:.2f}× |")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
