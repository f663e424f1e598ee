"""The default configuration (w4a8 target, w4a8-4bit draft, `auto`) and plain decoding on each w4a8 kernel build,
interleaved in one process: each suite prompt is decoded by every (build, strategy) in turn with a rotating start,
greedy, so all builds see the same machine load. Prints decode tok/s (prefill excluded) per build and category,
tau, the ratio to the first build, and how many outputs differ from the first build's plain decoding.

    python benchmarks/isa_ab.py [--isas avx2,avxvnni] [--categories code_completion,...] [--limit 1] [--gamma 4]

Switching $VERISPEC_KERNEL_ISA switches the build the models' layer stacks run on (rebuilt at the first forward).
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict

from verispec.bench.suite import CATEGORIES, load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.kernels import ISA_ENV, cpu_model
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.strategies import make_proposer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isas", default="avx2,avxvnni", help="kernel builds, the first the baseline")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--limit", type=int, default=1, help="prompts per category")
    ap.add_argument("--gamma", type=int, default=4, help="auto's cap (the AVX2 and AVX-VNNI builds' default)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    default_threads()
    isas = args.isas.split(",")
    target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
    draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False, tokenizer_like=target.tokenizer)
    truncate_head(draft.model, 65536)
    prompts = [(p.category, target.tokenizer.chat(list(p.messages)))
               for p in load_prompts("suite", categories=args.categories.split(","), limit=args.limit)]
    max_len = max(len(p) for _, p in prompts) + args.max_new_tokens + 16
    configs = [(isa, s) for isa in isas for s in ("ar", "auto")]

    def run(isa: str, strategy: str, prompt: list[int], n: int):
        os.environ[ISA_ENV] = isa  # the proposer's verification curve is the build's, as in a fresh process
        proposer = make_proposer(strategy, target, draft, max_len, max_gamma=args.gamma)
        return generate(target.model, prompt, GenerationParams(max_new_tokens=n, gamma=args.gamma), proposer)

    for isa, s in configs:  # warm-up: each build compiled and its stacks built
        run(isa, s, prompts[0][1], 8)
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0])  # (config, category) -> tokens, s, rounds
    differ = defaultdict(int)
    for i, (cat, p) in enumerate(prompts):
        order = configs[i % len(configs):] + configs[:i % len(configs)]
        outs = {}
        for isa, s in order:
            g = run(isa, s, p, args.max_new_tokens)
            m = g.metrics
            for key in ((isa, s, cat), (isa, s, "all")):
                acc = sums[key]
                acc[0] += m.new_tokens
                acc[1] += m.seconds - m.prefill_seconds
                acc[2] += m.rounds
            outs[(isa, s)] = g.token_ids
        for c in configs:
            differ[c] += outs[c] != outs[(isas[0], "ar")]
        print(f"{i} {cat}: " + ", ".join(f"{isa} {s} {sums[(isa, s, cat)][0] / sums[(isa, s, cat)][1]:.1f}"
                                          for isa, s in configs), flush=True)
    print(f"\nCPU: {cpu_model()}; {len(prompts)} prompts, greedy, {args.max_new_tokens} new tokens, auto gamma <= "
          f"{args.gamma}; decode tok/s (tau)\n")
    cats = [c for c in dict.fromkeys(cat for cat, _ in prompts)] + ["all"]
    print("| category | " + " | ".join(f"{isa} {s}" for isa, s in configs) + " |"
          + "".join(f" {s} {isa} / {isas[0]} |" for isa in isas[1:] for s in ("ar", "auto")))
    print("|---|" + "---|" * (len(configs) + 2 * (len(isas) - 1)))
    for cat in cats:
        rate = {(isa, s): sums[(isa, s, cat)][0] / sums[(isa, s, cat)][1] for isa, s in configs}
        cells = [f"{rate[c]:.1f}" + (f" ({sums[(*c, cat)][0] / sums[(*c, cat)][2]:.2f})" if c[1] == "auto" else "")
                 for c in configs]
        print(f"| {cat} | " + " | ".join(cells) + " |"
              + "".join(f" {rate[(isa, s)] / rate[(isas[0], s)]:.2f}× |" for isa in isas[1:] for s in ("ar", "auto")))
    print("\noutputs differing from " + f"{isas[0]} ar: " + ", ".join(f"{isa} {s} {differ[(isa, s)]}/{len(prompts)}"
                                                                      for isa, s in configs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
