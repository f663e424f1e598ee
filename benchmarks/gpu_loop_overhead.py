"""Where a speculative round's time goes on a GPU: target forward, draft forwards, and the loop around them.

Random weights of the real shapes (random:DIR, a config and tokenizer only) with synthetic acceptance, since
real weights cannot travel to a lent GPU machine. Each forward is timed in isolation (synchronised, median of
repeats); the loop's overhead is a round's wall time minus the target and draft forwards it ran.

    python benchmarks/gpu_loop_overhead.py --target random:DIR --draft random:DIR [--device cuda]
"""

from __future__ import annotations

import argparse
import time

import torch

from verispec.bench.stats import median
from verispec.engine import GenerationParams, generate
from verispec.models.load import load
from verispec.proposers.draft_model import DraftModelProposer
from verispec.proposers.synthetic import SyntheticProposer


def forward_ms(model, context: int, k: int, reps: int = 20) -> float:
    cache = model.new_cache(context + k + 1)
    model.forward(torch.randint(model.vocab_size, (1, context), device=model.device), cache, last_n=1)
    cache.commit(context)
    x = torch.randint(model.vocab_size, (1, k), device=model.device)
    times = []
    for _ in range(reps + 3):
        torch.cuda.synchronize() if model.device.type == "cuda" else None
        t0 = time.perf_counter()
        model.forward(x, cache, last_n=1 if k == 1 else None)
        torch.cuda.synchronize() if model.device.type == "cuda" else None
        times.append(time.perf_counter() - t0)
    return 1000 * median(times[3:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--error-rates", default="0.1,0.3")
    args = ap.parse_args()
    t = load(args.target, device=args.device)
    d = load(args.draft, device=args.device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(1000, 20000, (args.prompt_tokens,), generator=gen).tolist()
    params = GenerationParams(max_new_tokens=args.new_tokens, gamma=args.gamma)
    ctx = args.prompt_tokens + args.new_tokens // 2
    tgt1, tgtg, dr1 = forward_ms(t.model, ctx, 1), forward_ms(t.model, ctx, args.gamma + 1), forward_ms(d.model, ctx, 1)
    print(f"isolated forwards at context {ctx}: target 1 token {tgt1:.2f} ms, target {args.gamma + 1} tokens "
          f"{tgtg:.2f} ms, draft 1 token {dr1:.2f} ms (c = {dr1 / tgt1:.3f})")
    for _ in range(2):
        plain = generate(t.model, prompt, params)  # warm-up, then measured
    m = plain.metrics
    step = 1000 * (m.seconds - m.prefill_seconds) / m.rounds
    print(f"plain: {m.tokens_per_s:.1f} tok/s, {step:.2f} ms per step = forward {tgt1:.2f} + loop "
          f"{step - tgt1:.2f} ms ({(step - tgt1) / tgt1:.1%} of a forward)")
    for err in [float(e) for e in args.error_rates.split(",")]:
        rows = []
        for rep in range(3):
            proposer = SyntheticProposer(DraftModelProposer(d.model, 2 * ctx + 64, vocab_size=t.model.vocab_size),
                                         plain.token_ids, err, t.model.vocab_size, seed=rep, prompt_len=len(prompt))
            g = generate(t.model, prompt, params, proposer)
            if g.token_ids != plain.token_ids:  # random bf16 logits are near-flat: wider forwards flip ties
                print(f"  note: output left the reference at token "
                      f"{next(i for i, (a, b) in enumerate(zip(g.token_ids, plain.token_ids)) if a != b)}; "
                      f"acceptance below is lower than asked from there on")
            rows.append(g.metrics)
        m = rows[-1]
        round_ms = median([1000 * (x.seconds - x.prefill_seconds) / x.rounds for x in rows])
        drafts_per_round = m.draft_forwards / m.rounds
        busy = tgtg + drafts_per_round * dr1
        print(f"synthetic error {err}: alpha {m.alpha:.3f}, mean accepted length {m.mean_accepted_length:.2f}, "
              f"{median([x.tokens_per_s for x in rows]):.1f} tok/s ({plain.metrics.tokens_per_s:.1f} plain), "
              f"round {round_ms:.2f} ms = target {tgtg:.2f} + {drafts_per_round:.2f} drafts x {dr1:.2f} + loop "
              f"{round_ms - busy:.2f} ms ({(round_ms - busy) / tgtg:.1%} of a target forward)")


if __name__ == "__main__":
    main()
