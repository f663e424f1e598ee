"""The default pair's forwards with the kernel built from an older source against the package's, interleaved.

    git show a79e17b:verispec/models/kernels/w4a8.cpp > /tmp/before.cpp
    [VERISPEC_KERNEL_ISA=avx2] python benchmarks/model_ab.py /tmp/before.cpp [--replaces w4a8.cpp] [--sizes 1,2,3,5,7]
        [--prefill 300] [--reps 15]

Median ms of a target forward over k new tokens on a --context-token cache, a draft step, and a --prefill-token
target prefill, each with both builds in alternating order within a repetition (one untimed forward after a
switch rebuilds the layer stack for the build). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_ab import build_version  # noqa: E402
from step_ab import filled_caches  # noqa: E402

from verispec.models import kernels  # noqa: E402
from verispec.models.kernels import ISA_ENV, cpu_model, kernel_isa  # noqa: E402
from verispec.models.load import default_threads, load  # noqa: E402
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="the older source")
    ap.add_argument("--replaces", default="w4a8.cpp", choices=kernels.SOURCES,
                    help="the package's source it stands in for")
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--sizes", default="1,2,3,5,7")
    ap.add_argument("--prefill", type=int, default=300)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    default_threads()
    isa = kernel_isa()
    key = os.environ.get(ISA_ENV)
    builds = {"before": build_version(args.before, isa, "before", replaces=args.replaces), "after": kernels.w4a8()}
    models = {"target": load(DEFAULT_TARGET, dtype="w4a8").model, "draft": load(DEFAULT_DRAFT, dtype="w4a8-4bit").model}
    gen = torch.Generator().manual_seed(0)
    caches = filled_caches(models, args.context, gen)
    cases = [("target", int(k)) for k in args.sizes.split(",")] + [("draft", 1), ("prefill", args.prefill)]
    times: dict[tuple[str, int, str], list[float]] = {(n, k, b): [] for n, k in cases for b in builds}
    for rep in range(args.reps + 2):  # the first two are warm-up
        for name, k in cases:
            x = torch.randint(1000, (1, k), generator=gen)
            model = models["target" if name == "prefill" else name]
            for b in (builds if rep % 2 else list(builds)[::-1]):
                kernels._chosen[key] = kernels._attention[key] = builds[b]
                cache = model.new_cache(k + 8) if name == "prefill" else caches[name]
                model.forward(x[:, :8], model.new_cache(16), last_n=1)  # rebuilds the layer stack for this build
                t0 = time.perf_counter()
                model.forward(x, cache, last_n=1 if name == "prefill" else k)  # commits nothing
                if rep >= 2:
                    times[(name, k, b)].append(time.perf_counter() - t0)
    print(f"{cpu_model()}; {args.replaces} of {args.before} against the package's")
    print(f"kernel build {isa}, {torch.get_num_threads()} threads; context {args.context}; {args.reps} repetitions, "
          "interleaved; median ms\n")
    print("| forward | tokens | before ms | after ms | after / before | before: × its step | after: × its step |")
    print("|---|---|---|---|---|---|---|")
    for name, k in cases:
        ms = [1000 * statistics.median(times[(name, k, b)]) for b in builds]
        step = [1000 * statistics.median(times[("target", 1, b)]) for b in builds] if name == "target" else None
        ratio = " | ".join(f"{m / s:.2f}" for m, s in zip(ms, step)) if step else "– | –"
        print(f"| {name} | {k} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[1] / ms[0]:.3f}× | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
