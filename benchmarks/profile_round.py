"""Where a decoding round's time goes: draft, target forward, verification, the rest — per target precision.

    python benchmarks/profile_round.py --dtypes bfloat16,int8,int4 --strategies ar,draft,adaptive \
        --gamma 4 --max-new-tokens 128 --limit 2
    python benchmarks/profile_round.py --dtypes bfloat16 --draft-dtype int8,int4 --strategies ar,draft
    python benchmarks/profile_round.py --dtypes w4a8 --draft-vocab 65536 --strategies ar,auto,auto+curve \
        --verify-cost 1:1,2:1.42,3:1.68,5:2.12 --limit 1 --categories code_completion,...

Runs each (precision, strategy) on the suite's code prompts (greedy, or --temperature T), interleaved per prompt,
and prints one Markdown table: tokens/s, mean accepted length, and per round the ms spent drafting, in the
target's forward, verifying, and elsewhere (the loop itself). A strategy written NAME+curve runs NAME planning with the
--verify-cost curve instead of the one verispec.defaults gives this CPU (an A/B of that curve). Every precision's `ar` row is the baseline for its speedups: a
quantized target is a different model, and speculation is lossless relative to the target as run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from verispec.bench.suite import load_prompts
from verispec.defaults import default_draft_dtype
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--dtypes", default="bfloat16,int8,int4", help="target precisions, comma list")
    ap.add_argument("--draft-dtype", default="auto",
                    help="int8, w8a8, int4, bfloat16, ... or auto: verispec's default beside each target precision; "
                         "a comma list runs each drafting strategy with each draft precision, side by side")
    ap.add_argument("--draft-vocab", default="0",
                    help="keep the draft's first N LM-head rows (0: all); a comma list runs each drafting strategy "
                         "with each, side by side (its draft column then reads precision@N)")
    ap.add_argument("--strategies", default="ar,draft,adaptive",
                    help="comma list; NAME/N runs NAME with --draft-context N (the draft reads the prompt's first 4 "
                         "and last N tokens; N = 0: all of it); NAME~C with --draft-confidence C")
    ap.add_argument("--prompts", default="suite", help="suite, or a JSONL file of prompts (verispec bench's format)")
    ap.add_argument("--gamma", type=int, default=4, help="gamma of draft; adaptive gets twice this as its cap")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ngram-min", type=int, default=None, help="draft+ngram: shortest suffix match that uses the n-gram proposal (default: the strategy's)")
    ap.add_argument("--categories", default="code_completion,code_instruct")
    ap.add_argument("--verify-cost", default=None, metavar="K:COST,...",
                    help="the verification-cost curve (k tokens: cost in one-token forwards) of NAME+curve strategies")
    ap.add_argument("--limit", type=int, default=2, help="prompts per category")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else sampled, seed 0 + prompt")
    args = ap.parse_args()

    default_threads()
    dtypes, strategies = args.dtypes.split(","), args.strategies.split(",")
    targets = {d: load(args.target, dtype=d, progress=True) for d in dtypes}
    vocabs = [int(v) for v in args.draft_vocab.split(",")]
    draft_dtypes = {d: [dd + (f"@{v}" if v else "") for dd in (args.draft_dtype.split(",") if args.draft_dtype != "auto"
                                                                 else [default_draft_dtype(d, "cpu")]) for v in vocabs]
                    for d in dtypes}
    drafts = {}
    if any(s != "ar" for s in strategies):
        from verispec.models.quant import truncate_head

        for key in {dd for dds in draft_dtypes.values() for dd in dds}:
            dd, _, vocab = key.partition("@")
            drafts[key] = load(args.draft, dtype=dd, progress=True)
            if vocab:
                truncate_head(drafts[key].model, int(vocab))
    tok = next(iter(targets.values())).tokenizer
    categories = args.categories.split(",") if args.prompts == "suite" else None
    prompts = [tok.chat(list(p.messages)) for p in load_prompts(args.prompts, categories=categories,
                                                                   limit=args.limit)]
    # (target precision, draft precision or None, strategy)
    configs = [(d, None if s == "ar" else dd, s) for d in dtypes for s in strategies
               for dd in ([None] if s == "ar" else draft_dtypes[d])]
    rows: dict[tuple[str, str | None, str], list] = {c: [] for c in configs}

    import verispec.strategies
    from verispec.theory import interpolate_cost

    default_cost = verispec.strategies.verify_cost_of
    curve = interpolate_cost([(int(k), float(v)) for k, v in (p.split(":") for p in args.verify_cost.split(","))]) \
        if args.verify_cost else None

    def run(dtype: str, ddtype: str | None, strategy: str, prompt: list[int], max_new: int, seed: int = 0):
        target = targets[dtype]
        strategy, plus, _ = strategy.partition("+curve")
        strategy, _, confidence = strategy.partition("~")
        if plus and curve is None:
            raise SystemExit(f"{strategy}+curve needs --verify-cost")
        # the strategy is built here, so the curve it plans with is chosen per run
        verispec.strategies.verify_cost_of = (lambda model: curve) if plus else default_cost
        gamma = 2 * args.gamma if strategy == "adaptive" else args.gamma
        name, _, context = strategy.partition("/")
        proposer = make_proposer(name, target, drafts.get(ddtype), len(prompt) + max_new + gamma + 2,
                                 StrategyOptions(ngram_min=args.ngram_min,
                                                 draft_context=int(context) if context else None,
                                                 draft_confidence=float(confidence) if confidence else None))
        params = GenerationParams(max_new_tokens=max_new, gamma=gamma, eos_ids=tuple(tok.eos_ids),
                                  sampling=SamplingParams(temperature=args.temperature), seed=seed)
        return generate(target.model, prompt, params, proposer).metrics

    for c in configs:  # warm-up: first calls allocate
        run(*c, prompts[0], 8)
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        order = configs[i % len(configs):] + configs[: i % len(configs)]  # rotate the start, as bench does
        for c in order:
            m = run(*c, prompt, args.max_new_tokens, seed=i)
            rows[c].append(m)
            print(f"[{time.perf_counter() - t0:6.0f}s] prompt {i + 1}/{len(prompts)} {c[0]} {c[1] or ''} {c[2]}: "
                  f"{m.decode_tokens_per_s:.2f} tok/s, {m.profile()}", file=sys.stderr)

    sampled = "Greedy" if args.temperature == 0 else f"T = {args.temperature}"
    print(f"\n{sampled}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, draft vocab "
          f"{args.draft_vocab if args.draft_vocab != '0' else 'all'}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads. ms per round (mean over prompts).\n")
    print("| target | draft | strategy | decode tok/s | speedup vs own ar (geomean) | whole-request tok/s "
          "| whole-request vs own ar | mean acc. len | draft ms | target ms | verify ms | other ms | other share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d, dd, s in configs:
        ms = rows[(d, dd, s)]
        base = rows.get((d, None, "ar"))
        speed = whole = "–"
        if base:
            ratios = [m.decode_tokens_per_s / b.decode_tokens_per_s for m, b in zip(ms, base)]
            speed = f"{statistics.geometric_mean(ratios):.2f}×"
            whole = f"{statistics.geometric_mean([m.tokens_per_s / b.tokens_per_s for m, b in zip(ms, base)]):.2f}×"
        prof = {k: statistics.mean(m.profile()[k] for m in ms) for k in ("draft_ms", "target_ms", "verify_ms", "other_ms")}
        total = sum(prof.values())
        tps = statistics.mean(m.decode_tokens_per_s for m in ms)
        mal = statistics.mean(m.mean_accepted_length for m in ms)
        label = s + (f" γ≤{2 * args.gamma}" if s == "adaptive" else f" γ={args.gamma}" if s != "ar" else "")
        print(f"| {d} | {dd or '–'} | {label} | {tps:.2f} | {speed} | "
              f"{statistics.mean(m.tokens_per_s for m in ms):.2f} | {whole} | {mal:.2f} | {prof['draft_ms']:.1f} | {prof['target_ms']:.1f} "
              f"| {prof['verify_ms']:.2f} | {prof['other_ms']:.2f} | {100 * prof['other_ms'] / total:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
