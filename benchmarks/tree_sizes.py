"""Token trees on this CPU: the planner's choice beside fixed tree sizes, measured in one interleaved run.

    python benchmarks/tree_sizes.py [--categories code_completion,math,translation] [--sizes 1,2,3,4,6,8] [--reps 1]

1. Measures the draft's per-rank acceptance r_j (how often the target's argmax is the draft's j-th choice) with a
   wide fixed tree on the prompts (greedy).
2. Runs, per prompt and interleaved, the best n-node tree for those r (theory.best_tree) for each n of --sizes, and
   the `tree` strategy's planner (budget = the largest size), all greedy, 128 new tokens.
3. Prints tokens/s per configuration, the planner's mean tree size and the tree theory's predicted speed beside the
   measured one, with the CPU's flags. Every configuration's output is checked against plain decoding.
"""

from __future__ import annotations

import argparse
import statistics
import time

from verispec.bench.suite import load_prompts
from verispec.defaults import default_verify_cost
from verispec.engine import GenerationParams, generate
from verispec.models.base import weight_bytes_per_token
from verispec.models.kernels import cpu_flags, kernel_isa
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.proposers.tree import TreeDraftProposer
from verispec.theory import TreeShape, best_tree, expected_tree_tokens, interpolate_cost, tree_cost

WIDE = TreeShape.from_paths([(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--categories", default="code_completion,math,translation")
    ap.add_argument("--sizes", default="1,2,3,4,6,8")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    default_threads()
    target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
    draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False)
    tok = target.tokenizer
    prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=args.categories.split(","), limit=1)]
    params = GenerationParams(max_new_tokens=args.max_new_tokens, eos_ids=tok.eos_ids)
    max_len = max(len(p) for p in prompts) + args.max_new_tokens + 20
    plain = [generate(target.model, p, params).token_ids for p in prompts]

    # 1. per-rank acceptance with a wide tree (counted by the proposer over whole requests)
    hits, chances = [0.0] * 4, [0.0] * 4
    for p in prompts:
        prop = TreeDraftProposer(draft.model, max_len, target.model.vocab_size, shape=WIDE)
        out = generate(target.model, p, GenerationParams(max_new_tokens=args.max_new_tokens, gamma=len(WIDE),
                                                         eos_ids=tok.eos_ids), prop)
        assert out.token_ids == plain[prompts.index(p)]
        hits = [h + x for h, x in zip(hits, prop.rank_hits)]
        chances = [c + x for c, x in zip(chances, prop.rank_chances)]
    r = [h / c if c else 0.0 for h, c in zip(hits, chances)]
    c = weight_bytes_per_token(draft.model) / weight_bytes_per_token(target.model)
    cost = interpolate_cost(default_verify_cost("cpu", kernel_isa=kernel_isa()))
    print(f"CPU flags: {'avx512_vnni' if 'avx512_vnni' in cpu_flags() else 'no avx512_vnni'}, kernel {kernel_isa()}; "
          f"per-rank acceptance r = {[round(x, 3) for x in r]}, c (bytes) = {c:.3f}")

    # 2. fixed best trees and the planner, interleaved per prompt
    sizes = [int(s) for s in args.sizes.split(",")]
    configs = {f"best n={n}": best_tree(r, n) for n in sizes}
    configs["planner"] = None
    speeds: dict[str, list[float]] = {k: [] for k in configs}
    nodes: list[float] = []
    for rep in range(args.reps):
        for i, p in enumerate(prompts):
            order = list(configs) if (rep + i) % 2 == 0 else list(reversed(configs))
            for name in order:
                shape = configs[name]
                budget = len(shape) if shape is not None else max(sizes)
                prop = TreeDraftProposer(draft.model, max_len, target.model.vocab_size, shape=shape, c=c,
                                         verify_cost=cost)
                t0 = time.perf_counter()
                out = generate(target.model, p, GenerationParams(max_new_tokens=args.max_new_tokens, gamma=budget,
                                                                 eos_ids=tok.eos_ids), prop)
                seconds = time.perf_counter() - t0
                assert out.token_ids == plain[i], name
                speeds[name].append(len(out.token_ids) / seconds)
                if shape is None:
                    nodes.append(out.metrics.drafted / max(1, out.metrics.rounds))
    print("\n| tree | nodes | predicted speed (x a step) | measured tok/s (median) |\n|---|---|---|---|")
    for name, shape in configs.items():
        pred = "–" if shape is None else f"{expected_tree_tokens(shape, r) / tree_cost(shape, c, cost):.2f}"
        size = f"{statistics.mean(nodes):.2f} (mean)" if shape is None else str(len(shape))
        print(f"| {name} | {size} | {pred} | {statistics.median(speeds[name]):.2f} |")
    best = max((k for k in configs if k != "planner"), key=lambda k: statistics.median(speeds[k]))
    print(f"\nbest fixed tree measured: {best}; planner's mean tree: {statistics.mean(nodes):.2f} nodes a round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
