"""A/B/C of how a CPU forward runs its layers, interleaved: verispec's compiled layer work and attention
(kernels/layer.cpp, attention.cpp), the attention kernel alone, or torch calls throughout; or, with --isas, the
compiled layers on each w4a8 kernel build.

    python benchmarks/step_ab.py [--context 400] [--sizes 1,5] [--reps 15] [--isas avx512,avxvnni,avx2]

For the default pair as run (w4a8 target, w4a8-4bit draft), the median ms of a target forward over k new tokens
and of a draft step on a `--context`-token cache, switching $VERISPEC_LAYER and $VERISPEC_ATTENTION (or
$VERISPEC_KERNEL_ISA) between the modes within each repetition, so all see the same machine load; after a switch
of build one untimed forward rebuilds the model's layer stack. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from verispec.models.kernels import ATTENTION_ENV, ISA_ENV, LAYER_ENV, cpu_flags, kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

MODES = {  # mode: ($VERISPEC_LAYER, $VERISPEC_ATTENTION)
    "compiled": ("", ""),
    "attention kernel only": ("python", ""),
    "torch": ("python", "sdpa"),
}


def filled_caches(models: dict, context: int, gen: torch.Generator) -> dict:
    """Per model, a cache holding `context` random tokens (room for 32 more), for forwards that commit nothing."""
    caches = {}
    for key, model in models.items():
        cache = model.new_cache(context + 32)
        model.forward(torch.randint(1000, (1, context), generator=gen), cache, last_n=1)
        cache.commit(context)
        caches[key] = cache
    return caches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--sizes", default="1,5", help="target forward sizes (new tokens), comma list")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--target-dtype", default="w4a8")
    ap.add_argument("--draft-dtype", default="w4a8-4bit")
    ap.add_argument("--isas", default="", help="compare these kernel builds (comma list) instead of the layer modes")
    args = ap.parse_args()
    isas = [isa for isa in args.isas.split(",") if isa]
    modes = {isa: {ISA_ENV: isa} for isa in isas} or {
        mode: {LAYER_ENV: layer, ATTENTION_ENV: attention} for mode, (layer, attention) in MODES.items()}
    default_threads()
    models = {"target": load(DEFAULT_TARGET, dtype=args.target_dtype).model,
              "draft": load(DEFAULT_DRAFT, dtype=args.draft_dtype).model}
    gen = torch.Generator().manual_seed(0)
    cases = [("target", int(k)) for k in args.sizes.split(",")] + [("draft", 1)]
    caches = filled_caches(models, args.context, gen)
    times: dict[tuple[str, int, str], list[float]] = {(n, k, m): [] for n, k in cases for m in modes}
    for rep in range(args.reps + 2):  # the first two are warm-up
        for name, k in cases:
            x = torch.randint(1000, (1, k), generator=gen)
            for mode, env in (modes.items() if rep % 2 else reversed(modes.items())):
                os.environ.update(env)
                if isas:  # the layer stack is rebuilt for the build
                    models[name].forward(x, caches[name], last_n=k)
                t0 = time.perf_counter()
                models[name].forward(x, caches[name], last_n=k)  # commits nothing: the cache stays at --context
                if rep >= 2:
                    times[(name, k, mode)].append(time.perf_counter() - t0)
    vnni = "avx512_vnni" if "avx512_vnni" in cpu_flags() else "no avx512_vnni"
    build = f"kernel builds {', '.join(isas)}" if isas else f"kernel build {kernel_isa()}"
    print(f"{vnni}, {build}, {torch.get_num_threads()} threads; context {args.context}; {args.reps} repetitions, "
          "interleaved; median ms\n")
    names = list(modes)
    print("| forward | tokens | " + " | ".join(f"{m} ms" for m in names) + f" | {names[-1]} / {names[0]} |"
          + "".join(f" {m}: × its 1-token step |" for m in names if isas))
    print("|---|---|" + "---|" * (len(names) + 1 + (len(names) if isas else 0)))
    for name, k in cases:
        ms = [1000 * statistics.median(times[(name, k, m)]) for m in names]
        steps = [1000 * statistics.median(times[(name, 1, m)]) for m in names] if isas and (name, 1) in cases else []
        print(f"| {name} | {k} | " + " | ".join(f"{x:.1f}" for x in ms) + f" | {ms[-1] / ms[0]:.2f}× |"
              + "".join(f" {x / s:.2f} |" for x, s in zip(ms, steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
