"""The EAGLE drafter as a chain and as EAGLE-2's dynamic tree, against plain decoding, in one interleaved run.

    python benchmarks/eagle_tree.py --drafter ~/.cache/verispec/drafters/qwen2.5-coder-1.5b-instruct-eagle \
        [--categories code_completion,code_edit,math] [--trees 2x3:4,3x4:8,4x5:12] [--gammas 2,4]

Per prompt, every configuration runs once in turn (greedy, the default w4a8 target): plain decoding, the chain at
each --gammas, and each tree K x D : N (top-k K, depth D, N nodes verified). Prints tokens/s (decoding and the
whole request), tokens per target forward (tau), the draft's share c, and checks every output against plain
decoding. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.kernels import cpu_flags
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.strategies import StrategyOptions, make_proposer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--categories", default="code_completion,code_edit,math")
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--gammas", default="2,4")
    ap.add_argument("--trees", default="2x3:4,3x4:8,4x5:12")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    default_threads()
    target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
    tok = target.tokenizer
    prompts = [tok.chat(list(p.messages))
               for p in load_prompts("suite", categories=args.categories.split(","), limit=args.limit)]
    max_len = max(len(p) for p in prompts) + args.max_new_tokens + 40
    configs: list[tuple[str, int, tuple[int, int] | None]] = [("plain", 0, None)]
    configs += [(f"eagle chain γ={g}", g, None) for g in map(int, args.gammas.split(","))]
    for spec in args.trees.split(","):
        shape, nodes = spec.split(":")
        k, d = map(int, shape.split("x"))
        configs.append((f"eagle tree {k}x{d}, {nodes} nodes", int(nodes), (k, d)))
    drafter = str(Path(args.drafter).expanduser())
    def proposer_for(gamma: int, tree: tuple[int, int] | None):
        return None if gamma == 0 else make_proposer("eagle", target, None, max_len,
                                                     StrategyOptions(drafter=(drafter,), eagle_tree=tree))

    for _, gamma, tree in configs:  # warm-up, not counted
        generate(target.model, prompts[0], GenerationParams(max_new_tokens=8, gamma=max(gamma, 1)),
                 proposer_for(gamma, tree))
    # per config: new tokens, whole-request s, decoding s (after the first token), rounds, c x rounds, outputs that
    # differ from plain decoding
    sums = {name: [0, 0.0, 0.0, 0, 0.0, 0] for name, _, _ in configs}
    for i, prompt in enumerate(prompts):
        outputs = {}
        for name, gamma, tree in configs[i % len(configs):] + configs[:i % len(configs)]:  # rotating start
            params = GenerationParams(max_new_tokens=args.max_new_tokens, gamma=max(gamma, 1), eos_ids=tok.eos_ids)
            out = generate(target.model, prompt, params, proposer_for(gamma, tree))
            m, s = out.metrics, sums[name]
            s[0] += m.new_tokens
            s[1] += m.seconds
            s[2] += m.seconds - (m.ttft or 0.0)
            s[3] += m.rounds
            s[4] += (m.c or 0.0) * m.rounds
            outputs[name] = out.token_ids
        for name in outputs:
            sums[name][5] += int(outputs[name] != outputs["plain"])
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx512_vnni", "avx512_bf16", "avx2", "amx")))
    print(f"machine: {os.cpu_count()} cores, {' '.join(flags)}; {len(prompts)} prompts ({args.categories}), greedy, "
          f"{args.max_new_tokens} new tokens; drafter {drafter}")
    print("| config | tok/s (whole request) | tok/s (decoding) | × plain (decoding) | τ tokens/forward | c | differ |")
    print("|---|---|---|---|---|---|---|")
    base = sums["plain"][0] / sums["plain"][2]
    for name, _, _ in configs:
        tokens, s, decode, rounds, c, differ = sums[name]
        print(f"| {name} | {tokens / s:.2f} | {tokens / decode:.2f} | {tokens / decode / base:.2f} | "
              f"{tokens / rounds:.2f} | {c / rounds:.3f} | {differ}/{len(prompts)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
