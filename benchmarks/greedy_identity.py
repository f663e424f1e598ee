"""Greedy speculative decoding against plain decoding on the real pair: are the outputs identical?

    python benchmarks/greedy_identity.py --dtype bfloat16 --categories code_completion,code_instruct,multi_turn,summarization --limit 2

For each suite prompt (through the chat template), plain greedy decoding once, then the default draft strategy
at each gamma; prints whether each output equals plain decoding's and where it first differs. bfloat16 is
exact by construction (tests/test_exact_forward.py); float32 and w8a8 are not (see the README).
"""

from __future__ import annotations

import argparse

from verispec.bench.suite import load_prompts
from verispec.defaults import default_draft_dtype
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.strategies import StrategyOptions, make_proposer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--categories", default="code_completion,code_instruct,multi_turn,summarization")
    ap.add_argument("--limit", type=int, default=2, help="prompts per category")
    ap.add_argument("--gammas", default="4,8")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    default_threads()
    target = load(DEFAULT_TARGET, dtype=args.dtype, progress=True)
    draft = load(DEFAULT_DRAFT, dtype=default_draft_dtype(args.dtype, "cpu"), progress=True)
    tok = target.tokenizer
    same = total = 0
    for p in load_prompts("suite", categories=args.categories.split(","), limit=args.limit):
        prompt = tok.chat(list(p.messages))
        params = GenerationParams(max_new_tokens=args.max_new_tokens, eos_ids=tuple(tok.eos_ids))
        plain = generate(target.model, prompt, params)
        for gamma in map(int, args.gammas.split(",")):
            params = GenerationParams(max_new_tokens=args.max_new_tokens, gamma=gamma, eos_ids=tuple(tok.eos_ids))
            proposer = make_proposer("draft", target, draft, len(prompt) + args.max_new_tokens + gamma + 2,
                                     StrategyOptions())
            spec = generate(target.model, prompt, params, proposer)
            first = next((i for i, (a, b) in enumerate(zip(spec.token_ids, plain.token_ids)) if a != b), None)
            ok = spec.token_ids == plain.token_ids
            same, total = same + ok, total + 1
            print(f"{p.id} gamma {gamma}: {'identical' if ok else f'differs from token {first}'} "
                  f"(alpha {spec.metrics.alpha:.2f}, {len(spec.token_ids)} tokens)", flush=True)
    print(f"{args.dtype}: {same}/{total} identical to plain decoding")
    return 0 if same == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
